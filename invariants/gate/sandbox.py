"""The parent's side of the worker: start it confined, call it under deadlines, kill it whole.

A Worker is one process running invariants.gate.worker on one submission. The parent never imports the
submission; it sends numpy arrays and rebuilds the answers (invariants.gate.wire), so a returned object
cannot carry a lying __eq__ and nothing the submission patches reaches the verdict.
"""

from __future__ import annotations

import builtins
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from invariants.gate import confine, frames, seccomp, wire
from invariants.gate.text import one_line, printable, quoted
from invariants.protocol import ImplementationError, OutputError, TransportLost

UID_BASE = 1_500_000_000  # + the gate's pid: a uid no account uses, one per gate process (RLIMIT_NPROC counts per uid)
SETUP_FAILED = 125  # invariants/gate/launch.py's exit status when it could not build the sandbox
HELLO_SECONDS = 60  # the worker's own start (python and numpy) before any submission code
_BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv[1]); import invariants.gate.worker as w; del sys.path[0]; w.main(sys.argv[2:])"


# What a call may raise that ends the worker's usefulness rather than shows a bug: sys.exit() and Ctrl-C (not Exceptions),
# and running out of the memory limit. The worker is stopped and the failure is marked lost, never a likely bug.
ENDS_THE_WORKER = (SystemExit, KeyboardInterrupt, MemoryError)


class WorkerLost(TransportLost):
    """The worker died, hung or ran past a deadline; the runner turns it into an Outcome with `lost` set to the cause."""

    OUT_OF_TIME = ("invariant_timeout", "run_timeout")  # a clock ran out, not the submission: a counterexample found still stands

    def __init__(self, cause, message):
        super().__init__(cause, message, out_of_time=cause in self.OUT_OF_TIME)  # or "call_timeout", "died", "protocol"


@dataclass(frozen=True)
class Limits:
    call_seconds: float = 10.0
    invariant_seconds: float = 60.0
    run_seconds: float = 600.0
    import_seconds: float = 60.0
    cpu_seconds: int = 600
    memory_mib: int = 4096
    file_size_mib: int = 64
    processes: int = 64
    scratch_mib: int = 256
    output_kib: int = 64
    shrink_examples: int = 100  # examples hypothesis may try after the first failure; a count, so reports stay deterministic
    answer_mib: int = 256
    max_worker_losses: int = 5

    def for_worker(self, device):
        return {
            "cpu_seconds": int(self.cpu_seconds),
            "memory_bytes": int(self.memory_mib) << 20,
            "memory_kind": "data" if device.startswith("cuda") else "address_space",
            "file_size_bytes": int(self.file_size_mib) << 20,
            "processes": int(self.processes),
        }


@dataclass
class Loaded:
    """What the worker said after importing the submission."""

    protections: dict
    functions: list
    backend: object
    problem: dict | None  # {"kind": ..., "message": ...} when the submission could not be loaded
    evidence: list
    declarations: dict  # {convention: value} as the submission declares them (validated by the parent)
    missing: list = field(default_factory=list)  # protections not in effect (names of rows in `protections`)


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _stand_in(error):
    """An exception of the type the worker reported (a builtin, or a subclass of one named like the original).

    Checks such as "gpt_logits raises ValueError on bad ids" look at ImplementationError.original;
    the submission's own exception object never leaves the worker.
    """
    bases = error.get("builtin_bases")
    name = error.get("type")
    if not isinstance(bases, list) or not isinstance(name, str):
        return None
    base = next((getattr(builtins, b) for b in bases if isinstance(b, str) and isinstance(getattr(builtins, b, None), type)
                 and issubclass(getattr(builtins, b), BaseException)), None)
    if base is None:
        return None
    cls = base if name == base.__name__ or not name.isidentifier() else type(name[:60], (base,), {})
    try:
        return cls(error["message"])
    except Exception:  # noqa: BLE001 - a builtin that wants other arguments (UnicodeError's subclasses)
        return None


def processes_of(uid):
    """The pids of the live (not zombie) processes whose real, effective, saved or file-system uid is `uid`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if uid in [int(u) for u in fields.get("Uid", "").split()] and not fields.get("State", "").strip().startswith(("Z", "X")):
            found.append(int(entry.name))
    return found


def keys_of(uid):
    """How many keys the kernel holds for `uid` (/proc/key-users; 0 where it lists none, or has no keys)."""
    try:
        lines = Path("/proc/key-users").read_text().splitlines()
    except OSError:
        return 0
    counts = {owner.strip(): rest.split() for owner, _, rest in (line.partition(":") for line in lines)}
    return int(counts[str(uid)][1].split("/")[0]) if str(uid) in counts else 0


def kill_uid(uid, seconds=5.0):
    """SIGKILL every process of `uid` by kill(-1) from a child switched to that uid, until /proc shows none, and empty the uid's
    user and user-session keyrings there (they outlive its processes); RuntimeError if a process stays."""
    if uid == 0:
        raise ValueError("kill_uid(0) would kill every process on the machine")
    keyed = keys_of(uid) > 0  # looking a uid's keyrings up makes them: only where it holds keys
    deadline = time.monotonic() + seconds
    while True:
        child = os.fork()
        if child == 0:  # only kill(-1) once this process is `uid` and nothing else: as root it would kill the machine
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                if os.getresuid() == (uid, uid, uid):
                    os.kill(-1, signal.SIGKILL)
                    for keyring in (seccomp.KEY_SPEC_USER_KEYRING, seccomp.KEY_SPEC_USER_SESSION_KEYRING) if keyed else ():
                        seccomp.keyctl(seccomp.KEYCTL_CLEAR, keyring)
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        left = processes_of(uid)
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(left)} process(es) of the worker's uid {uid} survived SIGKILL for {seconds:g} s: pids {left[:10]}")
        time.sleep(0.01)


def read_capture(parts, keep):
    """(size, head, tail) of the bytes of `parts` one after another (bytes, or files read in place): the whole as head (tail None) when
    it is at most 2 × keep bytes, else its first and last `keep` bytes; no more than that is ever read, however much a worker wrote."""
    sizes = [len(part) if isinstance(part, bytes) else part.stat().st_size for part in parts]
    size = sum(sizes)

    def between(start, stop):
        chunks, offset = [], 0
        for part, length in zip(parts, sizes, strict=True):
            lo, hi = max(start - offset, 0), min(stop - offset, length)
            if lo < hi:
                if isinstance(part, bytes):
                    chunks.append(part[lo:hi])
                else:
                    with open(part, "rb") as file:
                        file.seek(lo)
                        chunks.append(file.read(hi - lo))
            offset += length
        return b"".join(chunks)

    if size <= 2 * keep:
        return size, between(0, size), None
    return size, between(0, keep), between(size - keep, size)


class Worker:
    """One confined worker process for one submission; start() it, call() it, stop() it."""

    def __init__(self, *, scratch, layout, backend, device, dtype, limits, forbidden, functions, conventions=(),
                 drop_user=True, network_namespace=True, generation=1, tool=None, hidden=(), require=()):
        self.scratch = Path(scratch)
        self.layout = layout  # invariants.gate.submission.Layout
        self.backend, self.device, self.dtype = backend, device, dtype
        self.limits = limits
        self.forbidden = list(forbidden)
        self.functions = functions  # {name: [params]}
        self.conventions = list(conventions)  # the names of the declarable constants
        self.uid = UID_BASE + os.getpid() if drop_user and os.getuid() == 0 else None
        self.network_namespace = network_namespace
        self.generation = generation
        self.tool = tool or confine.Tool("none", "NOT CONFINED: no confinement was asked for")
        self.hidden = list(hidden)  # host paths the worker must not see (the assignment, the secret file, other submissions)
        self.require = list(require)  # protections without which the gate refuses to grade
        self.proc = None
        self.init_pid = None  # the host pid of the sandbox's pid 1 (bubblewrap's or invariants/gate/launch.py's)
        self.evidence = []
        self.used = {}  # {protocol function: forbidden APIs used during its calls}, from the worker's record
        self.view = None
        self.start_seconds = 0.0  # from starting the process to the worker's hello (the sandbox's start-up included)

    # -- life cycle ------------------------------------------------------------------------

    def _prepare_dirs(self):
        """The scratch folder's parts the worker uses, readable by its uid whatever the gate's umask; (the folder it starts in, runtime)."""
        work, capture, runtime = self.scratch / "work", self.scratch / "capture", self.scratch / "runtime"
        capture.mkdir(exist_ok=True)
        if not runtime.exists():  # the first start, before any submission code ran: nothing in the tree can be swapped yet
            confine.copy_runtime(runtime)
            for path in self._tree(self.layout.root):
                if not path.is_symlink():
                    os.chmod(path, 0o755 if path.is_dir() else 0o644)
        if self.tool.own_root:  # the worker's work folder is a tmpfs inside the sandbox: the host's scratch holds none of its files
            return self.scratch, runtime
        for folder in (work, work / "tmp"):  # its HOME and its TMPDIR: its own (0700), the only folders Landlock lets it write
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):  # the last worker put a file or a link there
                folder.unlink()
            folder.mkdir(exist_ok=True)
            os.chmod(folder, 0o700)
        if self.uid is not None:
            for path in [work, work / "tmp", *self._tree(self.layout.root)]:
                os.chown(path, self.uid, self.uid, follow_symlinks=False)
        return work, runtime

    @staticmethod
    def _tree(root):
        root = Path(root)
        yield root
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                yield Path(dirpath) / name

    def capture_paths(self):
        capture = self.scratch / "capture"
        return capture / f"stdout.{self.generation}.txt", capture / f"stderr.{self.generation}.txt"

    def _inside(self, work, runtime):
        """(work, submission, runtime) as the worker sees them."""
        if self.tool.own_root:
            return confine.WORK, confine.SUBMISSION, confine.RUNTIME
        return str(work), str(self.layout.root), str(runtime)

    def start(self):
        """Start the worker and load the submission; returns Loaded, or raises RuntimeError when the worker cannot start."""
        work, runtime = self._prepare_dirs()
        out_path, err_path = self.capture_paths()
        work_in, submission_in, runtime_in = self._inside(work, runtime)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work_in, "TMPDIR": "/tmp" if self.tool.own_root else f"{work_in}/tmp",
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        }
        if "CUDA_VISIBLE_DEVICES" in os.environ:
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        request_r, self.request_w = os.pipe2(os.O_CLOEXEC)
        self.answer_r, answer_w = os.pipe2(os.O_CLOEXEC)
        info_r, info_w = os.pipe2(os.O_CLOEXEC) if self.tool.own_root else (None, None)
        python = [sys.executable, "-s", "-P", "-B", "-c", _BOOTSTRAP, runtime_in, str(request_r), str(answer_w)]
        sandbox_rows, missing = {}, []
        if self.tool.confined:
            self.view = confine.View.for_worker(
                submission=self.layout.root, runtime=runtime, scratch_bytes=self.limits.scratch_mib << 20, hidden=self.hidden,
                network=self.network_namespace,
                devices=confine.cuda_devices() if self.device.startswith("cuda") else (), cuda=self.device.startswith("cuda"))
        sandbox_rows, missing = confine.describe(self.tool, self.view)
        command = (self.view.command(self.tool, python, scratch=self.scratch, drop_user=self.uid is not None, info_fd=info_w)
                   if self.tool.confined else python)
        started = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            self.proc = subprocess.Popen(
                command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                pass_fds=tuple(fd for fd in (request_r, answer_w, info_w) if fd is not None), start_new_session=True, close_fds=True,
            )
        for fd in (request_r, answer_w, info_w):
            if fd is not None:
                os.close(fd)
        os.set_blocking(self.request_w, False)
        os.set_blocking(self.answer_r, False)
        setup = {
            "workdir": work_in, "limits": self.limits.for_worker(self.device), "uid": self.uid,
            "network_namespace": self.network_namespace, "confined": self.tool.name if self.tool.own_root else None,
            "landlock": self.view.landlock_rules(write=[work, work / "tmp"]) if self.tool.name == "landlock" else None,
            "readable": [submission_in], "blocked": list(confine.BLOCKED_PACKAGES), "forbidden": self.forbidden, "functions": self.functions,
            "shipped": {name: f"{confine.SHIPPED_FOLDER}/{path}" for name, path in confine.SHIPPED_MODULES.items()},
            "conventions": self.conventions,
            "submission_root": submission_in, "entry": self.layout.entry, "package": self.layout.package,
            "module_name": self.layout.module_name, "backend": self.backend, "device": self.device, "dtype": self.dtype,
        }
        try:
            wire.send(self.request_w, {"op": "setup", "setup": setup}, deadline=time.monotonic() + HELLO_SECONDS)
            hello = self._receive(time.monotonic() + HELLO_SECONDS, "hello")[0]
        except wire.WireError as exc:  # before any submission code: the gate's own fault
            reason = (self._ended() if isinstance(exc, wire.PipeClosed) else f"no answer within {HELLO_SECONDS} s"
                      if isinstance(exc, wire.WireTimeout) else f"its hello broke the protocol ({exc})")
            self._read_info(info_r)
            self.stop()
            raise RuntimeError(f"the worker could not start: {reason}; its stderr: {self.tail(err_path)}") from None
        self.start_seconds = time.monotonic() - started
        self._read_info(info_r)
        protections = {**sandbox_rows, **hello["protections"]}
        missing += [m for m in hello["missing"] if m in protections]
        refused = [name for name in self.require if name in missing or name not in protections]
        if refused:
            self.stop()
            rows = "; ".join(f"{name}: {protections.get(name, 'unknown')}" for name in refused)
            return Loaded(protections, [], None, {"kind": "refused", "message": (
                f"refused to grade: the assignment requires {', '.join(refused)}, not in effect on this host ({rows}); "
                f"{confine.REMEDY}")}, [], {}, missing)
        wire.send(self.request_w, {"op": "load"}, deadline=time.monotonic() + HELLO_SECONDS)
        try:
            loaded, _ = self._receive(time.monotonic() + self.limits.import_seconds, "loaded")
        except wire.WireTimeout:
            self.stop()
            return Loaded(protections, [], None, {"kind": "import_timeout", "message":
                          f"importing the submission did not finish within {self.limits.import_seconds:g} s"}, [], {}, missing)
        except wire.WireError as exc:  # after the go-ahead, whatever reaches the pipe may be the submission's
            kind, reason = (("exit_at_import", self._ended()) if isinstance(exc, wire.PipeClosed) else
                            ("protocol", f"the worker's load report broke the gate's protocol: {printable(str(exc)[:300])}"))
            self.stop()
            return Loaded(protections, [], None, {"kind": kind, "message": f"while importing the submission, {reason}"}, [], {}, missing)
        evidence = self._evidence(loaded)
        functions = [n for n in loaded["functions"] if n in self.functions]
        problem = loaded["problem"]  # its kind is one of frames.LOAD_PROBLEMS: a "refused" is the parent's alone
        if problem is not None:
            problem = {"kind": problem["kind"], "message": printable(quoted(problem["message"]))}
        backend = one_line(loaded["backend"], 60) if loaded["backend"] is not None else None
        declarations = {k: v for k, v in loaded["declarations"].items() if k in self.conventions}
        if problem is not None:
            self.stop()
        return Loaded(protections, functions, backend, problem, evidence, declarations, missing)

    def _read_info(self, fd):
        """The sandbox's pid 1 (bubblewrap's --info-fd, or invariants/gate/launch.py's), so that stop() can wait for the whole namespace."""
        if fd is None:
            return
        try:
            if select.select([fd], [], [], 2)[0]:
                data = os.read(fd, 4096)
                pid = json.loads(data.decode() or "{}").get("child-pid")
                self.init_pid = pid if isinstance(pid, int) and pid > 1 else None
        except (OSError, ValueError, AttributeError):
            pass
        finally:
            os.close(fd)

    def stop(self):
        """Kill the worker's process group, its PID namespace and every process of its uid; RuntimeError if one of them is left."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.init_pid is not None:  # bubblewrap's pid 1 has its own session; when it dies, the kernel kills the namespace
            try:
                os.kill(self.init_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        self._wait_for_namespace()
        for fd in (self.request_w, self.answer_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.proc = None
        if self.uid is not None:  # children that left the group (setsid) and, unconfined, the namespace still run as its uid
            kill_uid(self.uid)

    def _wait_for_namespace(self, seconds=10.0):
        """The namespace's pid 1 exits only after the kernel has reaped every other process in it: wait for that."""
        if self.init_pid is None:
            return
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{self.init_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                break
            if state in ("Z", "X"):
                break
            time.sleep(0.01)
        self.init_pid = None

    def _ended(self):
        """Why the worker is gone, in words (waits a moment for it to finish dying)."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "the worker closed its answer pipe but kept running"
        if self.tool.own_root and code == SETUP_FAILED:
            return f"the sandbox could not be set up (exit status {code}; the captured stderr says why)"
        if self.tool.own_root and 128 < code <= 128 + 64:  # bubblewrap and invariants/gate/launch.py exit 128 + N for a signal N
            code = -(code - 128)
        if code == 0:
            return "the worker process exited with status 0 (os._exit() or an exit from native code): a submission must not exit"
        if code > 0:
            return f"the worker process exited with status {code}"
        name = _signal_name(-code)
        why = {
            "SIGSEGV": "crashed with a segmentation fault (SIGSEGV)",
            "SIGBUS": "crashed with a bus error (SIGBUS)",
            "SIGABRT": "aborted (SIGABRT)",
            "SIGXCPU": f"ran out of CPU time (the limit is {self.limits.cpu_seconds} s)",
            "SIGXFSZ": f"wrote more than the file size limit ({self.limits.file_size_mib} MiB): too much output?",
            "SIGKILL": "was killed (SIGKILL): out of memory, or killed from outside",
        }.get(name, f"was killed by {name}")
        return f"the worker process {why}"

    @staticmethod
    def tail(path, limit=2000):
        try:
            size, head, tail = read_capture([Path(path)], limit // 2)
        except OSError:
            return "(unreadable)"
        return (head + (tail or b"")).decode("utf-8", "replace").strip() or "(empty)"

    # -- calls ---------------------------------------------------------------------------------

    def _receive(self, deadline, op):
        """The worker's next frame, held to frames.FRAMES[op], and its buffers."""
        header = wire.receive_header(self.answer_r, deadline=deadline)
        frames.check(header, op)
        return header, wire.receive_buffers(self.answer_r, header, max_bytes=self.limits.answer_mib << 20, deadline=deadline)

    def _evidence(self, header):
        fresh = [{k: one_line(item[k]) for k in ("kind", "name", "where", "detail")} for item in header["evidence"][:200]]
        self.evidence.extend(fresh)
        return fresh

    def _lose(self, cause, message):
        self.stop()
        raise WorkerLost(cause, message)

    def call(self, name, args, deadline, cause, late):
        """The worker's answer to name(*args), decoded; ImplementationError/OutputError for its errors; WorkerLost otherwise.

        `deadline` (time.monotonic()) is the earliest of the call, invariant and run limits; `cause` names
        which, and `late` is the sentence for a worker that has not answered by then.
        """
        tree, buffers = wire.encode(list(args))
        try:
            wire.send(self.request_w, {"op": "call", "name": name, "args": tree}, buffers, deadline)
            header = wire.receive_header(self.answer_r, deadline=deadline)
            frames.check(header, "answer")
            wrong = frames.answer_problem(name, args, header) if header["ok"] else None  # from its declared dtypes and shapes
            read = wire.discard_buffers if wrong else wire.receive_buffers  # a wrong answer's bytes are never kept
            answer = read(self.answer_r, header, max_bytes=self.limits.answer_mib << 20, deadline=deadline)
        except wire.WireTimeout:
            self._lose(cause, late)
        except wire.PipeClosed:
            reason = self._ended()
            self._lose("died", reason)
        except wire.WireError as exc:
            self._lose("protocol", f"{name}'s answer broke the gate's protocol: {printable(str(exc)[:300])}")
        self._evidence(header)
        if header["used"]:  # forbidden APIs that ran during this call (the worker's record; evidence, not proof)
            self.used.setdefault(name, set()).update(one_line(u, 120) for u in header["used"][:50])
        if wrong:
            raise frames.WrongAnswer(wrong)
        if not header["ok"]:
            error = header["error"]
            message = printable(quoted(error["message"]))  # the submission's words: escaped
            if error["kind"] == "output":
                raise OutputError(message)
            original = _stand_in(error)
            if isinstance(original, ENDS_THE_WORKER):  # the call asked to exit, or ran out of memory: a crash, as os._exit is
                self._lose("died", message)
            raise ImplementationError(message, original=original)
        try:
            return wire.decode(header.get("value"), answer)
        except wire.WireError as exc:
            self._lose("protocol", f"{name}'s answer broke the wire format: {exc}")

"""The gate's worker: the only process that runs a submission's code.

    python -s -P -B -c "<bootstrap>" RUNTIME_DIR REQUEST_FD RESPONSE_FD   (invariants.gate.sandbox._BOOTSTRAP)

RUNTIME_DIR holds copies of this file, invariants/gate/wire.py, invariants/gate/seccomp.py, invariants/gate/landlock.py and
invariants/boundary.py and nothing else (invariants.gate.confine.copy_runtime); the bootstrap imports this module from there and takes the
folder off sys.path again. Under bubblewrap or the unshare fallback (invariants.gate.confine) the process
already runs in a root of its own, in its own PID, IPC, UTS and network namespaces, before this
module is imported. Its three jobs, one section each:

- confine: before any submission code, resource limits, an unprivileged uid, no new privileges, a
  session keyring of its own, under the landlock tool the paths it may open (invariants/gate/landlock.py), and
  the system-call allowlist of invariants/gate/seccomp.py (and, without bubblewrap or unshare, a new network
  namespace where one can be made); it says which took effect, then waits for the
  parent's go-ahead, which does not come when the assignment requires a protection that is missing;
- guard: hide the project's own packages and record imports of them and calls of forbidden
  APIs as evidence (with each answer, the forbidden APIs used during that call);
- serve: load the submission and answer the parent's calls (numpy arrays in and out over
  invariants.gate.wire), converting and calling through invariants/boundary.py, the same code an
  in-process run uses, until the parent says bye or closes the pipe.

The guard is not a wall against the submission, which runs in this process and can undo it;
the kernel's namespaces and limits are. The verdict is safe because the parent computes it
from the answers alone.
"""

from __future__ import annotations

import ctypes
import faulthandler
import fnmatch
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import resource
import stat
import sys
import traceback
from pathlib import Path

import numpy as np

from invariants.gate import landlock, seccomp, wire


def _load_boundary():
    """invariants/boundary.py, loaded on its own (the rest of the suite never enters the worker): the conversions both transports share."""
    path = Path(__file__).resolve().parent.parent.parent / "invariants" / "boundary.py"
    spec = importlib.util.spec_from_file_location("_gate_boundary", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


boundary = _load_boundary()

MAX_REQUEST_BYTES = 1 << 30
MAX_EVIDENCE = 200
CLONE_NEWNET = 0x40000000
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_CAP_VERSION_3 = 0x20080522
CAPABILITY_SETS = ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd")  # the /proc/self/status lines, all 0 once confined


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


# -- confinement (runs as the parent's user, before any submission code) ----------------------


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _errno_text():
    return os.strerror(ctypes.get_errno())


def _readable_by_others(path):
    """Can a user that owns nothing here read `path` (every directory above it searchable)?"""
    path = Path(path).resolve()
    try:
        if not path.stat().st_mode & stat.S_IROTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in [path, *path.parents] if parent.is_dir())
    except OSError:
        return False


def _confine(setup):
    """Apply the limits in setup; ({protection: what took effect, one line each}, [protections not in effect])."""
    limits = setup["limits"]
    done, missing = {}, []
    libc = _libc()
    if not setup.get("network_namespace", True):
        done["network"] = "ON: the assignment turned the network namespace off"
    elif setup.get("confined"):  # bubblewrap or invariants/gate/launch.py made the namespace before this interpreter started
        done["network"] = f"off: an empty network namespace ({setup['confined']})"
    else:
        ok = libc.unshare(CLONE_NEWNET) == 0
        done["network"] = "off: a new network namespace with no interfaces up" if ok else f"ON: unshare(CLONE_NEWNET) failed ({_errno_text()})"
    if done["network"].startswith("ON"):
        missing.append("network")
    rlimits = [
        ("cpu", resource.RLIMIT_CPU, limits["cpu_seconds"], limits["cpu_seconds"] + 5, "s of CPU time"),
        ("memory", resource.RLIMIT_AS, limits["memory_bytes"], limits["memory_bytes"], "bytes of address space"),
        ("file_size", resource.RLIMIT_FSIZE, limits["file_size_bytes"], limits["file_size_bytes"], "bytes per file written"),
        ("core_dumps", resource.RLIMIT_CORE, 0, 0, "bytes of core dump"),
    ]
    if limits.get("memory_kind") == "data":  # CUDA reserves far more address space than it uses
        rlimits[1] = ("memory", resource.RLIMIT_DATA, limits["memory_bytes"], limits["memory_bytes"], "bytes of data segment")
    for key, which, soft, hard, unit in rlimits:
        try:
            resource.setrlimit(which, (soft, hard))
            done[key] = f"{soft} {unit}"
        except (ValueError, OSError) as exc:
            done[key] = f"NOT SET ({exc})"
            missing.append(key)
    _drop_bounding_set(libc)  # first: it takes CAP_SETPCAP, which the uid switch clears
    done["user"], processes, switched = _drop_privileges(setup, libc, limits["processes"])
    if not switched:
        missing.append("user")
    done["capabilities"], held = _clear_capabilities(libc)
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
        enforced = os.getuid() != 0
        done["processes"] = f"{processes} processes and threads for its uid" + ("" if enforced else " (NOT ENFORCED: root ignores RLIMIT_NPROC)")
        if not enforced:
            missing.append("processes")
    except (ValueError, OSError) as exc:
        done["processes"] = f"NOT SET ({exc})"
        missing.append("processes")
    ok = libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    done["new_privileges"] = "blocked (no_new_privs: setuid programs gain nothing)" if ok else f"ALLOWED: prctl failed ({_errno_text()})"
    if not ok:
        missing.append("new_privileges")
    keys = _fresh_keyring()  # before the filter, which refuses keyctl
    if setup.get("landlock"):  # before the filter, which refuses Landlock's calls
        _restrict_paths(setup["landlock"], done, missing, switched, ok)
    filtered = _install_allowlist(setup) if ok else "NOT FILTERED: a seccomp filter needs no_new_privs"
    done["capabilities"] += f"; {keys}; system calls: {filtered}"
    if held or filtered.startswith("NOT"):
        missing.append("capabilities")
    elif "network" in missing and setup.get("network_namespace", True):  # no namespace, but the filter: no socket family but AF_UNIX
        done["network"] = ("off: no socket family but AF_UNIX, and no connect(2) (the seccomp allowlist); no network namespace "
                           f"({done['network'].removeprefix('ON: ')})")
        missing.remove("network")
    return done, missing


def _restrict_paths(rules, done, missing, switched, no_new_privs):
    """Landlock (invariants/gate/landlock.py) on the paths in `rules`; where it fails, the filesystem, tmp and pid rows say so."""
    why_not = landlock.restrict(**rules) if no_new_privs else "Landlock needs no_new_privs"
    if why_not:
        for row in ("filesystem", "tmp", "pid"):
            done[row] = f"NOT CONFINED: Landlock is not in effect ({why_not})"
        missing.extend(("filesystem", "tmp", "pid"))
    elif not switched and landlock.abi() < 6:  # the gate's own uid, and no Landlock scope for signals
        done["pid"] = "SHARED: no PID namespace, and it runs as the gate's uid: it can signal the gate's processes"
        missing.append("pid")


def _drop_privileges(setup, libc, processes):
    """Switch to setup['uid'] when running as root; (what happened, the RLIMIT_NPROC value to set, whether it switched)."""
    uid = setup.get("uid")
    if os.getuid() != 0:
        own = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == os.getuid())
        return (f"the gate's own user (not root, so no switch; RLIMIT_NPROC counts this user's {own} other processes too)",
                own + processes, False)
    if uid is None:
        return "ROOT: the assignment turned the user switch off", processes, False
    needed = [os.path.dirname(os.__file__), os.path.dirname(np.__file__), *setup["readable"]]
    unreadable = next((p for p in needed if not _readable_by_others(p)), None)  # confined, the view makes them all readable
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # every uid non-zero: the kernel empties the permitted, effective and ambient sets
    except OSError as exc:
        return f"ROOT: could not switch to an unprivileged uid ({exc})", processes, False
    if unreadable is not None:
        return (f"an unprivileged uid and gid of its own, with no supplementary groups; {unreadable} is not readable by other users, "
                "so imports from there fail (chmod -R o+rX it)"), processes, True
    return "an unprivileged uid and gid of its own, with no supplementary groups", processes, True


def _drop_bounding_set(libc):
    """Empty the bounding set (no exec can gain a capability again); without CAP_SETPCAP it stays, and the status line says so."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


def capability_sets():
    """{CapInh, CapPrm, CapEff, CapAmb, CapBnd: the hexadecimal mask} of this process, from /proc/self/status."""
    lines = Path("/proc/self/status").read_text().splitlines()
    return {name: value.strip() for name, _, value in (line.partition(":") for line in lines) if name in CAPABILITY_SETS}


def _clear_capabilities(libc):
    """Empty the inheritable, permitted, effective and ambient sets; (the row, whether any capability is still held)."""
    libc.capset(ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), (_CapData * 2)())
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    sets = capability_sets()
    held = {name: mask for name, mask in sets.items() if int(mask, 16) and name != "CapBnd"}
    if held:
        return "HELD: " + ", ".join(f"{name}={mask}" for name, mask in held.items()), True
    bounding = "" if not int(sets.get("CapBnd", "0"), 16) else f" (the bounding set keeps {sets['CapBnd']}: no CAP_SETPCAP to empty it)"
    return f"none: the inheritable, permitted, effective and ambient sets are empty{bounding or ', the bounding set too'}", False


def _fresh_keyring():
    """Join a new, empty session keyring of the worker's own (it inherits the gate's, which may hold a course's keys); what took effect."""
    result, error = seccomp.keyctl(seccomp.KEYCTL_JOIN_SESSION_KEYRING, None)
    if result < 0:
        return f"keys: the gate's session keyring, out of reach only through the filter (joining a new one failed: {os.strerror(error)})"
    return "keys: a new, empty session keyring of its own"


def _install_allowlist(setup):
    """The seccomp allowlist of invariants/gate/seccomp.py on every thread, the last step before the hello; what took effect."""
    machine = os.uname().machine
    program = seccomp.allowlist(machine, cuda=setup["device"].startswith("cuda"))
    if program is None:
        return f"NOT FILTERED: the gate has no system-call numbers for {machine}"
    why_not = seccomp.install(program)
    if why_not:
        return f"NOT FILTERED: {why_not}"
    return (f"an allowlist of {len(seccomp.allowed_numbers(machine))} (seccomp; any other call fails with ENOSYS, sockets are AF_UNIX "
            "only, clone takes no namespace flag; docs/gate.md lists them)")


def _owner(path):
    try:
        return path.stat().st_uid
    except OSError:
        return None


# -- the guard: evidence of forbidden imports and calls ----------------------------------------


class Guard(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: refuses the project's own packages (but for the shipped copies it may import) and shims forbidden APIs on import."""

    def __init__(self, blocked, forbidden, submission_root, shipped=None):
        self.blocked = set(blocked)
        runtime = Path(__file__).resolve().parent.parent.parent  # this file is RUNTIME/invariants/gate/worker.py
        self.shipped = {name: str(runtime / path) for name, path in (shipped or {}).items()}  # module name -> its copy's file
        self.forbidden = list(forbidden)  # "torch.nn.MultiheadAttention", "torch.nn.Transformer*", ...
        self.root = str(Path(submission_root).resolve())
        self.evidence = []
        self.used = set()  # forbidden APIs used since the last answer (each call's, even when its evidence is already recorded)
        self._sent = 0
        self._hooked = {pattern.split(".")[0] for pattern in self.forbidden}

    def install(self):
        for finder in list(sys.meta_path):  # the editable install's finder would hand out the project's packages
            if type(finder).__module__.startswith("__editable__"):
                sys.meta_path.remove(finder)
        for name in list(sys.modules):
            if name.split(".")[0] in self.blocked:
                del sys.modules[name]
        sys.meta_path.insert(0, self)
        for top in self._hooked & set(sys.modules):
            self.shim(sys.modules[top])

    def where(self):
        """'file.py:12' of the innermost frame inside the submission, or '?'."""
        for frame, line in traceback.walk_stack(None):  # innermost first
            name = frame.f_code.co_filename
            if name.startswith(self.root):
                return f"{os.path.relpath(name, self.root)}:{line}"
        return "?"

    def record(self, kind, name, detail):
        if kind == "forbidden_api":
            self.used.add(name)
        item = {"kind": kind, "name": name, "where": self.where(), "detail": detail}
        if item not in self.evidence and len(self.evidence) < MAX_EVIDENCE:
            self.evidence.append(item)

    def new_evidence(self):
        fresh, self._sent = self.evidence[self._sent :], len(self.evidence)
        return fresh

    def _own_module(self, top):
        return any(os.path.exists(os.path.join(entry, top + suffix)) for entry in sys.path if entry.startswith(self.root)
                   for suffix in (".py", "", ".pyc"))

    def _above_shipped(self, fullname):
        """The folder of the shipped copies' package `fullname` when it only holds shipped modules (a.b for a.b.c), or None."""
        for name, origin in self.shipped.items():
            if name.startswith(fullname + "."):
                levels = name.count(".") - fullname.count(".") + origin.endswith("__init__.py")  # a/b/c.py or a/b/c/__init__.py up to a/b
                return str(Path(origin).parents[levels - 1])
        return None

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if fullname in self.shipped and not self._own_module(top):  # the copy under RUNTIME, wherever else the project is installed
            origin = self.shipped[fullname]
            package = [os.path.dirname(origin)] if origin.endswith("__init__.py") else None
            return importlib.util.spec_from_file_location(fullname, origin, submodule_search_locations=package)
        above = None if fullname in self.shipped or self._own_module(top) else self._above_shipped(fullname)
        if above is not None:  # a package above a shipped module: a namespace of the shipped copies alone
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [above]
            return spec
        if top in self.blocked and not self._own_module(top):
            self.record("blocked_import", fullname, "import of the course's own code")
            allowed = sorted(name for name in self.shipped if name.split(".")[0] == top and not self._above_shipped(name))
            also = f" (of {top}, a submission may import {' and '.join(allowed)})" if allowed else ""
            raise ImportError(f"the gate does not let a submission import {fullname!r}: that is the course's own code{also}", name=fullname)
        if fullname in self._hooked:
            for finder in sys.meta_path[sys.meta_path.index(self) + 1 :]:
                spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _ShimmingLoader(spec.loader, self)
                    return spec
        return None

    def shim(self, module):
        """Wrap every attribute that a forbidden pattern names, under `module`, with a recorder."""
        for pattern in self.forbidden:
            owner_path, _, attr_glob = pattern.rpartition(".")
            owner = module
            for part in owner_path.split(".")[1:]:
                owner = getattr(owner, part, None)
            if owner is None:
                continue
            for attr in sorted(a for a in dir(owner) if fnmatch.fnmatchcase(a, attr_glob)):
                self._wrap(owner, attr, f"{owner_path}.{attr}")

    def _wrap(self, owner, attr, dotted):
        original = getattr(owner, attr)
        guard = self
        if inspect.isclass(original):
            init = original.__dict__.get("__init__")
            if init is None or getattr(init, "_gate_shim", False):
                return

            @functools.wraps(init)
            def recording_init(self, *args, **kwargs):
                if type(self) is original or not type(self).__module__.startswith("torch."):
                    guard.record("forbidden_api", dotted, "constructed")
                return init(self, *args, **kwargs)

            recording_init._gate_shim = True
            original.__init__ = recording_init
        elif callable(original) and not getattr(original, "_gate_shim", False):

            @functools.wraps(original)
            def recording(*args, **kwargs):
                guard.record("forbidden_api", dotted, "called")
                return original(*args, **kwargs)

            recording._gate_shim = True
            setattr(owner, attr, recording)


class _ShimmingLoader(importlib.abc.Loader):
    def __init__(self, loader, guard):
        self.loader, self.guard = loader, guard

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.guard.shim(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


# -- serving: loading the submission and answering calls ----------------------------------------


def load_submission(setup, guard):
    """(namespace, None) or (None, {"kind": ..., "message": ...}) for a submission that cannot be graded."""
    root = setup["submission_root"]
    entry = os.path.join(root, setup["entry"])
    sys.path.insert(0, os.path.dirname(entry) if not setup["package"] else os.path.dirname(os.path.dirname(entry)))
    name = setup["module_name"]
    spec = importlib.util.spec_from_file_location(name, entry, submodule_search_locations=[os.path.dirname(entry)] if setup["package"] else None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        where = f"{os.path.relpath(exc.filename, root) if exc.filename and exc.filename.startswith(root) else exc.filename}:{exc.lineno}"
        return None, {"kind": "syntax_error", "message": f"SyntaxError at {where}: {exc.msg}"}
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt at import are the submission's too
        kind = "exit_at_import" if isinstance(exc, SystemExit) else "import_error"
        return None, {"kind": kind, "message": f"importing the submission raised {boundary.describe_exception(exc, root)}"}
    namespace = getattr(module, "ADAPTER", module)
    if inspect.isclass(namespace):
        try:
            namespace = namespace()
        except BaseException as exc:  # noqa: BLE001
            return None, {"kind": "import_error", "message": f"ADAPTER() raised {boundary.describe_exception(exc, root)}"}
    return namespace, None


def _builtin_bases(exc):
    """The builtin exception classes exc is an instance of, most specific first (ValueError for a custom BadIds(ValueError))."""
    return [c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins" and issubclass(c, BaseException)]


def serve(fd_in, fd_out, namespace, setup, guard):
    """Answer calls until bye or EOF, converting and calling exactly as an in-process run does (invariants.boundary.answer)."""
    functions = {name: getattr(namespace, name) for name in setup["functions"] if callable(getattr(namespace, name, None))}
    backend = setup["backend"] or getattr(namespace, "BACKEND", "numpy")  # "any": the submission's own BACKEND
    backend = backend if backend in ("numpy", "torch") else "numpy"
    root = setup["submission_root"]
    while True:
        try:
            header, buffers = wire.receive(fd_in, max_bytes=MAX_REQUEST_BYTES)
        except wire.PipeClosed:
            return
        if header.get("op") != "call":
            return
        name = header["name"]
        reply, out_buffers = {"op": "answer", "ok": False}, []
        try:
            value = boundary.answer(functions[name], name, setup["functions"][name], wire.decode(header["args"], buffers),
                                    backend=backend, device=setup["device"], dtype=setup["dtype"], root=root)
            tree, out_buffers = wire.encode(value)
            reply = {"op": "answer", "ok": True, "value": tree}
        except boundary.CallError as exc:
            reply["error"] = {"kind": exc.kind, "message": exc.message, "type": type(exc.original).__name__,
                              "builtin_bases": _builtin_bases(exc.original)}
        except (boundary.OutputError, wire.WireError) as exc:
            reply["error"] = {"kind": "output", "message": boundary.first_line(exc)}
        except BaseException as exc:  # noqa: BLE001 - whatever else the submission's code raised on the way
            reply["error"] = {"kind": "output", "message": f"answering {name} raised {boundary.describe_exception(exc, root)}"}
        if not reply["ok"]:
            out_buffers = []
        reply["evidence"] = guard.new_evidence()
        reply["used"], guard.used = sorted(guard.used), set()
        sys.stdout.flush()
        sys.stderr.flush()
        wire.send(fd_out, reply, out_buffers)


def _declarations(namespace, names):
    """The declared conventions as the plain values the suite reads, anything else as a short description the parent refuses by name.

    One reading for both: invariants/boundary.py's declared_value (np.float64(1e-5) is 1e-05, np.int64(4) is 4).
    """
    return {name: boundary.declared_value(getattr(namespace, name)) for name in names if hasattr(namespace, name)}


def main(argv=None):
    """Confine, guard, serve: the worker's three jobs, in that order, before and around the submission's code."""
    argv = sys.argv[1:] if argv is None else argv
    fd_in, fd_out = int(argv[0]), int(argv[1])
    faulthandler.enable()  # a segfault prints the submission's stack to the captured stderr
    sys.dont_write_bytecode = True
    header, _ = wire.receive(fd_in, max_bytes=0)
    setup = header["setup"]
    os.chdir(setup["workdir"])

    protections, missing = _confine(setup)
    wire.send(fd_out, {"op": "hello", "protections": protections, "missing": missing, "uid": os.getuid()})
    go, _ = wire.receive(fd_in, max_bytes=0)  # the parent checks the protections before any submission code runs
    if go.get("op") != "load":
        os._exit(0)

    guard = Guard(setup["blocked"], setup["forbidden"], setup["submission_root"], setup.get("shipped"))
    guard.install()
    namespace, problem = load_submission(setup, guard)
    guard.used = set()  # what ran at import time is in the evidence, not charged to the first call
    present = [] if namespace is None else [n for n in setup["functions"] if callable(getattr(namespace, n, None))]
    backend = None if namespace is None else getattr(namespace, "BACKEND", None)
    declarations = {} if namespace is None else _declarations(namespace, setup.get("conventions", ()))
    sys.stdout.flush()
    sys.stderr.flush()
    wire.send(fd_out, {"op": "loaded", "ok": problem is None, "problem": problem, "functions": present, "declarations": declarations,
                       "backend": backend if isinstance(backend, str) else repr(backend) if backend is not None else None,
                       "evidence": guard.new_evidence()})

    if problem is None:
        serve(fd_in, fd_out, namespace, setup, guard)
    os._exit(0)  # skip interpreter teardown: nothing the submission registered (atexit, __del__) runs after the last answer


if __name__ == "__main__":
    main()

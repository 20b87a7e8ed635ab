"""Confinement from the kernel: what the worker can see of the machine, built before the worker's interpreter starts.

    tool = choose("auto")                  # Tool("bubblewrap" | "unshare" | "landlock" | "none", ...): probed once per process
    view = View.for_worker(submission=layout.root, runtime=runtime, scratch_bytes=256 << 20, hidden=[assignment, secret_file, ...])
    argv = view.command(tool, python_argv, ...)   # bwrap ... -- python ...  |  python invariants/gate/launch.py plan.json -- python ...

The worker gets a root of its own: the system's /usr and the interpreter with its libraries,
read-only; the submission, read-only, at /sandbox/submission; its scratch folder (a sized tmpfs) at
/sandbox/work; a private /tmp; a /proc of its own PID namespace (it cannot see the gate or any
other process); a minimal /dev; no network; no IPC or hostname shared with the host. None of
the project (its packages wherever they are installed, the editable-install finder, the
distribution's metadata), the assignment file, the course secret or the other submissions is
mounted: paths that fall inside a mounted tree are masked with an empty folder or file.

bubblewrap (Debian's `bubblewrap`, the sandbox Flatpak uses) builds it; as root without
bubblewrap, invariants/gate/launch.py builds the same view with unshare(2), mount(2) and pivot_root(2).
Where neither works (a container that forbids namespaces: Docker's, Gradescope's) the tool is
"landlock" where the kernel has Landlock: no root of its own, but the worker, switched to a uid of
its own, can open only an allowlist of the host's paths (invariants/gate/landlock.py: the same
trees read-only, the project's entries left out one by one, and a scratch and a TMPDIR folder of
its own, 0700), and sees no other process's /proc files. Without any of them the tool is "none":
the worker runs with the host's view, and the report says so.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX = "/sandbox"
WORK = f"{SANDBOX}/work"  # the worker's HOME and working directory: a tmpfs of [limits] scratch_mib, gone with the worker
SUBMISSION = f"{SANDBOX}/submission"  # the submission, read-only
RUNTIME = f"{SANDBOX}/runtime"  # the worker's own code (RUNTIME_FILES), read-only
TOOLS = ("bubblewrap", "unshare", "landlock", "none")
OWN_ROOT = ("bubblewrap", "unshare")  # the tools that build the worker a root of its own (namespaces); landlock holds it in the host's
TMP_BYTES = 256 << 20  # the private /tmp (a tmpfs: its pages are memory, so it is small)
SYSTEM_TREES = ("/usr",)
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # symlinks into /usr on merged-/usr systems
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
SWITCH_CAPABILITIES = ("CAP_SETUID", "CAP_SETGID")  # what root's worker needs to switch to its own uid
BOUNDING_CAPABILITY = "CAP_SETPCAP"  # what it needs to empty its bounding set; the worker drops all three before any submission code
BLOCKED_PACKAGES = ("reference", "invariants", "strategies", "conftest")  # the course's code: a submission may not import it
SHIPPED_MODULES = {  # the project's code a submission may import (its parents: namespaces of these alone)
    "invariants.adapters": "invariants/adapters/__init__.py",
    "invariants.adapters.toolkit": "invariants/adapters/toolkit.py",
}
SHIPPED_FOLDER = "lib"  # where under RUNTIME their copies lie
RUNTIME_FILES = (  # (the file in the project, its copy under RUNTIME)
    *((path, path) for path in ("invariants/gate/worker.py", "invariants/gate/wire.py", "invariants/gate/seccomp.py", "invariants/gate/landlock.py",
                                "invariants/boundary.py")),
    *((path, f"{SHIPPED_FOLDER}/{path}") for path in SHIPPED_MODULES.values()),
)
PROBE_SECONDS = 20
ENV = "INVARIANTS_GATE_TOOL"  # overrides the assignment's [sandbox] tool (tests, and hosts where a probe misleads)
REMEDY = ("install bubblewrap, run the gate as root where namespaces are allowed, or where Landlock is offered (Linux 5.13+, and a "
          "seccomp profile that allows its calls, as Docker's and podman's defaults do); or list in [sandbox] require only what this host "
          "gives (docs/gate.md, Without a sandbox tool)")


@dataclass(frozen=True)
class Tool:
    """The confinement this host offers: its name, its version or why a better one is missing."""

    name: str  # one of TOOLS
    detail: str  # "bubblewrap 0.8.0" or why there is no confinement
    program: str | None = None  # the bwrap executable
    abi: int = 0  # landlock: the kernel's Landlock ABI version

    @property
    def confined(self):
        return self.name != "none"

    @property
    def own_root(self):
        """Does the worker get a root of its own (its own mount, PID and network namespaces), rather than the host's behind Landlock?"""
        return self.name in OWN_ROOT


def _first_line(text):
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no message"


@functools.cache
def _bubblewrap():
    """(Tool or None, why not): bwrap found and able to build a sandbox here."""
    program = shutil.which("bwrap")
    if program is None:
        return None, "bubblewrap is not installed (apt-get install bubblewrap)"
    try:
        version = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=PROBE_SECONDS).stdout.strip()
        probe = subprocess.run([program, *_namespace_flags(network=True, drop_user=os.getuid() == 0), "--ro-bind", "/", "/", "--", "true"],
                               capture_output=True, text=True, timeout=PROBE_SECONDS)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"bubblewrap could not run ({exc})"
    if probe.returncode != 0:
        return None, f"bubblewrap cannot create namespaces here ({_first_line(probe.stderr)})"
    return Tool("bubblewrap", version or "bubblewrap", program), ""


@functools.cache
def _unshare():
    """(Tool or None, why not): root, and invariants/gate/launch.py able to build the view with unshare(2)."""
    if os.getuid() != 0:
        return None, "the gate does not run as root, so unshare(2) cannot build one either"
    launcher = Path(__file__).with_name("launch.py")
    try:
        probe = subprocess.run([sys.executable, "-I", "-B", str(launcher), "--probe"], capture_output=True, text=True, timeout=PROBE_SECONDS)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"unshare(2) could not run ({exc})"
    if probe.returncode != 0:
        return None, f"unshare(2) cannot create namespaces here ({_first_line(probe.stderr)})"
    return Tool("unshare", "unshare(2) as root (invariants/gate/launch.py: mount and PID namespaces, pivot_root)"), ""


@functools.cache
def _landlock():
    """(Tool or None, why not): the kernel offers Landlock to this process (a container's seccomp profile may refuse it)."""
    from invariants.gate import landlock

    version = landlock.abi()
    if version < 1:
        return None, f"Landlock: {landlock.why_missing()}"
    return Tool("landlock", f"Landlock ABI {version} (the kernel's allowlist of paths: no namespace can be made here)", abi=version), ""


def choose(setting="auto"):
    """The Tool to confine workers with: the setting ("auto" picks the best available), or $INVARIANTS_GATE_TOOL."""
    setting = os.environ.get(ENV) or setting
    if setting not in ("auto", *TOOLS):
        raise ValueError(f"{ENV}={setting!r} must be auto, {', '.join(TOOLS)}")
    if setting == "none":
        return Tool("none", "NOT CONFINED: the assignment (or $" + ENV + ") asks for no confinement")
    reasons = []
    if setting in ("auto", "bubblewrap"):
        tool, why = _bubblewrap()
        if tool:
            return tool
        reasons.append(why)
    if setting in ("auto", "unshare"):
        tool, why = _unshare()
        if tool:
            return tool
        reasons.append(why)
    if setting in ("auto", "landlock"):
        tool, why = _landlock()
        if tool:
            return tool
        reasons.append(why)
    return Tool("none", "NOT CONFINED: " + "; ".join(reasons))


# -- what the worker sees ----------------------------------------------------------------------


def _under(path, tree):
    path, tree = str(path), str(tree).rstrip("/") or "/"
    return tree == "/" or path == tree or path.startswith(tree + "/")


def _real(path):
    return os.path.realpath(path)


def _allowed_around(tree, hidden):
    """[tree], or where it holds a hidden path, its entries one by one (links left out) around the hidden ones: what Landlock may allow."""
    if tree in hidden:
        return []
    if not any(_under(path, tree) for path in hidden):
        return [tree]
    with os.scandir(tree) as entries:
        return [part for entry in sorted(entries, key=lambda e: e.name) if not entry.is_symlink() for part in _allowed_around(entry.path, hidden)]


@functools.cache
def _worker_sys_path():
    """sys.path of a fresh `python -s -P` (the worker's interpreter, before the worker touches it): .pth files' folders included."""
    try:
        done = subprocess.run([sys.executable, "-s", "-P", "-c", "import json, sys; print(json.dumps(sys.path))"], capture_output=True,
                              text=True, timeout=PROBE_SECONDS, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
        return [p for p in json.loads(done.stdout) if isinstance(p, str)]
    except (OSError, subprocess.SubprocessError, ValueError):
        return list(site.getsitepackages())


def _interpreter_trees():
    """The folders the worker's interpreter needs (read-only): its prefixes and every folder on its sys.path."""
    entries = [p if os.path.isdir(p) else os.path.dirname(p) for p in _worker_sys_path() if p]
    trees = [sys.base_prefix, sys.prefix, *site.getsitepackages(), *entries]
    paths = sysconfig.get_paths()
    trees += [paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"]]
    executable = sys.executable
    for _ in range(40):  # the executable and every link on the way to the real file
        trees.append(os.path.dirname(os.path.abspath(executable)))
        if not os.path.islink(executable):
            break
        executable = os.path.join(os.path.dirname(executable), os.readlink(executable))
    return [t for t in dict.fromkeys(trees) if t and os.path.isdir(t)]


def project_paths():
    """Every place the project's own code lives on this machine: its packages (wherever installed), root, finder, metadata."""
    found = set()
    root = Path(__file__).resolve().parent.parent.parent  # the checkout, unless invariants/gate/ is installed into a site-packages
    sites = {os.path.realpath(p) for p in [*site.getsitepackages(), *sysconfig.get_paths().values()]}
    if str(root) not in sites and root.name not in ("site-packages", "dist-packages"):
        found.add(root)
    for name in BLOCKED_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        found.update(Path(p).resolve() for p in (spec.submodule_search_locations or ()))
        if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
            found.add(Path(spec.origin).resolve())
    try:
        dist = importlib.metadata.distribution("transformer-invariants")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:  # every top-level entry the distribution installed: its packages, metadata, finder and .pth
        for file in dist.files or ():
            top = file.parts[0]
            if top not in ("..", "bin", "Scripts") and not top.endswith(".data"):
                found.add(Path(dist.locate_file(top)).resolve())
    for folder in site.getsitepackages():
        if os.path.isdir(folder):
            for entry in os.listdir(folder):
                if entry.startswith("__editable__") or entry.startswith("transformer_invariants"):
                    found.add(Path(folder) / entry)
    return sorted({str(p) for p in found if os.path.lexists(p)})


@dataclass
class View:
    """The worker's file system, as an ordered list of mounts (a plan both tools follow)."""

    mounts: list = field(default_factory=list)  # dicts: {"kind": ro|dev|symlink|tmpfs|mask|proc|devfs, ...}
    masked: list = field(default_factory=list)  # host paths hidden inside a mounted tree
    trees: list = field(default_factory=list)  # host trees mounted read-only (for the report)
    network: bool = True  # an empty network namespace
    scratch_bytes: int = 256 << 20  # the size of the tmpfs at WORK

    @classmethod
    def for_worker(cls, *, submission, runtime, scratch_bytes, hidden=(), devices=(), network=True, trees=None, project=None, cuda=False):
        view = cls(network=network, scratch_bytes=scratch_bytes)
        add = view.mounts.append
        if cuda and os.path.isdir("/sys"):  # the CUDA driver reads the PCI tree (untested here: no GPU on the development machine)
            add({"kind": "ro", "src": "/sys", "dst": "/sys"})
        add({"kind": "proc", "dst": "/proc"})
        add({"kind": "devfs", "dst": "/dev"})
        for device in devices:
            add({"kind": "dev", "src": device, "dst": device})
        add({"kind": "tmpfs", "dst": "/tmp", "size": TMP_BYTES, "mode": 0o1777})  # first: a tree the worker needs may lie in /tmp
        for link in SYSTEM_LINKS:
            if os.path.islink(link):
                add({"kind": "symlink", "target": os.readlink(link), "dst": link})
            elif os.path.isdir(link):
                add({"kind": "ro", "src": link, "dst": link})
        system = [t for t in SYSTEM_TREES if os.path.isdir(t)]
        for tree in system:
            add({"kind": "ro", "src": tree, "dst": tree})
        for path in ETC_FILES:
            if os.path.exists(path):
                add({"kind": "ro", "src": path, "dst": path})
        mounted = list(system) + [link for link in SYSTEM_LINKS if os.path.isdir(link) and not os.path.islink(link)]
        for tree in trees if trees is not None else _interpreter_trees():
            if not any(_under(_real(tree), _real(m)) for m in mounted):
                add({"kind": "ro", "src": tree, "dst": tree})
                mounted.append(tree)
        view.trees = mounted
        add({"kind": "ro", "src": str(runtime), "dst": RUNTIME})
        add({"kind": "ro", "src": str(submission), "dst": SUBMISSION})
        add({"kind": "tmpfs", "dst": WORK, "size": scratch_bytes, "mode": 0o777})  # a quota: nothing the worker writes reaches the host
        secret = sorted({os.path.abspath(p) for p in [*(project if project is not None else project_paths()), *hidden] if p})
        for path in secret:
            if not any(_under(path, done) for done in view.masked):  # a folder's mask hides what is inside it
                view._mask(path)
        return view

    def _mask(self, path):
        """Hide `path` wherever a mounted tree holds it (by its real path and by the path the tree is mounted at)."""
        if not os.path.lexists(path):
            return
        real = _real(path)
        for mount in list(self.mounts):
            if mount["kind"] != "ro":
                continue
            src, dst = _real(mount["src"]), mount["dst"]
            for candidate in {real, os.path.abspath(path)}:
                if _under(candidate, src):
                    inside = os.path.normpath(dst + candidate[len(src):]) if candidate != src else dst
                    entry = {"kind": "mask", "dst": inside, "file": not os.path.isdir(real)}
                    if entry not in self.mounts:
                        self.mounts.append(entry)
                        self.masked.append(path)

    def landlock_rules(self, *, write):
        """What Landlock allows the worker (invariants/gate/landlock.py): the view's read-only trees and files, each split around the paths
        masked in it (Landlock cannot hide a folder inside an allowed one), its devices, and the folders in `write`."""
        hidden = {_real(path) for path in self.masked}
        read = [part for m in self.mounts if m["kind"] == "ro" for part in _allowed_around(_real(m["src"]), hidden)]
        devices = [m["src"] for m in self.mounts if m["kind"] == "dev"]
        if any(m["kind"] == "devfs" for m in self.mounts):
            devices = [f"/dev/{name}" for name in DEVICES] + devices
        return {"read": list(dict.fromkeys(read)), "write": [str(path) for path in write], "devices": [d for d in devices if os.path.exists(d)]}

    # -- the tools ----------------------------------------------------------------------------

    def bwrap_args(self, program, *, drop_user, info_fd=None):
        args = [program, *_namespace_flags(network=self.network, drop_user=drop_user)]
        if info_fd is not None:
            args += ["--info-fd", str(info_fd)]
        made, mounted = set(), []
        for m in self.mounts:
            kind = m["kind"]
            parents = [str(q) for q in reversed(Path(m["dst"]).parents) if str(q) != "/"]
            for parent in parents:  # bubblewrap makes missing parents 0700: the worker's uid could not pass them
                if parent not in made and not any(_under(parent, t) for t in mounted):
                    args += ["--perms", "0755", "--dir", parent]
                    made.add(parent)
            if kind in ("ro", "proc", "devfs"):  # a host tree: its folders are there already
                mounted.append(m["dst"])
            elif kind == "tmpfs":  # empty: a tree mounted inside it (a virtualenv under /tmp) needs its parents made
                made.add(m["dst"])
            if kind == "symlink":
                args += ["--symlink", m["target"], m["dst"]]
            elif kind == "ro":
                args += ["--ro-bind", m["src"], m["dst"]]
            elif kind == "dev":
                args += ["--dev-bind-try", m["src"], m["dst"]]
            elif kind == "proc":
                args += ["--proc", m["dst"]]
            elif kind == "devfs":
                args += ["--dev", m["dst"]]
            elif kind == "tmpfs":
                args += ["--perms", f"{m['mode']:o}", "--size", str(m["size"]), "--tmpfs", m["dst"]]
            elif kind == "mask":
                args += ["--ro-bind", "/dev/null", m["dst"]] if m["file"] else ["--perms", "0555", "--size", "4096", "--tmpfs", m["dst"]]
        return [*args, "--chdir", WORK]

    def plan(self, *, root, keep_capabilities):
        """The JSON plan invariants/gate/launch.py follows (the unshare fallback)."""
        return {"root": str(root), "mounts": self.mounts, "network": self.network, "chdir": WORK,
                "devices": list(DEVICES), "keep_capabilities": list(keep_capabilities)}

    def command(self, tool, argv, *, scratch, drop_user, info_fd):
        """The argv that starts `argv` (the worker's python) inside this view, with `tool`."""
        if tool.name == "bubblewrap":
            return self.bwrap_args(tool.program, drop_user=drop_user, info_fd=info_fd) + ["--", *argv]
        if tool.name == "unshare":
            plan_path = Path(scratch) / "plan.json"
            root = Path(scratch) / "root"
            root.mkdir(exist_ok=True)
            plan_path.write_text(json.dumps(self.plan(root=root, keep_capabilities=kept_capabilities(drop_user))))
            launcher = Path(__file__).with_name("launch.py")
            return [sys.executable, "-I", "-B", str(launcher), str(plan_path), "-" if info_fd is None else str(info_fd), "--", *argv]
        return list(argv)


def _namespace_flags(*, network, drop_user):
    flags = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "gate",
             "--die-with-parent", "--new-session"]
    if network:
        flags.append("--unshare-net")
    if os.getuid() == 0:  # bwrap keeps every capability for root: keep only what the worker needs to drop the rest
        flags += ["--cap-drop", "ALL"]
        for cap in kept_capabilities(drop_user):
            flags += ["--cap-add", cap]
    else:  # an unprivileged bwrap runs in a user namespace of its own; nested ones are refused
        flags += ["--unshare-user", "--disable-userns"]
    return flags


def kept_capabilities(drop_user):
    """The capabilities root's worker starts with: CAP_SETPCAP, and CAP_SETUID and CAP_SETGID for the uid switch."""
    return (*SWITCH_CAPABILITIES, BOUNDING_CAPABILITY) if drop_user else (BOUNDING_CAPABILITY,)


def copy_runtime(target):
    """Copy the worker's own code (RUNTIME_FILES: worker.py, wire.py, seccomp.py, landlock.py, boundary.py, the SHIPPED_MODULES) into `target`."""
    root = Path(__file__).resolve().parent.parent.parent
    target = Path(target)
    for src, dst in RUNTIME_FILES:
        path = target / dst
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / src, path)
    folders = {parent for _, dst in RUNTIME_FILES for parent in Path(dst).parents if parent != Path(".")}
    for package in folders:  # the worker's: regular packages, so that RUNTIME (sys.path[0]) wins over an installed project
        if package.parts[0] != SHIPPED_FOLDER and not (target / package / "__init__.py").exists():
            (target / package / "__init__.py").write_text('"""The gate\'s worker code, copied into the sandbox on its own."""\n')
            os.chmod(target / package / "__init__.py", 0o644)
    for folder in {target} | {target / folder for folder in folders}:
        os.chmod(folder, 0o755)
    for _, dst in RUNTIME_FILES:
        os.chmod(target / dst, 0o644)
    return target


def cuda_devices():
    """The NVIDIA device files a CUDA worker needs, where they exist."""
    names = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
    names += sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))
    return [n for n in names if os.path.exists(n)]


def describe(tool, view):
    """The sandbox rows of the report's protections table: {protection: what took effect}, and the names not in effect."""
    if not tool.confined:
        rows = {
            "filesystem": f"{tool.detail}: the worker sees the host's file system with the gate's rights (see docs/gate.md)",
            "tmp": "SHARED: the host's /tmp (TMPDIR points into the scratch folder, but nothing forces its use); no quota on the scratch folder",
            "pid": "SHARED: the worker sees every process on the host in /proc, the gate's command line included",
        }
        return rows, ["filesystem", "tmp", "pid"]
    if tool.name == "landlock":
        left_out = f", {len(view.masked)} project, assignment or secret path(s) left out of them" if view.masked else ""
        signals = ("no signal leaves its Landlock domain (ABI 6 scope)" if tool.abi >= 6 else
                   "it can signal only its own uid's processes (kill of another uid fails with EPERM)")
        rows = {
            "filesystem": (f"{tool.detail}: NOT a root of its own: the host's file system, of which it can open only /usr and the "
                           f"interpreter's folders (read-only{left_out}), the submission and its own code (read-only), and its scratch and "
                           "TMPDIR folders; any other open fails with EACCES (it can still stat a path: names are not hidden)"),
            "tmp": ("a private TMPDIR and scratch folder (0700) on the host's disk, removed with the grading; /tmp itself is "
                    "out of its reach; no quota: [limits] file_size_mib bounds each file, not their sum"),
            "pid": (f"NO PID namespace: it shares the host's PIDs, but cannot list or read /proc (Landlock); {signals}; ptrace is refused "
                    "(seccomp); every process of its uid is killed when it stops"),
        }
        return rows, []
    masked = f"; {len(view.masked)} project, assignment or secret path(s) inside them masked" if view.masked else ""
    rows = {
        "filesystem": (f"{tool.detail}: a root of its own holding only /usr and the interpreter's folders (read-only), the submission "
                       f"(read-only) and its scratch folder; the project, the assignment and the course secret are not mounted{masked}"),
        "tmp": (f"a private /tmp ({TMP_BYTES >> 20} MiB tmpfs) and scratch folder ({view.scratch_bytes >> 20} MiB tmpfs at {WORK}), "
                "gone with the worker"),
        "pid": "its own PID namespace: /proc shows only the worker's processes, never the gate's",
    }
    return rows, []

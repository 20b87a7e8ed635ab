"""The unshare fallback: build the worker's view (invariants.gate.confine.View) with unshare(2), mount(2) and pivot_root(2), as root.

    python -I -B invariants/gate/launch.py PLAN.json INFO_FD -- python ... (the worker's command line; INFO_FD "-" for none)
    python -I -B invariants/gate/launch.py --probe          # exit 0 when this host lets root create the namespaces

Used where bubblewrap is not installed and the gate runs as root. Standard library only, run
by path before any submission code: the outer process creates new mount, PID, IPC, UTS and
network namespaces and forks the namespace's init (pid 1), which mounts a tmpfs root holding
only the plan's mounts, pivots into it, forks the worker (its bounding set cut to the plan's
capabilities), empties its own capability sets and reaps until the worker exits; the outer
process empties its own too, writes {"child-pid": init's pid} to INFO_FD (as bubblewrap's
--info-fd does) and exits with the worker's status (128 + N for a signal N, as bubblewrap does).
When pid 1 exits, the kernel kills every process left in the namespace.
"""

import ctypes
import json
import os
import platform
import signal
import sys
import traceback

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = (
    0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x20000000, 0x40000000)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 1, 24, 38, 47, 4
_CAP_VERSION_3 = 0x20080522
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
CAPABILITIES = {"CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8}
SETUP_FAILED = 125

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(result, what):
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _point(target, file=False):
    """An empty directory (or file) to mount on."""
    if file:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if not os.path.lexists(target):
            open(target, "w").close()
    else:
        os.makedirs(target, mode=0o755, exist_ok=True)


def _bind(src, target, *, readonly, devices=False):
    _point(target, file=not os.path.isdir(src))
    mount(src, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | (0 if devices else MS_NODEV) | (MS_RDONLY if readonly else 0)
    mount(None, target, None, flags)


def build_root(plan):
    """Mount the plan's view under plan['root'] and pivot into it; we are pid 1 of the new PID namespace."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    root = plan["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    inside = lambda path: os.path.join(root, path.lstrip("/"))  # noqa: E731
    for m in plan["mounts"]:
        kind, target = m["kind"], inside(m["dst"])
        if kind == "symlink":
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(m["target"], target)
        elif kind == "ro":
            _bind(m["src"], target, readonly=True)
        elif kind == "dev":
            if os.path.exists(m["src"]):
                _bind(m["src"], target, readonly=False, devices=True)
        elif kind == "proc":
            _point(target)
            mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif kind == "devfs":
            _point(target)
            mount("tmpfs", target, "tmpfs", MS_NOSUID, "mode=0755,size=64k")
            for name in plan["devices"]:
                if os.path.exists(f"/dev/{name}"):
                    _bind(f"/dev/{name}", os.path.join(target, name), readonly=False, devices=True)
            for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                               ("stderr", "/proc/self/fd/2")):
                os.symlink(link, os.path.join(target, name))
            os.mkdir(os.path.join(target, "shm"), 0o755)
        elif kind == "tmpfs":
            _point(target)
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={m['mode']:o},size={m['size']}")
        elif kind == "mask":
            if not os.path.lexists(target):
                continue  # inside a folder masked already
            if m["file"]:
                _bind("/dev/null", target, readonly=True)
            else:
                mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=0555,size=4k")
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is not None:
        _check(libc.syscall(number, b".", b"."), "pivot_root")
        _check(libc.umount2(b".", MNT_DETACH), "umount the old root")
    else:  # no pivot_root number for this machine: chroot (the worker drops CAP_SYS_CHROOT with the rest)
        os.chroot(".")
    os.chdir("/")


def drop_capabilities(keep, *, no_new_privs=True):
    """Drop every capability from the bounding set but `keep`: after exec, even root gets only those."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    kept = {CAPABILITIES[name] for name in keep}
    for cap in range(last + 1):
        if cap not in kept:
            _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    if no_new_privs:
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def drop_all_capabilities():
    """Empty every capability set of this process, the bounding set included (pid 1 and the outer process need none once the worker runs)."""
    drop_capabilities((), no_new_privs=False)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    _check(libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing the ambient capabilities")


def _status(status):
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def init(plan, argv, info_fd="-"):
    """pid 1 of the namespace: build the root, start the worker, reap until it exits."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if info_fd != "-":
        os.close(int(info_fd))  # the outer process writes it; the worker must not hold it
    build_root(plan)
    libc.sethostname(b"gate", 4)
    worker = os.fork()
    if worker == 0:
        try:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            drop_capabilities(plan["keep_capabilities"])
            os.chdir(plan["chdir"])
            os.execv(argv[0], argv)
        except BaseException:  # noqa: BLE001 - the reason goes to the captured stderr
            traceback.print_exc()
            os._exit(SETUP_FAILED)
    drop_all_capabilities()
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        if pid == worker:
            os._exit(_status(status))


def start(flags, child):
    if libc.unshare(flags) != 0:
        print(f"invariants/gate/launch.py: unshare failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        sys.exit(SETUP_FAILED)
    pid = os.fork()
    if pid == 0:
        try:
            child()
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        os._exit(SETUP_FAILED)
    return pid


def main(args):
    if args == ["--probe"]:  # the namespaces and a private mount, nothing else
        pid = start(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET,
                    lambda: (mount(None, "/", None, MS_REC | MS_PRIVATE), os._exit(0)))
        sys.exit(_status(os.waitpid(pid, 0)[1]))
    os.umask(0o022)  # the mount points it makes must be searchable by the worker's uid, whatever the gate's umask
    plan_path, info_fd, separator, *argv = args
    if separator != "--" or not argv:
        sys.exit("usage: launch.py PLAN.json INFO_FD -- COMMAND ...")
    with open(plan_path) as f:
        plan = json.load(f)
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP | (CLONE_NEWNET if plan["network"] else 0)
    pid = start(flags, lambda: init(plan, argv, info_fd))
    drop_all_capabilities()
    if info_fd != "-":
        with os.fdopen(int(info_fd), "w") as info:
            info.write(json.dumps({"child-pid": pid}))
    sys.exit(_status(os.waitpid(pid, 0)[1]))


if __name__ == "__main__":
    main(sys.argv[1:])

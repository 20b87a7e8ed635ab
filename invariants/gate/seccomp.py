"""The worker's system calls: a seccomp-BPF allowlist; and the keyring calls the gate makes so that no key is shared with a worker.

    program = seccomp.allowlist(os.uname().machine, cuda=False)  # [(code, jt, jf, k), ...]; None for a machine without numbers here
    seccomp.install(program)                                     # on every thread of this process (SECCOMP_FILTER_FLAG_TSYNC)
    seccomp.keyctl(seccomp.KEYCTL_JOIN_SESSION_KEYRING, None)    # keyctl(2) through syscall(2), before the filter refuses it

Standard library only: the worker imports it inside the sandbox (a copy under /sandbox/runtime,
invariants.gate.confine.RUNTIME_FILES) and installs the filter before any submission code.
Under it a call in ALLOWED runs, and any other fails with ENOSYS, what a kernel without that
call answers, so that libraries fall back to an older call where they have one (glibc's
pthread_create tries clone3, then clone). Three listed calls are decided by an argument, each
refusal with the errno a kernel without that feature gives: socket and socketpair for any family
but AF_UNIX (EAFNOSUPPORT: no AF_VSOCK, AF_NETLINK, AF_INET, ...), clone with a namespace flag
(EPERM), ioctl with a request not in IOCTL_REQUESTS (ENOTTY; a CUDA worker keeps every request,
the NVIDIA driver's interface). Calls of another ABI (i386's int 0x80, x86_64's x32 numbers)
fail with ENOSYS. So unshare, setns, mount, keyctl, add_key, request_key, io_uring_setup,
userfaultfd, bpf, perf_event_open, ptrace, process_vm_readv, open_by_handle_at, SysV IPC, prctl,
clone3 and every call a later kernel adds are refused: they are not on the list. The kernel lets
two calls past every filter (UNFILTERABLE: uretprobe and uprobe, which kill their caller with
SIGILL unless a probe's trampoline made them).

How the list was measured (issue 34): `strace -f -ff -ttt --decode-pids=pidns` of whole gradings
under bubblewrap and the unshare fallback (glibc 2.36, Python 3.11, numpy, torch 2.13 CPU),
keeping the calls that the worker, its threads and its children made after the filter went on:
examples/submissions/good_student and tests/fixtures/honest/second_student.py on p01; the
reference (reference/numpy.py and reference/torch.py as a package submission) on p01, lesson and
llama; and tests/fixtures/seccomp/ordinary.py, honest code that uses threads, a thread pool,
torch's own threads, files in the scratch folder and /tmp (rename, copy, truncate, mmap, locks,
sqlite, numpy.save and memmap), clocks, timers, signals, randomness, subprocesses, select, poll
and epoll, and a Unix socket pair. Each entry is a call seen there (only clone3 was refused),
the aarch64 name of one (aarch64 has no open, mkdir, dup2, poll, ...), or the form an older glibc
uses for one (stat, lstat, fstat). tests/test_gate_seccomp.py grades a survey that calls every
other number and socket family from inside the worker, and the ordinary code under each tool.
"""

from __future__ import annotations

import ctypes
import errno
import os

ARCHES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # os.uname().machine -> AUDIT_ARCH_* (seccomp_data.arch)
ALLOWED = {  # name: (x86_64 number, aarch64 number or None where the call does not exist there, why the worker needs it)
    "read": (0, 63, "files and pipes: the wire protocol's frames, imports, the submission's own files"),
    "readv": (19, 65, "the wire protocol reads a frame's buffers in one call"),
    "write": (1, 64, "files and pipes: answers to the parent, the captured stdout and stderr, the scratch folder"),
    "pread64": (17, 67, "reads at an offset (sqlite, zip archives)"),
    "pwrite64": (18, 68, "writes at an offset (sqlite)"),
    "lseek": (8, 62, "file offsets (Python's buffered files)"),
    "close": (3, 57, "every descriptor it opens"),
    "close_range": (436, 436, "subprocess closes the descriptors its child must not inherit"),
    "open": (2, None, "opening a file in its view (x86_64's older form, which some libraries use)"),
    "openat": (257, 56, "opening a file in its view: imports, data, the scratch folder"),
    "stat": (4, None, "stat() (x86_64's older form: glibc before 2.33)"),
    "lstat": (6, None, "lstat() (x86_64's older form: glibc before 2.33)"),
    "fstat": (5, 80, "stat() of an open descriptor (glibc before 2.33)"),
    "newfstatat": (262, 79, "stat(): the import system looks for modules with it"),
    "access": (21, None, "os.access, shutil.which (x86_64's older form)"),
    "faccessat": (269, 48, "os.access, shutil.which"),
    "readlink": (89, None, "os.readlink, os.path.realpath (x86_64's older form)"),
    "readlinkat": (267, 78, "os.readlink, os.path.realpath"),
    "getdents64": (217, 61, "listing a folder: imports, os.listdir, glob"),
    "getcwd": (79, 17, "os.getcwd"),
    "chdir": (80, 49, "os.chdir inside its view"),
    "mkdir": (83, None, "os.mkdir, tempfile.mkdtemp (x86_64's older form)"),
    "mkdirat": (258, 34, "os.mkdir, tempfile.mkdtemp"),
    "rename": (82, None, "os.rename, os.replace (x86_64's older form)"),
    "renameat": (264, 38, "os.rename, os.replace"),
    "renameat2": (316, 276, "os.rename, os.replace (glibc's choice where renameat is missing)"),
    "unlink": (87, None, "os.remove (x86_64's older form)"),
    "unlinkat": (263, 35, "os.remove, shutil.rmtree"),
    "rmdir": (84, None, "os.rmdir, shutil.rmtree (x86_64's older form)"),
    "symlink": (88, None, "os.symlink (x86_64's older form)"),
    "symlinkat": (266, 36, "os.symlink"),
    "chmod": (90, None, "os.chmod (x86_64's older form)"),
    "fchmodat": (268, 53, "os.chmod"),
    "utimensat": (280, 88, "os.utime"),
    "truncate": (76, 45, "os.truncate"),
    "ftruncate": (77, 46, "file.truncate"),
    "fsync": (74, 82, "os.fsync, sqlite"),
    "fdatasync": (75, 83, "sqlite"),
    "fcntl": (72, 25, "descriptor flags, duplicates and record locks (os.dup, os.set_blocking, sqlite, fcntl.lockf)"),
    "flock": (73, 32, "fcntl.flock"),
    "sendfile": (40, 71, "shutil.copyfile's fast copy"),
    "dup2": (33, None, "os.dup2, subprocess (x86_64's older form)"),
    "dup3": (292, 24, "os.dup2, subprocess"),
    "pipe2": (293, 59, "os.pipe, subprocess"),
    "mmap": (9, 222, "memory: the allocator, numpy and torch buffers, shared libraries, mmap.mmap and numpy.memmap"),
    "munmap": (11, 215, "memory given back"),
    "mprotect": (10, 226, "shared libraries' relocations, thread stacks' guard pages"),
    "mremap": (25, 216, "growing a large allocation (glibc's realloc)"),
    "madvise": (28, 233, "memory given back by the allocators (MADV_DONTNEED)"),
    "brk": (12, 214, "the heap (glibc's malloc)"),
    "msync": (26, 227, "mmap.flush, numpy.memmap.flush"),
    "mbind": (237, 235, "numpy's allocator asks for huge pages"),
    "futex": (202, 98, "locks and condition variables: the GIL, threads, thread pools"),
    "set_robust_list": (273, 99, "each new thread and program (glibc)"),
    "rseq": (334, 293, "each new thread and program (glibc)"),
    "set_tid_address": (218, 96, "each new program (glibc)"),
    "arch_prctl": (158, None, "each new program's thread-local storage (x86_64 only)"),
    "clone": (56, 220, "threads (glibc falls back to it from clone3) and os.fork, without a namespace flag (those fail with EPERM)"),
    "vfork": (58, None, "subprocess (x86_64's older form; aarch64 uses clone)"),
    "execve": (59, 221, "subprocess runs a program from its view; the filter, the limits and no_new_privs carry over"),
    "wait4": (61, 260, "waiting for its own children (subprocess, os.wait)"),
    "exit": (60, 93, "a thread ends"),
    "exit_group": (231, 94, "the process ends"),
    "gettid": (186, 178, "threads' ids (glibc, logging)"),
    "getpid": (39, 172, "os.getpid"),
    "getppid": (110, 173, "os.getppid"),
    "getuid": (102, 174, "os.getuid"),
    "geteuid": (107, 175, "os.geteuid"),
    "getgid": (104, 176, "os.getgid"),
    "getgroups": (115, 158, "os.getgroups"),
    "getsid": (124, 156, "os.getsid"),
    "setsid": (112, 157, "subprocess's start_new_session (the PID namespace and the uid's cleanup still reach it)"),
    "setpgid": (109, 154, "subprocess's process_group (the PID namespace and the uid's cleanup still reach it)"),
    "kill": (62, 129, "signals to its own processes; the PID namespace holds nothing else"),
    "tgkill": (234, 131, "raise() and abort(): a crash ends with its own signal, which the report names"),
    "sched_getaffinity": (204, 123, "os.sched_getaffinity, the thread pools' size (torch, OpenMP)"),
    "sched_setaffinity": (203, 122, "torch's thread pool pins its threads"),
    "prlimit64": (302, 261, "resource.getrlimit (torch reads its limits at import)"),
    "getrusage": (98, 165, "resource.getrusage"),
    "times": (100, 153, "os.times"),
    "uname": (63, 160, "platform, os.uname, socket.gethostname"),
    "sysinfo": (99, 179, "the machine's memory (glibc, torch)"),
    "rt_sigaction": (13, 134, "signal handlers (Python, faulthandler, the signal module)"),
    "rt_sigprocmask": (14, 135, "signal masks (threads, subprocess, signal.pthread_sigmask)"),
    "rt_sigreturn": (15, 139, "the return from every signal handler"),
    "alarm": (37, None, "signal.alarm (x86_64's older form)"),
    "setitimer": (38, 103, "signal.setitimer, signal.alarm"),
    "clock_gettime": (228, 113, "clocks the vDSO does not serve (time.process_time, time.thread_time)"),
    "clock_nanosleep": (230, 115, "time.sleep"),
    "poll": (7, None, "select.poll, subprocess (x86_64's older form)"),
    "ppoll": (271, 73, "select.poll, subprocess"),
    "pselect6": (270, 72, "select.select"),
    "epoll_create1": (291, 20, "select.epoll; torch makes one at import"),
    "epoll_ctl": (233, 21, "select.epoll"),
    "epoll_wait": (232, None, "select.epoll (x86_64's older form)"),
    "epoll_pwait": (281, 22, "select.epoll"),
    "socket": (41, 198, "AF_UNIX only (any other family fails with EAFNOSUPPORT): socket.socket(AF_UNIX)"),
    "socketpair": (53, 199, "AF_UNIX only (any other family fails with EAFNOSUPPORT): socket.socketpair"),
    "bind": (49, 200, "binding its own Unix socket"),
    "getsockname": (51, 204, "socket.getsockname"),
    "sendto": (44, 206, "socket.send on a Unix socket"),
    "recvfrom": (45, 207, "socket.recv on a Unix socket"),
    "getrandom": (318, 278, "os.urandom, secrets, hash seeds, numpy.random.default_rng"),
    "ioctl": (16, 29, "the IOCTL_REQUESTS only (isatty, os.set_blocking, os.set_inheritable); any other fails with ENOTTY, but for CUDA"),
}
UNFILTERABLE = {"x86_64": {335: "uretprobe", 336: "uprobe"}, "aarch64": {}}  # past every filter (Linux 6.12, 6.16): SIGILL unless in a probe
GATE_CALLS = {"seccomp": (317, 277), "keyctl": (250, 219)}  # what the gate itself calls through syscall(2); never on the list
IOCTL_REQUESTS = {  # the ioctl requests of CPython and its libraries on a pipe, file or socket: isatty, terminal size, bytes waiting, ...
    "TCGETS": 0x5401, "TIOCGWINSZ": 0x5413, "FIONREAD": 0x541B, "FIONBIO": 0x5421, "FIONCLEX": 0x5450, "FIOCLEX": 0x5451}
AF_UNIX = 1
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
X32_SYSCALL_BIT = 0x40000000
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR = 1, 7
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_LOAD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, ...|BPF_JGE, ...|BPF_JSET, BPF_RET|BPF_K
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data
_ARG_LOW = (16, 24)  # the low 32 bits of args[0] and args[1] (little-endian); every filtered argument is an int the kernel reads as 32 bits
_ALLOW = (_RET, 0, 0, 0x7FFF0000)  # SECCOMP_RET_ALLOW


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def _refuse(code):
    return (_RET, 0, 0, 0x00050000 | code)  # SECCOMP_RET_ERRNO


def _one_of(offset, values, refusal):
    """Allow the call when the 32-bit argument word at `offset` is one of `values`; otherwise fail with `refusal`."""
    block = [(_LOAD, 0, 0, offset)]
    for value in values:
        block += [(_JEQ, 0, 1, value), _ALLOW]
    return [*block, _refuse(refusal)]


def _argument_rules(cuda):
    """{call: the instructions that decide it from its arguments}, for the listed calls some of whose uses are refused."""
    rules = {
        "socket": _one_of(_ARG_LOW[0], [AF_UNIX], errno.EAFNOSUPPORT),
        "socketpair": _one_of(_ARG_LOW[0], [AF_UNIX], errno.EAFNOSUPPORT),
        "clone": [(_LOAD, 0, 0, _ARG_LOW[0]), (_JSET, 0, 1, NAMESPACE_FLAGS), _refuse(errno.EPERM), _ALLOW],
    }
    if not cuda:
        rules["ioctl"] = _one_of(_ARG_LOW[1], IOCTL_REQUESTS.values(), errno.ENOTTY)
    return rules


def allowed_numbers(machine):
    """{number: name} of the calls on the list for `machine` (its argument-filtered calls included)."""
    column = list(ARCHES).index(machine)
    return {entry[column]: name for name, entry in ALLOWED.items() if entry[column] is not None}


def allowlist(machine, *, cuda=False):
    """The filter program for `machine`, a list of (code, jt, jf, k); None for a machine the gate has no numbers for."""
    if machine not in ARCHES:
        return None
    rules = _argument_rules(cuda)
    program = [(_LOAD, 0, 0, _ARCH), (_JEQ, 1, 0, ARCHES[machine]), _refuse(errno.ENOSYS), (_LOAD, 0, 0, _NR)]
    if machine == "x86_64":
        program += [(_JGE, 0, 1, X32_SYSCALL_BIT), _refuse(errno.ENOSYS)]
    for number, name in sorted(allowed_numbers(machine).items()):
        block = rules.get(name, [_ALLOW])
        program += [(_JEQ, 0, len(block), number), *block]
    return [*program, _refuse(errno.ENOSYS)]


def _syscall(name, *args):
    """(the result of the gate's system call `name` with `args` on this machine, its errno); ENOSYS on a machine the gate has no numbers for."""
    machine = os.uname().machine
    if machine not in ARCHES:
        return -1, errno.ENOSYS
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(ctypes.c_long(GATE_CALLS[name][list(ARCHES).index(machine)]), *args)
    return result, ctypes.get_errno()


def install(program):
    """Put `program` on every thread of this process (SECCOMP_FILTER_FLAG_TSYNC); None, or why it is not in effect."""
    instructions = (_Instruction * len(program))(*(_Instruction(*op) for op in program))
    result, error = _syscall("seccomp", ctypes.c_uint(SECCOMP_SET_MODE_FILTER), ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC),
                             ctypes.byref(_Program(len(program), instructions)))
    if result > 0:
        return f"thread {result} could not take the filter"
    return None if result == 0 else f"seccomp() failed ({os.strerror(error)})"


def keyctl(operation, *args):
    """keyctl(2) with integer arguments (None for NULL); (result, errno)."""
    return _syscall("keyctl", ctypes.c_long(operation), *(ctypes.c_void_p(None) if a is None else ctypes.c_long(a) for a in args))

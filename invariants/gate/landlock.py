"""The worker's file system where no namespace can be made (a container): Landlock, the kernel's allowlist of paths.

    version = landlock.abi()                                    # 0 where the kernel has no Landlock (or a filter refuses it)
    why_not = landlock.restrict(read=[...], write=[...], devices=[...])   # None once this process and its children are held

Standard library only: the worker imports it inside its runtime folder (a copy, invariants.gate.confine.RUNTIME_FILES)
and restricts itself after no_new_privs and before the seccomp allowlist, which refuses the three Landlock calls.
Once restricted, the process and every child it starts can open only what lies beneath the paths given: `read`
(read and execute; folders listed), `write` (every right Landlock handles: create, remove, rename, truncate), `devices`
(files read and written, ioctl). Anything else fails with EACCES, whatever its mode bits say. Landlock cannot mask a
folder inside an allowed tree: the caller allows the tree's entries one by one around what must stay unread
(invariants.gate.confine.View.landlock_rules). Where the kernel's ABI has them (6 and later), the process can neither
signal a process outside its domain nor reach an abstract Unix socket bound outside it; from ABI 4, binding or
connecting a TCP socket is refused too (the seccomp allowlist already refuses every socket family but AF_UNIX).
Path walks, stat() and the names in a folder's path are not what Landlock restricts: the worker can learn that a path exists.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

CALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # landlock_create_ruleset, landlock_add_rule, landlock_restrict_self
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3 and 5
ALL_FS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}  # every right each ABI handles
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the rights a rule on a file (not a folder) may carry
TCP_BIND_AND_CONNECT = (1 << 0) | (1 << 1)  # handled_access_net, ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # scoped, ABI 6
READ = EXECUTE | READ_FILE | READ_DIR
DEVICE = READ_FILE | WRITE_FILE | IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _syscall(index, *args):
    """(result, errno) of Landlock's call `index` (0 create, 1 add rule, 2 restrict); ENOSYS on a machine without its numbers here."""
    numbers = CALLS.get(os.uname().machine)
    if numbers is None:
        return -1, errno.ENOSYS
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(numbers[index]), *args)
    return result, ctypes.get_errno()


def abi():
    """The Landlock ABI version this kernel offers this process; 0 where there is none (not built, not enabled, or refused by a filter)."""
    version, _ = _syscall(0, ctypes.c_void_p(None), ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(int(version), 0)


def why_missing():
    """Why abi() is 0, in words a course can act on."""
    version, error = _syscall(0, ctypes.c_void_p(None), ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    if version > 0:
        return None
    if error == errno.EOPNOTSUPP:
        return "the kernel has Landlock but it is not enabled (boot with lsm=...,landlock)"
    if error == errno.ENOSYS and os.uname().machine in CALLS:
        return "the kernel has no Landlock (Linux 5.13 or later, built with CONFIG_SECURITY_LANDLOCK), or a seccomp profile refuses it"
    if error == errno.ENOSYS:
        return f"the gate has no Landlock call numbers for {os.uname().machine}"
    return f"landlock_create_ruleset is refused ({os.strerror(error)}): the container's seccomp profile does not allow Landlock's calls"


def restrict(*, read, write, devices=()):
    """Hold this process and its future children to `read` (read-only trees and files), `write` (read-write folders) and
    `devices` (device files); None once in effect, else why not. Needs no_new_privs (or CAP_SYS_ADMIN)."""
    version = abi()
    if version < 1:
        return why_missing()
    fs = ALL_FS[min(version, max(ALL_FS))]
    attr = _RulesetAttr(fs, TCP_BIND_AND_CONNECT if version >= 4 else 0, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if version >= 6 else 0)
    size = 8 if version < 4 else 16 if version < 6 else 24
    ruleset, error = _syscall(0, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"landlock_create_ruleset failed ({os.strerror(error)})"
    try:
        for paths, rights, required in ((read, READ, False), (devices, DEVICE, False), (write, fs, True)):
            for path in paths:
                why_not = _allow(ruleset, path, rights & fs)
                if why_not and required:
                    return why_not
        result, error = _syscall(2, ctypes.c_int(ruleset), ctypes.c_uint32(0))
        return None if result == 0 else f"landlock_restrict_self failed ({os.strerror(error)})"
    finally:
        os.close(ruleset)


def _allow(ruleset, path, rights):
    """Add a rule giving `rights` beneath `path` (a file's rule keeps the file rights alone); None, or why not (a path gone meanwhile)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        result, error = _syscall(1, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0))
        return None if result == 0 else f"{path}: landlock_add_rule failed ({os.strerror(error)})"
    finally:
        os.close(fd)


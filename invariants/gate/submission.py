"""A submission on disk -> a copy in the scratch directory, its entry module, and its hash.

Accepted: a .py file; a folder (a package with __init__.py, or modules with a submission.py
or adapter.py entry, or a single module); a .zip of either. Symbolic links, paths that leave
the archive, and oversized archives are refused: the copy is made by the trusted parent.
"""

from __future__ import annotations

import errno
import hashlib
import lzma
import os
import shutil
import stat
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MAX_FILES = 2000
MAX_BYTES = 100 << 20
ENTRY_CANDIDATES = ("submission.py", "adapter.py")
IGNORED = {"__pycache__", ".git", ".DS_Store", "__MACOSX", ".ipynb_checkpoints"}
METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)  # the compression methods zipfile reads
# What zipfile raises for an entry it cannot unpack: a bad CRC or header, corrupt compressed data (bz2 raises OSError), a truncated stream.
UNPACKING = (zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, NotImplementedError, EOFError, ValueError, zlib.error,
             lzma.LZMAError, OSError)


class SubmissionError(Exception):
    """The submission cannot be graded as given (not found, unsafe archive, no entry module)."""


@dataclass(frozen=True)
class Layout:
    source: str  # the path as given
    kind: str  # "file", "folder" or "zip"
    root: Path  # the folder put on the worker's sys.path's side: entry is relative to it
    entry: str  # the module the worker loads, relative to root, "/"-separated
    package: bool  # entry is a package's __init__.py
    module_name: str
    files: tuple  # every copied file, relative to root
    sha256: str  # of the submission's files (names inside it and contents), not of where it lies

    def python_files(self):
        return [f for f in self.files if f.endswith(".py")]


def _module_name(stem, blocked):
    ok = stem.isidentifier() and stem not in sys.stdlib_module_names and stem not in sys.builtin_module_names
    return stem if ok and stem not in blocked and stem not in ("numpy", "torch", "hypothesis", "pytest") else "submission"


def _check_tree(folder):
    count = size = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in IGNORED]
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise SubmissionError(f"the file name {os.fsencode(path.relative_to(folder))!r} is not UTF-8: rename it") from None
            if path.is_symlink():
                raise SubmissionError(f"{path.relative_to(folder)} is a symbolic link: submit plain files")
            if not (path.is_dir() or path.is_file()):  # a FIFO would hang the copy; a device or socket is no source file
                raise SubmissionError(f"{path.relative_to(folder)} is not a regular file (a FIFO, socket or device): submit plain files")
        for name in filenames:
            if name in IGNORED:
                continue
            count += 1
            size += (Path(dirpath) / name).stat().st_size
            if count > MAX_FILES or size > MAX_BYTES:
                raise SubmissionError(f"the submission has more than {MAX_FILES} files or {MAX_BYTES >> 20} MiB")


def _extract(archive, target):
    """Unpack `archive` into `target`; a SubmissionError naming the entry for anything that is not a plain, readable zip of files."""
    try:
        zf = zipfile.ZipFile(archive)
    except UnicodeDecodeError as exc:  # the entry's UTF-8 flag is set, and its name is not UTF-8
        raise SubmissionError(f"{Path(archive).name} has an entry whose name {exc.object[:80]!r} is not UTF-8: rename it") from None
    except UNPACKING as exc:
        raise SubmissionError(f"{Path(archive).name} is not a readable zip file ({_first_line(exc)})") from None
    with zf:
        members = [m for m in zf.infolist() if not set(PurePosixPath(m.filename).parts) & IGNORED]
        if len(members) > MAX_FILES:
            raise SubmissionError(f"the archive has {len(members)} entries (the limit is {MAX_FILES})")
        files = {PurePosixPath(m.filename) for m in members if not m.is_dir()}
        total = 0
        for member in members:
            parts = PurePosixPath(member.filename).parts
            if member.filename.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
                raise SubmissionError(f"the archive entry {member.filename!r} would land outside the submission")
            if stat.S_ISLNK(member.external_attr >> 16):
                raise SubmissionError(f"the archive entry {member.filename!r} is a symbolic link: submit plain files")
            if member.flag_bits & 0x1:
                raise SubmissionError(f"the archive entry {member.filename!r} is encrypted: zip it again without a password")
            if member.compress_type not in METHODS:
                raise SubmissionError(f"the archive entry {member.filename!r} is compressed with method {member.compress_type}, "
                                      "which zipfile cannot unpack: zip it again, deflated")
            clash = next((p for p in PurePosixPath(member.filename).parents if p in files), None)
            if clash is not None:
                raise SubmissionError(f"the archive entry {member.filename!r} lies in a folder {str(clash)!r}, "
                                      "but the archive also has a file of that name")
            try:
                total = _unpack(zf, member, target.joinpath(*parts), total)
            except PermissionError:
                raise  # the scratch folder is the gate's
            except UNPACKING as exc:
                why = ("the scratch folder is full" if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) else _first_line(exc))
                raise SubmissionError(f"the archive entry {member.filename!r} cannot be unpacked ({why}): zip it again") from None


def _unpack(zf, member, destination, total):
    """Copy one archive entry to destination, counting its bytes into the running `total` (at most MAX_BYTES); the new total."""
    if member.is_dir():
        destination.mkdir(parents=True, exist_ok=True)
        return total
    destination.parent.mkdir(parents=True, exist_ok=True)
    with zf.open(member) as src, open(destination, "wb") as dst:
        while chunk := src.read(1 << 20):
            total += len(chunk)
            if total > MAX_BYTES:
                raise SubmissionError(f"the archive unpacks to more than {MAX_BYTES >> 20} MiB")
            dst.write(chunk)
    return total


def _first_line(exc, limit=200):
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


def _digest(folder, files):
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.encode() + b"\0" + hashlib.sha256((folder / rel).read_bytes()).digest())
    return h.hexdigest()


def _listing(folder):
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED)
        out += [str((Path(dirpath) / f).relative_to(folder).as_posix()) for f in filenames if f not in IGNORED and not f.endswith(".pyc")]
    return sorted(out)


def materialise(path, scratch, *, entry=None, blocked=()):
    """Copy the submission at `path` into scratch/submission and find its entry module; a Layout."""
    source = Path(path)
    if not source.exists():
        raise SubmissionError(f"no file or folder {path!r}")
    try:
        source.name.encode("utf-8")
    except UnicodeEncodeError:
        raise SubmissionError(f"the submission's name {os.fsencode(source.name)!r} is not UTF-8: rename it") from None
    if source.is_symlink():
        source = source.resolve()
    root = Path(scratch) / "submission"
    root.mkdir(parents=True)
    if source.is_file() and source.suffix == ".py":
        name = _module_name(source.stem, blocked)
        shutil.copyfile(source, root / f"{name}.py")
        digest = hashlib.sha256(hashlib.sha256(source.read_bytes()).digest()).hexdigest()
        return Layout(str(path), "file", root, f"{name}.py", False, name, (f"{name}.py",), digest)
    if source.is_file() and source.suffix == ".zip":
        kind, unpacked = "zip", Path(scratch) / "unpacked"
        unpacked.mkdir()
        _extract(source, unpacked)
        tops = [p for p in unpacked.iterdir() if p.name not in IGNORED]
        folder = tops[0] if len(tops) == 1 and tops[0].is_dir() else unpacked
        stem = source.stem if folder == unpacked else folder.name
    elif source.is_dir():
        kind, folder, stem = "folder", source, source.name
    else:
        raise SubmissionError(f"{path!r} is neither a .py file, a folder nor a .zip")
    _check_tree(folder)
    files = _listing(folder)
    digest = _digest(folder, files)
    package = "__init__.py" in files and entry is None
    name = _module_name(stem, blocked) if package else stem if stem.isidentifier() else "submission"
    copied = root / name
    shutil.copytree(folder, copied, ignore=shutil.ignore_patterns(*IGNORED, "*.pyc"))
    if package:
        chosen = "__init__.py"
    elif entry is not None:
        if entry not in files:
            raise SubmissionError(f"the entry module {entry!r} is not in the submission (it has {', '.join(files[:8]) or 'no files'})")
        chosen = entry
    else:
        top_level = [f for f in files if "/" not in f and f.endswith(".py")]
        candidates = [c for c in ENTRY_CANDIDATES if c in top_level] or (top_level if len(top_level) == 1 else [])
        if not candidates:
            raise SubmissionError(
                f"cannot tell which module to load: add an __init__.py, a submission.py or an adapter.py "
                f"(found {', '.join(top_level) or 'no .py file at the top level'})"
            )
        chosen = candidates[0]
    module_name = name if package else _module_name(PurePosixPath(chosen).stem, blocked)
    rel_files = tuple(f"{name}/{f}" for f in files)
    return Layout(str(path), kind, root, f"{name}/{chosen}", package, module_name, rel_files, digest)

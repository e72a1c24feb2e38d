"""Small durable-file helpers: atomic files and JSON metadata, directory fsync, whole writes,
and what a failed file operation means to a client."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from messaging.errors import DiskFullError, StorageError


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (created, renamed, deleted files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: What tells one version of a file from another: device, inode, size, mtime in ns.
FileVersion = tuple[int, int, int, int]


def file_version(path: Path) -> FileVersion | None:
    """The version of the file at ``path`` now (None when it cannot be looked at): a rename
    over it changes the inode, an edit in place its size or modification time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def lock_exclusive(path: Path) -> int | None:
    """Open ``path`` (created if missing) and take an exclusive ``flock`` on it without
    waiting; returns the descriptor that holds the lock (close it to let go), or None when
    another process holds it. Errors opening the file are raised."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def write_json_atomic(path: Path, value: Any, *, durable: bool = True) -> None:
    """Write ``value`` as JSON so that ``path`` holds either the old or the new content
    (see :func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, json.dumps(value, sort_keys=True).encode() + b"\n",
                       durable=durable)


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = True,
                       like: os.stat_result | None = None) -> None:
    """Write ``data`` so that ``path`` holds either the old or the new content.

    A temporary file of its own (so concurrent writers never share one), fsync, rename over
    the target, fsync the directory. On any failure the temporary file is removed and the
    target is untouched. ``durable=False`` skips both fsyncs (atomic, not durable). The new
    file is 0600, or has the permission bits and owner of ``like`` (the file it replaces).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        try:
            if like is not None:
                if (like.st_uid, like.st_gid) != (os.geteuid(), os.getegid()):
                    os.fchown(fd, like.st_uid, like.st_gid)
                os.fchmod(fd, like.st_mode & 0o7777)
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def remove_stale_temporaries(path: Path) -> None:
    """Remove temporary files a crash left behind by :func:`write_json_atomic` for ``path``."""
    for stale in path.parent.glob(path.name + ".*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()


#: The name prefix of a directory being deleted by :func:`remove_directory`.
DELETING = ".deleting-"
_removals = itertools.count()  # a distinct trash name for each removal of this process


def remove_directory(path: Path) -> None:
    """Delete a directory so that a crash or a failure never leaves part of it under its
    name (whoever uses the name next must find all of it or nothing): rename it away
    durably first, then delete the renamed tree. What a crash leaves under a
    :data:`DELETING` name is for the next start to remove (:func:`remove_deleting`).
    Raises the rename's error (FileNotFoundError when there is nothing to delete)."""
    trash = path.with_name(f"{DELETING}{path.name}-{os.getpid()}-{next(_removals)}")
    os.rename(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def remove_deleting(parent: Path) -> None:
    """Remove what interrupted :func:`remove_directory` calls left in ``parent``."""
    for entry in parent.glob(DELETING + "*"):
        shutil.rmtree(entry, ignore_errors=True)


def read_json(path: Path) -> Any:
    """Read a JSON file written by :func:`write_json_atomic`."""
    with path.open("rb") as f:
        return json.load(f)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """``os.write`` until every byte is written (raises the first error; bytes may be left)."""
    with memoryview(data) as whole:
        written = 0
        size = len(whole)
        while written < size:
            with whole[written:] as rest:
                written += os.write(fd, rest)


def truncate_durably(path: Path, size: int) -> None:
    """Cut the file at ``path`` to ``size`` bytes and fsync it (raises OSError)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def storage_error(doing: str, err: OSError) -> StorageError:
    """The error a client gets when ``doing`` (e.g. "writing topic 3") failed with ``err``."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"disk full: no space left {doing}; writes resume once space "
                             "is freed")
    return StorageError(f"{doing} failed: {err.strerror or err}")

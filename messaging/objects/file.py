"""``file:///PATH``: an object store in a local (or mounted) directory.

The directory plays the bucket: it must exist (a missing one is "no such bucket", so an
unmounted or mistyped path is reported, not silently filled). An object is a file at its name
under it. Creating one never replaces another: the bytes go to a temporary file of their own
in the target directory (a dot name, which no object can have), fsynced, then hard-linked to
the object's name (``link`` fails if the name exists, unlike ``rename``), and the directory
fsynced: a crash leaves the object whole or absent, plus at most a temporary file. Every
operation runs in a thread: the event loop never touches the disk.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import functools
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

from messaging.files import fsync_dir, write_all
from messaging.objects.errors import (
    ObjectCorruptError,
    ObjectNotFoundError,
    ObjectStoreError,
    StoreBucketMissingError,
    StoreDeniedError,
    StoreServerError,
    StoreUnavailableError,
)
from messaging.objects.store import (
    ObjectInfo,
    Source,
    StoredObject,
    check_name,
    check_range,
)
from messaging.objects.upload import put_verified

_COPY_CHUNK = 1 << 20
P = ParamSpec("P")
T = TypeVar("T")


class FileStore:
    """An object store in the directory ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def url(self) -> str:
        """``file:///path``."""
        return self.root.as_uri()

    def __repr__(self) -> str:
        return f"FileStore({self.url})"

    # -- the contract -----------------------------------------------------------------------

    async def put_if_absent(self, name: str, source: Source, *,
                            sha256: str | None = None) -> StoredObject:
        """See :meth:`messaging.objects.store.ObjectStore.put_if_absent`."""
        check_name(name)
        return await put_verified(self, name, source, sha256,
                                  lambda: self._run(name, self._create, name, source))

    async def put_new(self, name: str, data: bytes) -> bool:
        """See :meth:`messaging.objects.store.ObjectStore.put_new` (a directory gives no
        checksum of its own: read back, which is local)."""
        return (await self.put_if_absent(name, data)).created

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        """See :meth:`messaging.objects.store.ObjectStore.get_range`."""
        check_name(name)
        check_range(name, start, end)
        if start == end:
            return b""
        data = await self._run(name, self._read, name, start, end)
        if len(data) != end - start:
            raise ObjectCorruptError(self.url, name, f"{start + len(data)} bytes long, a read "
                                     f"of bytes [{start}, {end}) was asked for")
        return data

    async def size(self, name: str) -> int:
        """See :meth:`messaging.objects.store.ObjectStore.size`."""
        check_name(name)
        return await self._run(name, self._size, name)

    async def list(self, prefix: str = "") -> Sequence[ObjectInfo]:
        """See :meth:`messaging.objects.store.ObjectStore.list`."""
        check_name(prefix, prefix=True)
        return await self._run("", self._list, prefix)

    async def delete(self, name: str) -> None:
        """See :meth:`messaging.objects.store.ObjectStore.delete`."""
        check_name(name)
        await self._run(name, self._delete, name)

    # -- in a thread ------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return self.root.joinpath(*name.split("/"))

    def _create(self, name: str, source: Source) -> bool:
        """Create the object unless it exists; True if this call made it."""
        self._require_root()
        path = self._path(name)
        if os.path.lexists(path):  # a retry: skip the copy (the link below decides races)
            return False
        self._make_parents(path.parent)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                         suffix=".tmp")
        try:
            try:
                self._copy(source, fd)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temporary, path)
                created = True
            except FileExistsError:
                created = False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        fsync_dir(path.parent)
        return created

    @staticmethod
    def _copy(source: Source, fd: int) -> None:
        if not isinstance(source, Path):
            write_all(fd, source)
            return
        with source.open("rb") as f:
            while chunk := f.read(_COPY_CHUNK):
                write_all(fd, chunk)

    def _make_parents(self, directory: Path) -> None:
        """Create the directories up to ``directory`` durably (each new entry fsynced)."""
        missing: builtins.list[Path] = []
        while not directory.is_dir() and directory != self.root:
            missing.append(directory)
            directory = directory.parent
        for new in reversed(missing):
            with contextlib.suppress(FileExistsError):  # a concurrent upload made it
                new.mkdir()
            fsync_dir(new.parent)

    def _size(self, name: str) -> int:
        status = os.stat(self._path(name))
        if not stat.S_ISREG(status.st_mode):  # a directory: a prefix, not an object
            raise FileNotFoundError(errno.ENOENT, "not an object", name)
        return status.st_size

    def _read(self, name: str, start: int, end: int) -> bytes:
        fd = os.open(self._path(name), os.O_RDONLY)
        try:
            return os.pread(fd, end - start, start)
        finally:
            os.close(fd)

    def _list(self, prefix: str) -> builtins.list[ObjectInfo]:
        self._require_root()
        top = self._path(prefix) if prefix else self.root
        found: builtins.list[ObjectInfo] = []
        for directory, subdirectories, files in os.walk(top):
            subdirectories[:] = [d for d in subdirectories if not d.startswith(".")]
            for file in files:
                if file.startswith("."):  # a temporary file of an upload
                    continue
                path = Path(directory, file)
                with contextlib.suppress(FileNotFoundError):  # deleted while listing
                    found.append(ObjectInfo(path.relative_to(self.root).as_posix(),
                                            path.stat().st_size))
        return sorted(found, key=lambda info: info.name)

    def _delete(self, name: str) -> None:
        path = self._path(name)
        try:
            path.unlink()
        except FileNotFoundError:
            self._require_root()
            return
        fsync_dir(path.parent)

    def _require_root(self) -> None:
        if not self.root.is_dir():
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(self.root))

    # -- errors -----------------------------------------------------------------------------

    async def _run(self, name: str, call: Callable[P, T], *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """``call`` in a thread, its OSError turned into this package's kinds."""
        return await asyncio.to_thread(self._guarded, name, functools.partial(call, *args,
                                                                              **kwargs))

    def _guarded(self, name: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as err:
            if not self.root.is_dir():
                raise StoreBucketMissingError(self.url, name, f"directory {self.root} does "
                                              "not exist") from err
            raise ObjectNotFoundError(self.url, name) from err
        except OSError as err:
            raise self._error(name, err) from err

    def _error(self, name: str, err: OSError) -> ObjectStoreError:
        detail = f"{err.strerror or err}"
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return StoreDeniedError(self.url, name, detail)
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
            return StoreServerError(self.url, name, detail)
        return StoreUnavailableError(self.url, name, detail)

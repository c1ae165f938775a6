"""Triton's system shared-memory extension: POSIX shared-memory regions a client on this host
registers by name, then names in an inference instead of sending a tensor's bytes through the
socket (inputs read from a region, outputs written into one).

Registrations are the server's, not a worker's: they live in a table the supervisor shares
(`create_regions_table`), so a client that registered through one worker's connection may infer
through any. What a region lets a caller touch is checked on every use:

- only a client on this host may register (a loopback or Unix-socket peer: `same_host`), since
  the regions are this host's and a remote caller could otherwise read or write them;
- the key is a POSIX shared-memory name (`/name`, opened under /dev/shm without following links,
  never created), the region a regular file at least `offset + byte_size` long;
- every read and write stays inside `[offset, offset + byte_size)` of the registration, and uses
  pread/pwrite on a descriptor opened for that call, so a client that shrinks or removes its
  region gets an error, never a SIGBUS in the server, and the server never keeps a region alive;
- a region replaced under the same key (another file) or removed since it was registered is
  unregistered at its next use, with an error saying so (a crashed client's regions go once the
  file is gone).
"""

from __future__ import annotations

import os
import stat
import struct
import time
from dataclasses import dataclass

from tfservo.core.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied, ResourceExhausted
from tfservo.core.settings import is_loopback
from tfservo.core.shared_table import SharedTable, TableFull, create_table

__all__ = ["REGIONS_TABLE", "Region", "SharedMemoryRegions", "create_regions_table", "same_host"]

REGIONS_TABLE = "shared-memory-regions"  # its file's name in the server's shared folder
SHM_DIR = "/dev/shm"
_NAME_MAX, _KEY_MAX = 128, 255
_SLOTS = 1024
MAX_REGIONS = 256  # registrations a server holds at once; the table stays at most a quarter full
_RECORD = struct.Struct(f"<{_NAME_MAX}s{_KEY_MAX + 1}sQQQQd")  # name, key, offset, byte_size, dev, ino, when


@dataclass(frozen=True)
class Region:
    """One registration: `byte_size` bytes from `offset` of the shared-memory object `key`."""

    name: str
    key: str
    offset: int
    byte_size: int
    device: int
    inode: int

    def status(self) -> dict[str, object]:
        """As Triton's status lists it."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def create_regions_table(path: str) -> None:
    """Make the zeroed table the workers of one server keep registrations in."""
    create_table(path, _SLOTS, _RECORD)


def same_host(peer: str) -> bool:
    """Whether a caller (an address as the doors name it; "-" or "unix:..." for a Unix socket)
    is on this host, where its shared memory is."""
    return peer == "-" or peer.startswith("unix:") or is_loopback(peer)


class SharedMemoryRegions:
    """The server's registered regions (in the supervisor's table when `path` is given)."""

    def __init__(self, path: str | None = None) -> None:
        self._table = SharedTable(_SLOTS, _RECORD, path)

    # -- the extension's three calls -----------------------------------------------------------

    def register(self, name: object, key: object, offset: object, byte_size: object, peer: str) -> None:
        """Register `byte_size` bytes of `key` from `offset` as `name`, after checking the caller
        is on this host and the region exists and is that large."""
        if not same_host(peer):
            raise PermissionDenied(
                f"shared memory can only be registered by a client on this host, not {peer}: the region is "
                "this host's memory; send the tensor in the request instead"
            )
        if not isinstance(name, str) or not name or len(name.encode()) > _NAME_MAX:
            raise InvalidArgument(f"a shared-memory region needs a name of 1 to {_NAME_MAX} bytes, got {name!r}")
        checked_key = _checked_key(key)
        start, size = _count(offset, "offset", name), _count(byte_size, "byte_size", name)
        if size == 0:
            raise InvalidArgument(f"shared-memory region '{name}': byte_size must be positive")
        fd = _open(checked_key, name, os.O_RDONLY)
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        if info.st_size < start + size:
            raise InvalidArgument(
                f"shared-memory region '{name}': {checked_key} holds {info.st_size} bytes, fewer than offset {start} "
                f"+ byte_size {size}"
            )
        with self._table.locked():
            if self._table.get(name) is not None:
                raise AlreadyExists(
                    f"shared memory region '{name}' already in manager; unregister it first or choose another name"
                )
            if sum(1 for _ in self._table.records()) >= MAX_REGIONS:
                raise ResourceExhausted(f"this server holds {MAX_REGIONS} shared-memory regions; unregister some first")
            values = (name.encode(), checked_key.encode(), start, size, info.st_dev, info.st_ino, time.time())
            try:
                self._table.put(name, values, None)
            except TableFull:
                raise ResourceExhausted("no room for another shared-memory region; unregister some first") from None

    def unregister(self, name: str | None) -> None:
        """Forget `name` (every region when None or ""); a name not registered is no error, as in Triton."""
        with self._table.locked():
            if name:
                self._table.delete(name)
                return
            for region in list(self._regions()):
                self._table.delete(region.name)

    def status(self, name: str | None) -> list[dict[str, object]]:
        """The registrations (the one `name`; NotFound when it is not registered), after
        dropping those whose region is gone or replaced."""
        for region in list(self._regions()):
            if not _still_there(region):
                self.unregister(region.name)
        if name:
            return [self.region(name).status()]
        return sorted((region.status() for region in self._regions()), key=lambda s: str(s["name"]))

    # -- what inferences do with them -----------------------------------------------------------

    def region(self, name: str) -> Region:
        """The registration `name`, or NotFound in Triton's words."""
        values = self._table.get(name)
        if values is None:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return _region(values)

    def read(self, name: str, offset: int, byte_size: int, what: str) -> bytes:
        """`byte_size` bytes at `offset` inside region `name`, for `what` (an input's name)."""
        region = self.region(name)
        _inside(region, offset, byte_size, what)
        fd = self._open_registered(region, os.O_RDONLY)
        try:
            data = os.pread(fd, byte_size, region.offset + offset)
        finally:
            os.close(fd)
        if len(data) != byte_size:
            raise InvalidArgument(f"{what}: shared-memory region '{name}' ({region.key}) was truncated since it was "
                                  f"registered; {len(data)} of {byte_size} bytes could be read")
        return data

    def write(self, name: str, offset: int, byte_size: int, data: bytes, what: str) -> None:
        """Write `data` (at most `byte_size` bytes) at `offset` inside region `name`, for `what`."""
        region = self.region(name)
        _inside(region, offset, byte_size, what)
        if len(data) > byte_size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output '{what}' ({byte_size} bytes) should be at "
                f"least {len(data)} bytes to hold the results"
            )
        fd = self._open_registered(region, os.O_RDWR)
        try:
            if os.fstat(fd).st_size < region.offset + offset + len(data):
                raise InvalidArgument(f"output {what}: shared-memory region '{name}' ({region.key}) was truncated "
                                      "since it was registered")
            os.pwrite(fd, data, region.offset + offset)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._table.close()

    def _regions(self) -> list[Region]:
        return [_region(values) for values in self._table.records()]

    def _open_registered(self, region: Region, flags: int) -> int:
        try:
            fd = _open(region.key, region.name, flags)
        except NotFound:
            self.unregister(region.name)
            raise NotFound(f"shared-memory region '{region.name}' ({region.key}) no longer exists; it was "
                           "unregistered") from None
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (region.device, region.inode):
            os.close(fd)
            self.unregister(region.name)
            raise InvalidArgument(f"shared-memory region '{region.name}' ({region.key}) was replaced by another "
                                  "object since it was registered; it was unregistered: register it again")
        return fd


def _checked_key(key: object) -> str:
    if (not isinstance(key, str) or not key.startswith("/") or "/" in key[1:] or key in ("/", "/.", "/..")
            or "\x00" in key or len(key.encode()) > _KEY_MAX):
        raise InvalidArgument(f"shared-memory key {key!r} is not a POSIX shared-memory name: '/' then up to "
                              f"{_KEY_MAX - 1} bytes without another '/' (what shm_open takes)")
    return key


def _count(value: object, field: str, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 2**63:
        raise InvalidArgument(f"shared-memory region '{name}': {field} must be a non-negative integer, got {value!r}")
    return value


def _open(key: str, name: str, flags: int) -> int:
    path = os.path.join(SHM_DIR, key[1:])
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise NotFound(f"Unable to open shared memory region: '{name}': no shared-memory object {key}") from None
    except OSError as exc:
        raise InvalidArgument(f"Unable to open shared memory region: '{name}' ({key}): {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidArgument(f"shared-memory key {key} of region '{name}' is not a shared-memory object")
    return fd


def _inside(region: Region, offset: int, byte_size: int, what: str) -> None:
    if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
        raise InvalidArgument(
            f"{what}: {byte_size} bytes at offset {offset} of shared-memory region '{region.name}' run past its "
            f"{region.byte_size} registered bytes"
        )


def _still_there(region: Region) -> bool:
    try:
        info = os.stat(os.path.join(SHM_DIR, region.key[1:]), follow_symlinks=False)
    except OSError:
        return False
    return (info.st_dev, info.st_ino) == (region.device, region.inode)


def _region(values: tuple[object, ...]) -> Region:
    name, key, offset, size, device, inode, _ = values
    assert isinstance(name, bytes) and isinstance(key, bytes)
    return Region(name.rstrip(b"\x00").decode(), key.rstrip(b"\x00").decode(), int(offset),  # type: ignore[call-overload]
                  int(size), int(device), int(inode))  # type: ignore[call-overload]

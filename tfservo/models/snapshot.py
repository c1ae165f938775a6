"""Copy a model dir into a private snapshot through file descriptors: what loads is exactly
what was checked.

Checking paths and then loading from them leaves a window in which a link can be swapped (39
of 200 swaps escaped that way). Here every dir and file is opened first and checked after:
where the descriptor really points (/proc/self/fd) must lie inside the model root, it must be
a dir or a regular file, and a hard-linked file must have all its names inside the copied
tree (another name could be a file from anywhere on the disk). The bytes copied are read
from those same descriptors; the loader then reads only the snapshot.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field

from tfservo.core.errors import PermissionDenied

__all__ = ["Snapshot", "copy_confined", "copy_file_confined"]

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)  # a FIFO must not block


@dataclass
class Snapshot:
    """A confined copy: where it is and how many bytes it holds. The rest is bookkeeping for the
    hard-link check: each inode's hard names seen in the tree, and its most links seen."""

    path: str
    bytes: int = 0
    names: dict[tuple[int, int], set[tuple[int, int, str]]] = field(default_factory=dict)
    links: dict[tuple[int, int], tuple[int, str]] = field(default_factory=dict)


def copy_confined(source: str, root: str, dest: str, *, model: str) -> Snapshot:
    """Copy the tree at `source` (links followed) into the new dir `dest`; PermissionDenied
    naming the file when anything opened lies outside `root` or is not a dir or regular file."""
    snapshot = Snapshot(dest)
    root = root.rstrip(os.sep) or os.sep
    try:
        fd = _open_inside(source, None, source, root, model)
        try:
            _copy_dir(fd, source, dest, root, model, snapshot, ancestors=set())
        finally:
            os.close(fd)
        _check_hard_links(snapshot, root, model)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return snapshot


def copy_file_confined(source: str, root: str, dest: str, *, model: str) -> int:
    """Copy the one regular file at `source` (links followed, inside `root`, no hard link
    elsewhere) to the new file `dest`; bytes copied. FileNotFoundError when there is none."""
    root = root.rstrip(os.sep) or os.sep
    if not os.path.lexists(source):
        raise FileNotFoundError(source)
    fd = _open_inside(source, None, source, root, model)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PermissionDenied(f"{source} of model {model} is not a regular file; name an archive")
        if st.st_nlink > 1:
            raise PermissionDenied(
                f"model {model} has {source}, a file with {st.st_nlink} hard links: it may be a file from "
                f"outside the model root {root}; copy it into place instead of linking it"
            )
        return _copy_file(fd, dest)
    finally:
        os.close(fd)


def _copy_dir(
    dir_fd: int, shown: str, dest: str, root: str, model: str, snapshot: Snapshot, ancestors: set[tuple[int, int]]
) -> None:
    st = os.fstat(dir_fd)
    key = (st.st_dev, st.st_ino)
    if key in ancestors:
        raise PermissionDenied(f"model {model} has {shown}, a link back to a dir that contains it; remove the loop")
    os.mkdir(dest, 0o700)
    for name in sorted(os.listdir(dir_fd)):
        path = os.path.join(shown, name)
        fd = _open_inside(name, dir_fd, path, root, model)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                _copy_dir(fd, path, os.path.join(dest, name), root, model, snapshot, ancestors | {key})
            elif stat.S_ISREG(mode):
                _note_name(dir_fd, key, name, fd, path, snapshot)
                snapshot.bytes += _copy_file(fd, os.path.join(dest, name))
            else:
                raise PermissionDenied(
                    f"model {model} has {path}, which is not a regular file (a device, socket or pipe); remove it"
                )
        finally:
            os.close(fd)


def _open_inside(name: str, dir_fd: int | None, shown: str, root: str, model: str) -> int:
    """Open `name` (links followed), then refuse it unless what was opened lies inside `root`."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise PermissionDenied(f"cannot open {shown} of model {model}: {exc.strerror}; fix or remove it") from None
    real = _opened_path(fd)
    if real is not None and not (real == root or real.startswith(root + os.sep)):
        os.close(fd)
        raise PermissionDenied(
            f"model {model} has {shown}, a link to {real}, outside the model root {root}; "
            "copy the files into the model dir instead"
        )
    return fd


def _opened_path(fd: int) -> str | None:
    """The path the kernel resolved for `fd`, or None where /proc is not mounted."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _note_name(dir_fd: int, dir_key: tuple[int, int], name: str, fd: int, shown: str, snapshot: Snapshot) -> None:
    """Record `name` as a hard name of the opened file when the entry, not followed, is that
    same file (a symlink to it is not a name of it)."""
    st = os.fstat(fd)
    inode = (st.st_dev, st.st_ino)
    if st.st_nlink > max(1, snapshot.links.get(inode, (0, ""))[0]):
        snapshot.links[inode] = (st.st_nlink, shown)
    try:
        entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISREG(entry.st_mode) and (entry.st_dev, entry.st_ino) == inode:
        snapshot.names.setdefault(inode, set()).add((*dir_key, name))


def _check_hard_links(snapshot: Snapshot, root: str, model: str) -> None:
    for inode, (count, shown) in snapshot.links.items():
        inside = len(snapshot.names.get(inode, ()))
        if inside < count:
            raise PermissionDenied(
                f"model {model} has {shown}, a file with {count} hard links, {count - inside} of them "
                f"outside the model dir: it may be a file from outside the model root {root}; "
                "copy it into place instead of linking it (cp without --link)"
            )


def _copy_file(src_fd: int, dest: str) -> int:
    """Copy the open file `src_fd` to the new file `dest` (in the kernel where it can); bytes copied."""
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    copied = 0
    try:
        while True:
            try:
                n = os.sendfile(out, src_fd, copied, 1 << 24)
            except (OSError, AttributeError):
                return copied + _copy_by_reading(src_fd, out, copied)
            if n == 0:
                return copied
            copied += n
    finally:
        os.close(out)


def _copy_by_reading(src_fd: int, out: int, offset: int) -> int:
    copied = 0
    while chunk := os.pread(src_fd, 1 << 20, offset + copied):
        os.write(out, chunk)
        copied += len(chunk)
    return copied

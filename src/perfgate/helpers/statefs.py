"""Create, write, lock and remove the server's own files in the workspace's ``.perfgate/``, following no link.

The agent can write the whole workspace, ``.perfgate/`` included. Between two calls it can put a symbolic
link where the server expects its own folder or lock file (``.perfgate/bench-runs/<key>`` pointing at a
directory elsewhere, ``decisions.lock`` at a file elsewhere), and a server that followed it would create,
truncate or delete there with the operator's rights. Every operation here therefore takes a *resolved*
absolute path (the workspace is resolved once, when the server opens its ledger, so no link on it is the
operator's) and walks it from ``/`` one component at a time, each opened relative to the directory before
it with ``O_NOFOLLOW``: a link met on the way is something planted, and the call fails before anything is
created through it. The last component is created, replaced (``rename`` within the opened folder, which
replaces a link rather than writing through it) or removed relative to its folder's descriptor, and a tree
is removed by descriptor too, so nothing outside the walked folders is touched even when the agent swaps a
folder for a link mid-removal.

A lock file must be the server's own: a regular file of this user with one name. One the agent planted
(another owner, a second hard link to a file elsewhere, a FIFO) is removed and made afresh; locking a file
never writes it, so nothing outside the workspace changes either way.

Stdlib only: the detached supervisor imports it (through `perfgate.helpers.filelock`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from perfgate.helpers.safeopen import UnsafeFileError

__all__ = ["fresh_dir", "make_dirs", "open_lock", "remove_tree", "write_file"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC


def _linked(path: Path, part: str) -> UnsafeFileError:
    return UnsafeFileError(
        errno.ELOOP,
        f"{path}: {part!r} is a symbolic link (or not a folder) where perfgate keeps its own folder; something "
        "other than the server put it there. Remove it (perfgate makes the folder again) and retry",
        str(path),
    )


def _parts(path: Path) -> tuple[str, ...]:
    assert path.is_absolute() and ".." not in path.parts, f"resolve {path} before using it"
    return path.parts[1:]


def _open_dir_at(fd: int, part: str, *, create: bool) -> int:
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # mkdir never follows: a link put there meanwhile is EEXIST
        os.mkdir(part, dir_fd=fd)
    return os.open(part, _DIR_FLAGS, dir_fd=fd)


def _walk(path: Path, parts: tuple[str, ...], *, create: bool) -> int:
    """A descriptor of the folder ``/`` + ``parts`` (made where missing when ``create``), no link followed."""
    fd = os.open("/", os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        for part in parts:
            try:
                nxt = _open_dir_at(fd, part, create=create)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _linked(path, part) from exc
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dirs(path: Path) -> None:
    """``path.mkdir(parents=True, exist_ok=True)``, refusing any link on the way.

    Raises:
        UnsafeFileError: a component of ``path`` is a symbolic link or not a folder.
    """
    os.close(_walk(path, _parts(path), create=True))


def _own_lock(fd: int) -> bool:
    st = os.fstat(fd)
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid()


def open_lock(path: Path) -> int:
    """A read-write descriptor of the lock file ``path`` (its folders made as needed), the server's own.

    Raises:
        UnsafeFileError: a folder on the way is a link, or the file could not be made the server's own.
    """
    parts = _parts(path)
    parent = _walk(path, parts[:-1], create=True)
    name = parts[-1]
    try:
        for _ in range(3):  # an agent racing the replacement gets a refusal, never a followed link
            try:
                fd = os.open(
                    name, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o600, dir_fd=parent
                )
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise
            else:
                if _own_lock(fd):
                    return fd
                os.close(fd)
            _remove_at(parent, name)
        raise UnsafeFileError(
            errno.EPERM, f"{path} keeps being replaced by something not perfgate's", str(path)
        )
    finally:
        os.close(parent)


def _remove_at(folder: int, name: str) -> None:
    """Remove ``name`` in the folder ``folder`` (a tree: by descriptor, links removed, never followed)."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=folder)
        return
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link or a file since the stat
            _remove_at(folder, name)
            return
        if exc.errno == errno.ENOENT:
            return
        raise
    try:
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries]
        for child in names:
            _remove_at(fd, child)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=folder)


def remove_tree(path: Path) -> None:
    """Remove ``path`` (a file, a link itself, or a folder with everything in it); nothing if it is missing.

    Raises:
        UnsafeFileError: a folder above ``path`` is a symbolic link (nothing is removed then).
    """
    parts = _parts(path)
    try:
        parent = _walk(path, parts[:-1], create=False)
    except FileNotFoundError:
        return
    try:
        _remove_at(parent, parts[-1])
    finally:
        os.close(parent)


def fresh_dir(path: Path) -> None:
    """An empty folder at ``path`` made by this process, whatever was there (removed as `remove_tree` does).

    Raises:
        UnsafeFileError: a folder above ``path`` is a symbolic link.
    """
    parts = _parts(path)
    parent = _walk(path, parts[:-1], create=True)
    try:
        _remove_at(parent, parts[-1])
        os.mkdir(parts[-1], dir_fd=parent)
    finally:
        os.close(parent)


def write_file(path: Path, data: bytes | Iterable[bytes], *, mode: int = 0o644) -> None:
    """Replace ``path`` with a new file holding ``data`` (or its blocks, in order: a copy in bounded
    memory), written aside in the walked folder, then renamed over the name.

    Raises:
        UnsafeFileError: a folder on the way is a symbolic link.
    """
    parts = _parts(path)
    parent = _walk(path, parts[:-1], create=True)
    tmp = f".{parts[-1]}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                for block in [data] if isinstance(data, bytes) else data:
                    out.write(block)
        finally:
            os.close(fd)
        os.replace(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=parent)
        raise
    finally:
        os.close(parent)

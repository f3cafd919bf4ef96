"""Open a file that was confined by its path, so that what is read is what was checked.

Tools confine a path first (``ToolRuntime.resolve_path``: symlinks resolved, the result inside the
workspace or a read root) and read it afterwards. Between the two, a directory on the path can be
swapped for a symbolic link to somewhere else. Every reader therefore opens the *resolved* path
component by component relative to the directory opened before it, none followed if it is a link
(``O_NOFOLLOW`` with ``dir_fd``, the portable form of ``openat2(RESOLVE_NO_SYMLINKS)``): a resolved path
holds no links, so a link met here was put there after the check, and the open fails. The opened file is
then checked through its descriptor (``fstat``): a regular file, with one hard link. A second hard link
can point at data outside the workspace without any path saying so (the link count is the only trace),
so such files are refused with the advice to copy them.

Reading then goes through the descriptor, so a rename or truncation later cannot redirect it either.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

__all__ = ["UnsafeFileError", "open_file", "open_nofollow"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class UnsafeFileError(OSError):
    """The file changed between its check and its opening, or is not a plain file of its own."""


def _swapped(path: Path, part: str) -> UnsafeFileError:
    return UnsafeFileError(
        errno.ELOOP,
        f"{path}: {part!r} became a symbolic link (or stopped being a directory) after the path was checked; "
        "something changed the folder during the call. Retry once nothing rewrites it",
        str(path),
    )


def open_nofollow(path: Path) -> int:
    """A read-only descriptor of ``path`` (absolute, already resolved), following no symbolic link.

    Raises:
        UnsafeFileError: a component of the path is (now) a symbolic link, or the file is not a regular
            file with a single hard link.
        OSError: the file does not exist or cannot be opened.
    """
    assert path.is_absolute(), f"resolve {path} before opening it"
    parts = path.parts
    if len(parts) < 2:
        raise UnsafeFileError(errno.EISDIR, f"{path} is not a file", str(path))
    fd = os.open(parts[0], os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        for part in parts[1:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _swapped(path, part) from exc
                raise
            os.close(fd)
            fd = nxt
        try:
            # O_NONBLOCK: a FIFO swapped in would otherwise block the open until a writer came.
            out = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _swapped(path, parts[-1]) from exc
            raise
    finally:
        os.close(fd)
    try:
        _check_opened(out, path)
        os.set_blocking(out, True)
    except BaseException:
        os.close(out)
        raise
    return out


def _check_opened(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(errno.EINVAL, f"{path} is not a regular file", str(path))
    if st.st_nlink > 1:
        raise UnsafeFileError(
            errno.EPERM,
            f"{path} has {st.st_nlink} hard links: one may be a file outside the workspace, which no path check "
            "can see. Copy the file (cp, not ln) into the workspace and pass the copy",
            str(path),
        )


def open_file(path: Path) -> io.BufferedReader:
    """`open_nofollow` as a buffered binary file object (the caller closes it)."""
    return io.BufferedReader(io.FileIO(open_nofollow(path), "rb", closefd=True))

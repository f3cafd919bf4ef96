"""Files a `Ledger` keeps open between appends (HEAD, the anchor), used only while their path still names
the file opened; and this process's id, read without a system call.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

__all__ = ["CLOEXEC", "NOFOLLOW", "NONBLOCK", "HeldFile", "any_file", "own_plain_file", "this_pid"]

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def own_plain_file(st: os.stat_result) -> bool:
    """A regular file with no other name (HEAD is written in place only then, never through a link)."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def any_file(st: os.stat_result) -> bool:
    return True


class HeldFile:
    """A file a `Ledger` keeps open between appends (HEAD, the anchor), used only while its path still
    names that very file.

    Before each use the path is looked at again (``lstat``, one system call instead of open and close):
    the descriptor is used only when the path's device, inode, type, permissions and owner are those it
    was opened with, in the process that opened it. Anything else (the file replaced, moved away, turned
    into a link, re-permissioned; a forked child) closes it (a child just forgets the inherited one) and
    the caller opens the path afresh, exactly as it did on every append before.
    """

    def __init__(self) -> None:
        self.fd: int | None = None
        self.pid = 0
        self.ident: tuple[int, ...] = ()

    @staticmethod
    def _ident(st: os.stat_result) -> tuple[int, ...]:
        return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid)

    def get(
        self, path: Path, pid: int, accept: Callable[[os.stat_result], bool]
    ) -> tuple[int, os.stat_result] | None:
        """The held descriptor and the path's ``lstat``, when the path still names the held file and
        ``accept`` takes it; else None (and nothing held any more)."""
        fd = self.fd
        if fd is None:
            return None
        if self.pid == pid:
            try:
                st = os.lstat(path)
            except OSError:
                st = None
            if st is not None and self._ident(st) == self.ident and accept(st):
                return fd, st
            os.close(fd)
        self.fd = None
        return None

    def hold(self, fd: int, pid: int) -> None:
        """Keep ``fd`` (just opened on the path, by this process) for the next use."""
        self.close(pid)
        self.ident = self._ident(os.fstat(fd))
        self.fd, self.pid = fd, pid

    def close(self, pid: int) -> None:
        if self.fd is not None and self.pid == pid:
            os.close(self.fd)
        self.fd = None


_pid = os.getpid()


def _refresh_pid() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_refresh_pid)


def this_pid() -> int:
    """``os.getpid()`` without its system call: remembered, and read again in a child of ``os.fork``."""
    return _pid

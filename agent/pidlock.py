"""One agent per store: an flock()ed pidfile in the store directory, released by the kernel when we exit."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_NAME = "infersight.pid"


class AlreadyRunning(RuntimeError):
    """Another agent holds the store's lock; the message names its pid and the store."""


class PidLock:
    """Held from acquire() until release() or process exit (even kill -9: the kernel drops flocks)."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise AlreadyRunning(f"another infersight agent (pid {holder}) is using the store in "
                                     f"{str(self.path.parent)!r}; stop it, or give this one another store_dir"
                                     ) from None
            raise
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays, holding a stale pid nobody trusts
            self._fd = None

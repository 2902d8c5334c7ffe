"""A secret in a file only its owner reads: written at mode 0600 from creation on, read with every check made on
the open file. The one helper for the workload's admin token (which the demo writes and the server reads) and the
agent's alert HMAC secrets; it imports nothing of ours, so the workload stays a program of its own."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class PrivateFileError(ValueError):
    """Why a secret file was refused; `problem` says which check ("open", "not_regular", "owner", "mode"), and
    the caller words the one-line message for its own key or flag."""

    def __init__(self, problem: str, path: Path, *, strerror: str = "", uid: int = -1, mode: int = 0) -> None:
        super().__init__(f"{problem}: {str(path)!r}")
        self.problem, self.path, self.strerror, self.uid, self.mode = problem, path, strerror, uid, mode


def read_private(path: Path, max_bytes: int, *, trusted_uids: frozenset[int] | None = None,
                 forbidden_mode: int = 0o077) -> bytes:
    """Up to max_bytes + 1 bytes of `path` (one more than allowed, so the caller can tell "too large"): a regular
    file, not a symlink, owned by a trusted uid (root or this user by default), none of `forbidden_mode`'s bits set.
    The checks are made on the open descriptor, so a swap between a check and the read cannot slip past them."""
    trusted = trusted_uids if trusted_uids is not None else frozenset({0, os.geteuid()})
    try:
        # O_NONBLOCK: a FIFO in the file's place opens at once (then is refused) instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise PrivateFileError("open", path, strerror=str(exc.strerror or exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PrivateFileError("not_regular", path)
        if st.st_uid not in trusted:
            # Its owner could change the secret under us, or read it whatever the mode: the file is theirs.
            raise PrivateFileError("owner", path, uid=st.st_uid)
        if st.st_mode & forbidden_mode:
            raise PrivateFileError("mode", path, mode=stat.S_IMODE(st.st_mode))
        return os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)


def write_secret(path: Path, value: str) -> None:
    """Replace `path` with `value`, mode 0600 from creation on (never briefly world-readable), no symlinks."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, value.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)

"""Write a secret to a file that only its owner can read (0600), for children that read it by path."""

from __future__ import annotations

import os
from pathlib import Path


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

"""Read the admin token from a file only its owner can read: a secret never travels on the command line."""

import os
import stat
from pathlib import Path


class TokenFileError(ValueError):
    """The token file cannot be used; the message is one line naming the file and what to do."""


def read_token_file(path: Path) -> str:
    try:
        # O_NONBLOCK: a FIFO in the file's place opens at once (then is refused) instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenFileError(f"token file {str(path)!r} is not a regular file")
        if st.st_uid not in (0, os.geteuid()):
            # Its owner could change the token under us, or read it whatever the mode: the file is theirs.
            raise TokenFileError(f"token file {str(path)!r} is owned by uid {st.st_uid}, not by root or this "
                                 f"user (uid {os.geteuid()}); chown it")
        if st.st_mode & 0o077:
            raise TokenFileError(f"token file {str(path)!r} is readable by other users (mode "
                                 f"{stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
        token = os.read(fd, 4097).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if not token or len(token) > 4096:
        raise TokenFileError(f"token file {str(path)!r} must hold one token of 1..4096 characters")
    return token

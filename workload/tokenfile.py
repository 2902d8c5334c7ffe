"""Read the admin token from a file only its owner can read: a secret never travels on the command line."""

import os
from pathlib import Path

from workload.secretfile import PrivateFileError, read_private

MAX_TOKEN_CHARS = 4096


class TokenFileError(ValueError):
    """The token file cannot be used; the message is one line naming the file and what to do."""


def read_token_file(path: Path) -> str:
    try:
        raw = read_private(path, MAX_TOKEN_CHARS)
    except PrivateFileError as err:
        raise TokenFileError(_message(err)) from None
    token = raw.decode(errors="replace").strip()
    if not token or len(token) > MAX_TOKEN_CHARS:
        raise TokenFileError(f"token file {str(path)!r} must hold one token of 1..{MAX_TOKEN_CHARS} characters")
    return token


def _message(err: PrivateFileError) -> str:
    name = str(err.path)
    if err.problem == "open":
        return f"cannot read token file {name!r}: {err.strerror}"
    if err.problem == "not_regular":
        return f"token file {name!r} is not a regular file"
    if err.problem == "owner":
        return (f"token file {name!r} is owned by uid {err.uid}, not by root or this user (uid {os.geteuid()}); "
                f"chown it")
    return f"token file {name!r} is readable by other users (mode {err.mode:04o}); chmod 600 it"

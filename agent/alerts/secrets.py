"""HMAC secrets: read from a root-only file or the environment, held in a wrapper that never prints itself."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from agent.alerts.config import ReceiverConfig
from agent.config import ConfigError
from agent.trust import StatFn, check_trusted_path
from workload.secretfile import PrivateFileError, read_private

MAX_SECRET_BYTES = 4096


class Secret:
    """Bytes that show as *** in repr/str, so a secret cannot reach a log line or a traceback by accident."""

    __slots__ = ("_value",)

    def __init__(self, value: bytes) -> None:
        self._value = value

    def reveal(self) -> bytes:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__


def load_secret(receiver: ReceiverConfig, *, environ: Mapping[str, str] | None = None, stat: StatFn = os.lstat,
                readlink: Callable[[str], str] = os.readlink,
                trusted_uids: frozenset[int] | None = None) -> Secret | None:
    """The receiver's secret, or None when it signs nothing. ConfigError names the receiver, the file or the
    variable, and never the content."""
    where = f"receivers.{receiver.name}"
    if receiver.hmac_secret_env is not None:
        value = (os.environ if environ is None else environ).get(receiver.hmac_secret_env)
        if not value:
            raise ConfigError(f"{where}.hmac_secret_env: environment variable {receiver.hmac_secret_env!r} "
                              f"is not set or empty")
        return Secret(value.encode())
    path = receiver.hmac_secret_file
    if path is None:
        return None
    check_trusted_path(path, what="secret file", stat=stat, readlink=readlink, trusted_uids=trusted_uids)
    try:
        # Group or others may not read or write it; an execute bit alone reveals nothing.
        data = read_private(path, MAX_SECRET_BYTES, trusted_uids=trusted_uids, forbidden_mode=0o066)
    except PrivateFileError as err:
        raise ConfigError(f"{where}.hmac_secret_file: {_refusal(err)}") from None
    if len(data) > MAX_SECRET_BYTES:
        raise ConfigError(f"{where}.hmac_secret_file: {str(path)!r} is larger than {MAX_SECRET_BYTES} bytes")
    value = data.strip()
    if not value:
        raise ConfigError(f"{where}.hmac_secret_file: {str(path)!r} is empty")
    return Secret(value)


def _refusal(err: PrivateFileError) -> str:
    name = str(err.path)
    if err.problem == "open":
        return f"cannot read {name!r}: {err.strerror}"
    if err.problem == "not_regular":
        return f"{name!r} is not a regular file"
    if err.problem == "owner":
        return f"refusing {name!r}: it is owned by uid {err.uid}"
    return f"refusing {name!r}: readable or writable by other users (mode {err.mode:04o}); chmod 600 it"

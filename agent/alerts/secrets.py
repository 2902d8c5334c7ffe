"""HMAC secrets: read from a root-only file or the environment, held in a wrapper that never prints itself."""

from __future__ import annotations

import os
import stat as stat_mod
from collections.abc import Callable, Mapping

from agent.alerts.config import ReceiverConfig
from agent.config import ConfigError, StatFn, check_trusted_path

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
    trusted = trusted_uids if trusted_uids is not None else frozenset({0, os.geteuid()})
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{where}.hmac_secret_file: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        # Checked on the open file, so a swap between the check and the read cannot slip past it.
        if not stat_mod.S_ISREG(st.st_mode):
            raise ConfigError(f"{where}.hmac_secret_file: {str(path)!r} is not a regular file")
        if st.st_uid not in trusted:
            raise ConfigError(f"{where}.hmac_secret_file: refusing {str(path)!r}: it is owned by uid {st.st_uid}")
        if st.st_mode & (stat_mod.S_IRGRP | stat_mod.S_IROTH | stat_mod.S_IWGRP | stat_mod.S_IWOTH):
            raise ConfigError(f"{where}.hmac_secret_file: refusing {str(path)!r}: readable or writable by other "
                              f"users (mode {stat_mod.S_IMODE(st.st_mode):04o}); chmod 600 it")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise ConfigError(f"{where}.hmac_secret_file: {str(path)!r} is larger than {MAX_SECRET_BYTES} bytes")
    value = data.strip()
    if not value:
        raise ConfigError(f"{where}.hmac_secret_file: {str(path)!r} is empty")
    return Secret(value)

"""The `[alerts]` table and `[[receivers]]` records, validated when built (agent/config.py parses them)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

RECEIVER_KINDS = ("webhook", "slack", "alertmanager")
SEVERITY_ORDER = ("warning", "critical")
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# RFC 7230 token characters; a header name outside them could smuggle a second header.
_HEADER_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
# Headers we set ourselves; a configured one with these names would forge or break them.
RESERVED_HEADERS = frozenset({"content-type", "content-length", "host", "idempotency-key",
                              "x-infersight-timestamp", "x-infersight-signature"})
# Field metadata for values that may carry a token (URLs, headers, where a secret lives): a type error in one
# names only the value's type (agent/config.py), and checks here never quote them whole.
SENSITIVE = MappingProxyType({"sensitive": True})


class AlertsFieldError(ValueError):
    """A record refused a value; `key` is relative to the record. agent/config.py prefixes the path."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


def _range(key: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise AlertsFieldError(key, f"must be within [{lo}, {hi}], got {value!r}")


@dataclass(frozen=True)
class AlertsConfig:
    """When notifications go out and how long delivery keeps trying."""

    group_wait_seconds: float = 10.0
    repeat_interval_seconds: float = 14400.0
    resolve: bool = True
    retry_max_age_seconds: float = 86400.0
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 300.0
    # Links in payloads point here (the status page as receivers can reach it); empty: the listen address.
    external_url: str = field(default="", metadata=SENSITIVE)
    host: str = ""

    def __post_init__(self) -> None:
        _range("group_wait_seconds", self.group_wait_seconds, 0, 3600)
        _range("repeat_interval_seconds", self.repeat_interval_seconds, 60, 30 * 86400)
        _range("retry_max_age_seconds", self.retry_max_age_seconds, 1, 30 * 86400)
        _range("backoff_initial_seconds", self.backoff_initial_seconds, 0.01, 3600)
        _range("backoff_max_seconds", self.backoff_max_seconds, self.backoff_initial_seconds, 86400)
        if self.external_url:
            _check_url("external_url", self.external_url, "must be an http:// or https:// URL")


@dataclass(frozen=True)
class ReceiverConfig:
    """One destination. The secret itself is never held here: only where to read it."""

    name: str
    url: str = field(metadata=SENSITIVE)
    kind: str = "webhook"
    timeout_seconds: float = 5.0
    min_severity: str = "warning"
    targets: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict, metadata=SENSITIVE)
    hmac_secret_file: Path | None = field(default=None, metadata=SENSITIVE)
    hmac_secret_env: str | None = field(default=None, metadata=SENSITIVE)
    max_body_bytes: int = 262144

    def __post_init__(self) -> None:
        if not _NAME_RE.fullmatch(self.name):
            raise AlertsFieldError("name", f"must be 1-64 of A-Z a-z 0-9 _ . -, got {self.name!r}")
        if self.kind not in RECEIVER_KINDS:
            raise AlertsFieldError("kind", f"must be one of {', '.join(RECEIVER_KINDS)}, got {self.kind!r}")
        _check_url("url", self.url, "must be an http:// or https:// URL with a host", keep_path=False)
        _range("timeout_seconds", self.timeout_seconds, 0.1, 60)
        if self.min_severity not in SEVERITY_ORDER:
            raise AlertsFieldError("min_severity", f"must be one of {', '.join(SEVERITY_ORDER)}, "
                                                   f"got {self.min_severity!r}")
        for i, t in enumerate(self.targets):
            if not _NAME_RE.fullmatch(t):
                raise AlertsFieldError(f"targets[{i}]", f"must be a target name, got {t!r}")
        for k, v in self.headers.items():
            if not _HEADER_RE.fullmatch(k):
                raise AlertsFieldError("headers", f"has an invalid header name {k!r}")
            if k.lower() in RESERVED_HEADERS:
                raise AlertsFieldError("headers", f"must not set {k!r}: infersight sets it")
            if not isinstance(v, str) or any(c in v for c in "\r\n\0"):
                raise AlertsFieldError(f"headers.{k}", "must be a one-line string")
        if self.hmac_secret_file is not None and self.hmac_secret_env is not None:
            raise AlertsFieldError("", "set at most one of hmac_secret_file, hmac_secret_env")
        if self.hmac_secret_env is not None and not _ENV_RE.fullmatch(self.hmac_secret_env):
            # Not quoted: what is here instead of a name is most likely the secret itself.
            raise AlertsFieldError("hmac_secret_env", "must be the name of an environment variable (letters, "
                                                      "digits, _), not the secret itself")
        _range("max_body_bytes", self.max_body_bytes, 4096, 16 << 20)

    @property
    def signed(self) -> bool:
        return self.hmac_secret_file is not None or self.hmac_secret_env is not None

    def wants(self, severity: str, target: str) -> bool:
        """Whether an alert of this severity on this target goes to this receiver."""
        if SEVERITY_ORDER.index(severity) < SEVERITY_ORDER.index(self.min_severity):
            return False
        return not self.targets or target in self.targets or target.split("#")[0] in self.targets

    @property
    def safe_url(self) -> str:
        """The URL without userinfo or query (where tokens live), for logs, the page and errors; a Slack
        incoming-webhook URL carries its token in the path, so that goes too."""
        return redact_url(self.url, keep_path=self.kind != "slack")


def _check_url(key: str, url: str, wanted: str, keep_path: bool = True) -> None:
    # urlsplit accepts a bad port and only `.port` raises; caught here, it would otherwise surface as a
    # traceback from the first code that connects to or shows the URL.
    try:
        parts = urlsplit(url)
    except ValueError:
        raise AlertsFieldError(key, f"{wanted}, got an unparseable URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AlertsFieldError(key, f"{wanted}, got {redact_url(url, keep_path=keep_path)!r}")
    try:
        port_ok = parts.port != 0
    except ValueError:
        port_ok = False
    if not port_ok:
        # The port text is not echoed: a URL missing its "@" puts a password where the port goes.
        raise AlertsFieldError(key, "has an invalid port (must be a number within [1, 65535])")


def redact_url(url: str, keep_path: bool = True) -> str:
    """The URL without userinfo or query, for logs, the page and errors. Never raises: it also shows URLs that
    did not pass the config check."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable URL)"
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or ""
    if port:
        host = f"{host}:{port}"
    path = parts.path if keep_path else ("/…" if parts.path not in ("", "/") else "")
    return f"{parts.scheme}://{host}{path}" + ("?…" if parts.query else "")


def check_receivers(receivers: tuple[ReceiverConfig, ...]) -> None:
    seen: set[str] = set()
    for i, r in enumerate(receivers):
        if r.name in seen:
            raise AlertsFieldError(f"receivers[{i}].name", f"duplicates another receiver's name, got {r.name!r}")
        seen.add(r.name)

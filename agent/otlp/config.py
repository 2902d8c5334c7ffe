"""The `[otlp]` table (agent/config.py parses it) and how it combines with the standard OTEL_* variables."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import unquote, urlsplit

from agent.alerts.config import SENSITIVE, redact_url

PROTOCOLS = ("http/protobuf",)
DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
DEFAULT_TIMEOUT_SECONDS = 10.0
# RFC 7230 token characters; a header name outside them could smuggle a second header.
_HEADER_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
# Set by the exporter itself: a configured one would break the request.
RESERVED_HEADERS = frozenset({"content-type", "content-length", "host", "idempotency-key"})
_ATTR_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,127}")


class OtlpFieldError(ValueError):
    """A value the [otlp] table refused; `key` is relative to the table. agent/config.py prefixes `otlp.`."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


def check_headers(headers: Mapping[str, str], key: str = "headers") -> None:
    """HTTP/1.1 sends header values as Latin-1 bytes, and OTLP receivers expect ASCII (tokens, API keys): anything
    else is refused here, at load, instead of failing every export later. Values are never quoted: they are
    credentials."""
    for k, v in headers.items():
        if not _HEADER_RE.fullmatch(k):
            raise OtlpFieldError(key, f"has an invalid header name {k!r}")
        if k.lower() in RESERVED_HEADERS:
            raise OtlpFieldError(key, f"must not set {k!r}: infersight sets it")
        if not isinstance(v, str) or any(c in v for c in "\r\n\0"):
            raise OtlpFieldError(f"{key}.{k}", "must be a one-line string")
        bad = next((i for i, c in enumerate(v) if not " " <= c <= "~"), None)
        if bad is not None:
            raise OtlpFieldError(f"{key}.{k}", f"must be printable ASCII; character {bad + 1} is not "
                                               "(the value is not shown: it may be a credential)")


@dataclass(frozen=True)
class OtlpConfig:
    """Export of windows, detector state and regressions to an OpenTelemetry Collector (docs/otlp.md). Present in
    the config file = on; every key left out falls back to its OTEL_EXPORTER_OTLP_* variable, then the default."""

    # The Collector's OTLP/HTTP base URL; /v1/metrics and /v1/logs are appended.
    endpoint: str = field(default="", metadata=SENSITIVE)
    protocol: str = ""
    headers: dict[str, str] = field(default_factory=dict, metadata=SENSITIVE)
    timeout_seconds: float = 0.0
    # 0: one export per collection window (the agent's interval_seconds).
    export_interval_seconds: float = 0.0
    resource: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.endpoint:
            check_endpoint("endpoint", self.endpoint)
        if self.protocol and self.protocol not in PROTOCOLS:
            raise OtlpFieldError("protocol", f"must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r} "
                                             "(gRPC is not supported: it needs a second HTTP stack)")
        check_headers(self.headers)
        if self.timeout_seconds and not 0.1 <= self.timeout_seconds <= 60:
            raise OtlpFieldError("timeout_seconds", f"must be within [0.1, 60], got {self.timeout_seconds!r}")
        if self.export_interval_seconds and not 1 <= self.export_interval_seconds <= 3600:
            raise OtlpFieldError("export_interval_seconds",
                                 f"must be 0 (every window) or within [1, 3600], got {self.export_interval_seconds!r}")
        for k, v in self.resource.items():
            if not _ATTR_RE.fullmatch(k):
                raise OtlpFieldError("resource", f"has an invalid attribute name {k!r}")
            if not isinstance(v, str) or len(v) > 256:
                raise OtlpFieldError(f"resource.{k}", "must be a string of at most 256 characters")


def check_endpoint(key: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        port_ok = parts.port != 0
    except ValueError:
        raise OtlpFieldError(key, "must be an http:// or https:// URL with a host, got an unparseable URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OtlpFieldError(key, f"must be an http:// or https:// URL with a host, got {redact_url(url)!r}")
    if not port_ok:
        raise OtlpFieldError(key, "has an invalid port (must be a number within [1, 65535])")


@dataclass(frozen=True)
class OtlpSettings:
    """The [otlp] table with the environment filled in: what the exporter uses."""

    endpoint: str = field(metadata=SENSITIVE)
    headers: Mapping[str, str] = field(metadata=SENSITIVE)
    timeout_seconds: float
    export_interval_seconds: float
    resource: Mapping[str, str]

    @property
    def safe_endpoint(self) -> str:
        return redact_url(self.endpoint)

    def url(self, signal: str) -> str:
        return f"{self.endpoint.rstrip('/')}/v1/{signal}"


def parse_env_pairs(text: str, variable: str) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_HEADERS and OTEL_RESOURCE_ATTRIBUTES: comma-separated key=value pairs, values
    percent-encoded (the OTel spec)."""
    out: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep:
            raise OtlpFieldError(variable, "must be comma-separated key=value pairs")
        out[name.strip()] = unquote(value.strip())
    return out


def settings(config: OtlpConfig, *, interval_seconds: float, environ: Mapping[str, str] | None = None,
             host: str | None = None) -> OtlpSettings:
    """Config first, then OTEL_EXPORTER_OTLP_ENDPOINT / _HEADERS (per header name) / _TIMEOUT (milliseconds, as
    the spec says) / _PROTOCOL, OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, then the defaults. An environment
    value that is wrong is refused like a config value (OtlpFieldError naming the variable)."""
    env = os.environ if environ is None else environ
    endpoint = config.endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "") or DEFAULT_ENDPOINT
    if not config.endpoint:
        check_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    protocol = config.protocol or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "") or "http/protobuf"
    if protocol not in PROTOCOLS:
        raise OtlpFieldError("OTEL_EXPORTER_OTLP_PROTOCOL", f"must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    env_headers = parse_env_pairs(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""), "OTEL_EXPORTER_OTLP_HEADERS")
    check_headers(env_headers, "OTEL_EXPORTER_OTLP_HEADERS")
    lower = {k.lower() for k in config.headers}
    headers = {**{k: v for k, v in env_headers.items() if k.lower() not in lower}, **config.headers}
    timeout = config.timeout_seconds
    if not timeout and env.get("OTEL_EXPORTER_OTLP_TIMEOUT"):
        try:
            timeout = float(env["OTEL_EXPORTER_OTLP_TIMEOUT"]) / 1000.0
        except ValueError:
            raise OtlpFieldError("OTEL_EXPORTER_OTLP_TIMEOUT", "must be a number of milliseconds") from None
        if not 0.1 <= timeout <= 60:
            raise OtlpFieldError("OTEL_EXPORTER_OTLP_TIMEOUT", "must be within [100, 60000] milliseconds")
    resource = {"service.name": "infersight", "host.name": host or socket.gethostname()}
    resource.update(parse_env_pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES"))
    if env.get("OTEL_SERVICE_NAME"):
        resource["service.name"] = env["OTEL_SERVICE_NAME"]
    resource.update(config.resource)
    return OtlpSettings(endpoint=endpoint, headers=MappingProxyType(headers),
                        timeout_seconds=timeout or DEFAULT_TIMEOUT_SECONDS,
                        export_interval_seconds=config.export_interval_seconds or interval_seconds,
                        resource=MappingProxyType(resource))

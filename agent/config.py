"""The agent's configuration: TOML with a default for every key, checked for unknown keys, converted by msgspec and
validated at load (its paths by agent.trust)."""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import pwd
import re
import stat as stat_mod
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from agent.alerts.config import SENSITIVE, AlertsConfig, AlertsFieldError, ReceiverConfig, check_receivers
from agent.burst import DEFAULT_MAX_SECONDS as DEFAULT_BURST_MAX_SECONDS
from agent.burst import DEFAULT_RISE_MIN_WINDOWS as DEFAULT_BURST_RISE_WINDOWS
from agent.errors import ConfigError
from agent.otlp.config import OtlpConfig, OtlpFieldError
from agent.presets import LATENCY_KINDS, PRESETS, LatencyKind
from agent.sources.pyspy import (
    DEFAULT_BURST_HOLD_SEGMENTS,
    DEFAULT_BURST_RATE_HZ,
    DEFAULT_RATE_HZ,
    DEFAULT_SEGMENT_SECONDS,
    DEFAULT_STEADY_SEGMENT_SECONDS,
)
from agent.sources.scrape import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_SERIES
from agent.trust import StatFn, UntrustedPath, check_trusted_path, open_trusted
from analysis.redact import redact_url

DEFAULT_STORE_DIR = Path("/var/lib/infersight")
# The bundled workload's command line is `python -m workload serve ...`.
DEFAULT_TARGET_REGEX = r"-m\s+workload\s+serve\b"
LOG_LEVELS = ("debug", "info", "warning", "error")
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class FieldError(ConfigError):
    """A record refused a value; `key` is relative to the record ("" for the record itself)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


def _require_range(key: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise FieldError(key, f"must be within [{lo}, {hi}], got {value!r}")


def _require_choice(key: str, value: str, choices: typing.Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise FieldError(key, f"must be one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True)
class ProbesConfig:
    """Which BPF probes the agent loads; a disabled one is not loaded: no health entry, no error, its Window field null."""

    syscalls: bool = True
    offcpu: bool = True
    gc: bool = True
    tcp: bool = True
    runqueue: bool = True
    # Reply delivery time to the clients (docs/delivery.md).
    delivery: bool = True
    # Not a Window field: how a target's process ended (signal and sender, exit status), for its `down` episode.
    exits: bool = True

    def enabled(self) -> list[str]:
        """The probes that fill Window fields (every key but `exits`)."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) and f.name != "exits"]


@dataclass(frozen=True)
class StacksConfig:
    """Python stack sampling with py-spy: the `stacks` Window field (docs/config.md says what each knob costs)."""

    enabled: bool = True
    # ~0.13-0.4% of a core per Hz on a 35-thread server: a low steady rate, and bursts at full rate while
    # the detector sees a regression.
    rate_hz: int = DEFAULT_RATE_HZ
    burst_rate_hz: int = DEFAULT_BURST_RATE_HZ
    burst_hold_segments: int = DEFAULT_BURST_HOLD_SEGMENTS
    # One burst asks for the full rate this long at most (agent.burst): a flame graph's worth of samples, not an
    # episode's minutes.
    burst_max_seconds: float = DEFAULT_BURST_MAX_SECONDS
    # A rise that has opened no episode yet bursts this many windows at least, then while its score stays at the
    # trigger's level, and leaves no hold behind (agent.burst): healthy traffic's false highs pay ~2 windows, not ~4.
    burst_rise_windows: int = DEFAULT_BURST_RISE_WINDOWS
    segment_seconds: int = DEFAULT_SEGMENT_SECONDS
    # Steady recordings span several windows: one attach per 15 s instead of per 5 s (docs/BENCHMARKS.md).
    steady_segment_seconds: int = DEFAULT_STEADY_SEGMENT_SECONDS
    nonblocking: bool = True

    def __post_init__(self) -> None:
        _require_range("rate_hz", self.rate_hz, 1, 1000)
        _require_range("burst_rate_hz", self.burst_rate_hz, 1, 1000)
        _require_range("burst_hold_segments", self.burst_hold_segments, 0, 1000)
        _require_range("burst_max_seconds", self.burst_max_seconds, 5, 86_400)
        _require_range("burst_rise_windows", self.burst_rise_windows, 1, 1000)
        _require_range("segment_seconds", self.segment_seconds, 1, 60)
        _require_range("steady_segment_seconds", self.steady_segment_seconds, 1, 60)


@dataclass(frozen=True)
class DetectorConfig:
    """The latency-regression detector (docs/detector.md explains each knob)."""

    enabled: bool = True
    # Windows learned before the detector judges; at the default 5 s interval, 2 minutes.
    warmup_windows: int = 24

    def __post_init__(self) -> None:
        _require_range("warmup_windows", self.warmup_windows, 8, 100_000)


# Environment variables whose values a target's identity shows (docs/changes.md); every other value is never kept.
DEFAULT_ENV_ALLOWLIST = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED", "VLLM_*")
_ENV_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")


@dataclass(frozen=True)
class IdentityConfig:
    """A target's identity (what it runs) and its changes (docs/changes.md)."""

    enabled: bool = True
    # Exact names, or a prefix ending in `*`.
    env_allowlist: tuple[str, ...] = DEFAULT_ENV_ALLOWLIST
    # Distributions and model files are read again every this many windows (the rest only when the process changes).
    refresh_windows: int = 12
    # A new process's identity is compared with the last one after this many windows: what it loads at start counts.
    settle_windows: int = 3

    def __post_init__(self) -> None:
        for i, pattern in enumerate(self.env_allowlist):
            if not _ENV_PATTERN.fullmatch(pattern):
                raise FieldError(f"env_allowlist[{i}]",
                                 f"must be a variable name or a NAME_* prefix, got {pattern[:64]!r}")
        _require_range("refresh_windows", self.refresh_windows, 1, 10_000)
        _require_range("settle_windows", self.settle_windows, 1, 1_000)


@dataclass(frozen=True)
class LatencySpec:
    """Where a target's request latency comes from: a Prometheus endpoint and one metric family."""

    url: str
    metric: str
    preset: str | None = None
    kind: LatencyKind = "histogram"
    unit_seconds: float = 1.0
    count_metric: str | None = None
    # The whole scrape's deadline (connect, headers, body, parse), and what one answer may hold: Prometheus's
    # scrape_timeout, body_size_limit and sample_limit (docs/config.md gives the reasons for the defaults).
    timeout_seconds: float = 2.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_series: int = DEFAULT_MAX_SERIES

    def __post_init__(self) -> None:
        try:
            parts = urlsplit(self.url)
            _ = parts.port  # raises on a port that is not a number in range
        except ValueError:
            raise FieldError("url", f"is not a valid URL (bad host or port), got {redact_url(self.url)!r}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            # Redacted: a scrape URL may carry user:password, and config errors go to logs and terminals.
            raise FieldError("url", f"must be an http:// or https:// URL with a host, got {redact_url(self.url)!r}")
        if not self.metric.strip():
            raise FieldError("metric", f"must be a metric name, got {self.metric!r}")
        if self.preset is not None:
            _require_choice("preset", self.preset, sorted(PRESETS))
        _require_choice("kind", self.kind, LATENCY_KINDS)
        if not self.unit_seconds > 0:
            raise FieldError("unit_seconds", f"must be > 0, got {self.unit_seconds!r}")
        if self.kind == "counter" and not self.count_metric:
            raise FieldError("count_metric", f"is required when kind is 'counter', got {self.count_metric!r}")
        _require_range("timeout_seconds", self.timeout_seconds, 0.1, 60)
        _require_range("max_body_bytes", self.max_body_bytes, 64 << 10, 1 << 30)
        _require_range("max_series", self.max_series, 100, 1_000_000)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> LatencySpec:
        if name not in PRESETS:
            raise FieldError("preset", f"must be one of {', '.join(sorted(PRESETS))}, got {name!r}")
        p = PRESETS[name]
        base: dict[str, Any] = {"url": p.url, "metric": p.metric, "preset": name, "kind": p.kind,
                                "unit_seconds": p.unit_seconds, "count_metric": p.count_metric}
        return cls(**{**base, **overrides})


# The selectors of a target: exactly one per [[targets]] table (docs/config.md, "Families").
SELECTORS = ("pid", "pidfile", "process_regex", "systemd_unit", "cgroup", "container", "port")
# Selectors whose family is a cgroup: every process in it, whatever their parentage.
CGROUP_SELECTORS = ("systemd_unit", "cgroup", "container")
DEFAULT_MAX_PROCESSES = 64
MAX_PROCESSES_LIMIT = 4096
# systemd's unit name characters (systemd.unit(5)); a name without a unit type is a service, as systemctl reads it.
_UNIT_RE = re.compile(r"[A-Za-z0-9:_.@\\-]{1,255}")
_PROCESS_UNIT_TYPES = (".service", ".scope", ".slice")
_CONTAINER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class TargetSpec:
    """How to find one watched server: exactly one selector of SELECTORS; with `children` (the default for
    systemd_unit, cgroup, container and port) the target is the selected process's whole family."""

    name: str
    pid: int | None = None
    pidfile: Path | None = None
    # re.search()ed against the process name (comm) and against the full command line joined by spaces.
    process_regex: str | None = None
    systemd_unit: str | None = None
    # A directory of the cgroup v2 hierarchy: a path under its mount, or one relative to its root.
    cgroup: str | None = None
    # A container id prefix (Docker, containerd, CRI-O, Podman) or a name prefix where the runtime puts the
    # name in the cgroup path (systemd-nspawn, LXC).
    container: str | None = None
    port: int | None = None
    # None: the selector's default (off for pid, pidfile and process_regex, so an old config watches what it did).
    children: bool | None = None
    max_processes: int = DEFAULT_MAX_PROCESSES
    latency: LatencySpec | None = None
    pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not _NAME_RE.fullmatch(self.name):
            raise FieldError("name", f"must be 1-64 of A-Z a-z 0-9 _ . -, got {self.name!r}")
        chosen = [k for k in SELECTORS if getattr(self, k) is not None]
        if len(chosen) != 1:
            got = " and ".join(chosen) if chosen else "none"
            raise FieldError("", f"set exactly one of {', '.join(SELECTORS)} (got {got})")
        if self.pid is not None and not 1 <= self.pid <= 2**22:
            raise FieldError("pid", f"must be within [1, {2**22}], got {self.pid!r}")
        if self.process_regex is not None:
            try:
                object.__setattr__(self, "pattern", re.compile(self.process_regex))
            except re.error as exc:
                raise FieldError("process_regex", f"is not a valid regular expression ({exc}), "
                                                  f"got {self.process_regex!r}") from None
        if self.systemd_unit is not None and not _UNIT_RE.fullmatch(self.systemd_unit):
            raise FieldError("systemd_unit", f"must be a systemd unit name such as 'vllm.service' (1-255 of "
                                             f"A-Z a-z 0-9 : _ . @ \\ -), got {self.systemd_unit!r}")
        if self.cgroup is not None:
            parts = self.cgroup.split("/")
            if not self.cgroup.strip("/"):
                raise FieldError("cgroup", f"names the root cgroup, which holds every process of the host; name "
                                           f"a cgroup below it, got {self.cgroup!r}")
            if "\0" in self.cgroup or ".." in parts or len(self.cgroup) > 4096:
                raise FieldError("cgroup", f"must be a cgroup directory: a path under the cgroup v2 mount or one "
                                           f"relative to its root, without '..', got {self.cgroup!r}")
        if self.container is not None and not _CONTAINER_RE.fullmatch(self.container):
            raise FieldError("container", f"must be a container id or name prefix (1-128 of A-Z a-z 0-9 _ . -, "
                                          f"not starting with . _ -), got {self.container!r}")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise FieldError("port", f"must be within [1, 65535], got {self.port!r}")
        if self.children is False and chosen[0] in CGROUP_SELECTORS:
            raise FieldError("children", f"cannot be false with {chosen[0]}: its family is every process of "
                                         f"the cgroup, whoever their parent")
        _require_range("max_processes", self.max_processes, 1, MAX_PROCESSES_LIMIT)

    @property
    def selector(self) -> str:
        """The one key of SELECTORS this spec sets."""
        return next(k for k in SELECTORS if getattr(self, k) is not None)

    @property
    def family(self) -> bool:
        """Whether the target is a family of processes (Target.members filled) rather than one process."""
        if self.selector in CGROUP_SELECTORS:
            return True
        return self.children if self.children is not None else self.selector == "port"

    @property
    def unit_name(self) -> str | None:
        """systemd_unit with its type: 'vllm' is 'vllm.service', as systemctl reads it."""
        if self.systemd_unit is None:
            return None
        return self.systemd_unit if self.systemd_unit.endswith(_PROCESS_UNIT_TYPES) else f"{self.systemd_unit}.service"


def default_targets() -> tuple[TargetSpec, ...]:
    return (TargetSpec(name="workload", process_regex=DEFAULT_TARGET_REGEX,
                       latency=LatencySpec.from_preset("workload")),)


@dataclass(frozen=True)
class Config:
    interval_seconds: float = 5.0
    store_dir: Path = DEFAULT_STORE_DIR
    retention_days: float = 14.0
    retention_bytes: int = 1 << 30
    listen: str = "127.0.0.1:9464"
    log_level: str = "info"
    # Besides root: whose processes a target may select. Another user's process is never traced by
    # default, or any local user could make the root agent run py-spy on whatever it starts.
    allowed_users: tuple[str, ...] = ()
    max_targets: int = 16
    probes: ProbesConfig = field(default_factory=ProbesConfig)
    stacks: StacksConfig = field(default_factory=StacksConfig)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    targets: tuple[TargetSpec, ...] = field(default_factory=default_targets)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    receivers: tuple[ReceiverConfig, ...] = field(default=(), metadata=SENSITIVE)
    # OTLP export (docs/otlp.md): off unless the table is there.
    otlp: OtlpConfig | None = None
    identity: IdentityConfig = field(default_factory=IdentityConfig)

    def __post_init__(self) -> None:
        _require_range("interval_seconds", self.interval_seconds, 1, 60)
        _require_range("retention_days", self.retention_days, 0.01, 3650)
        _require_range("retention_bytes", self.retention_bytes, 1 << 20, 1 << 40)
        _require_choice("log_level", self.log_level, LOG_LEVELS)
        parse_listen(self.listen)
        _require_range("max_targets", self.max_targets, 1, 1024)
        for i, user in enumerate(self.allowed_users):
            try:
                pwd.getpwnam(user)
            except KeyError:
                raise FieldError(f"allowed_users[{i}]", f"no such user on this host, got {user!r}") from None
        if not self.targets:
            raise FieldError("targets", "must name at least one target, got []")
        seen: set[str] = set()
        for i, t in enumerate(self.targets):
            if t.name in seen:
                raise FieldError(f"targets[{i}].name", f"duplicates another target's name, got {t.name!r}")
            seen.add(t.name)
        check_receivers(self.receivers)

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    @property
    def allowed_uids(self) -> frozenset[int]:
        """root, and the users in allowed_users (resolved now: a user renamed later is not matched)."""
        return frozenset({0, *(pwd.getpwnam(u).pw_uid for u in self.allowed_users)})

    @property
    def retention_seconds(self) -> float:
        return self.retention_days * 86400.0


def parse_listen(value: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port)."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^:\[\]\s]+):(\d{1,5})", value)
    if not m:
        raise FieldError("listen", f"must be host:port or [ipv6]:port, got {value!r}")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if m.group(1):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise FieldError("listen", f"has an invalid IPv6 address, got {value!r}") from None
    if not 1 <= int(port) <= 65535:
        raise FieldError("listen", f"port must be within [1, 65535], got {value!r}")
    return host, int(port)


# ---- loading ---------------------------------------------------------------------------------------------

# Keys that were renamed: the old name stops the agent with the new one, rather than a guess.
_RENAMED = {f"pyspy_{key}": f"stacks.{key}" for key in ("enabled", "rate_hz", "burst_rate_hz",
                                                          "burst_hold_segments", "segment_seconds", "nonblocking")}

_TYPE_WORDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", Path: "a path string"}


def _toml_type(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)


def _got(value: Any, sensitive: bool) -> str:
    """The wrong value as an error shows it: quoted only when it is a scalar in a field that holds no tokens.
    An array or table is never quoted; it can hold anything, a receiver's URL and headers included."""
    kind = _toml_type(value)
    if sensitive or isinstance(value, (list, dict)):
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    return f"{value!r} ({kind})"


def _checked_keys(cls: type, table: dict[str, Any], prefix: str) -> dict[str, Any]:
    """`table` with its preset filled in, after refusing unknown, renamed and missing keys, here and in every
    table below it; the values' types are msgspec's to check (_decode)."""
    if cls is LatencySpec and "preset" in table:
        name = table["preset"]
        if not isinstance(name, str) or name not in PRESETS:
            raise ConfigError(f"{prefix}preset: must be one of {', '.join(sorted(PRESETS))}, got {name!r}")
        p = PRESETS[name]
        table = {"url": p.url, "metric": p.metric, "kind": p.kind, "unit_seconds": p.unit_seconds,
                 **({"count_metric": p.count_metric} if p.count_metric else {}), **table}
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in table if k not in fields]
    if renamed := next((k for k in unknown if f"{prefix}{k}" in _RENAMED), None):
        new = _RENAMED[f"{prefix}{renamed}"]
        table_name, _, key = new.rpartition(".")
        raise ConfigError(f"{prefix}{renamed}: renamed to {new} (the {key} key of a [{table_name}] table)")
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(fields)})"
        raise ConfigError(f"unknown key {prefix}{unknown[0]}{hint}")
    out = dict(table)
    for name, f in fields.items():
        if name in table:
            out[name] = _checked_below(table[name], hints[name], f"{prefix}{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{prefix}{name}: missing (required)")
    return out


def _checked_below(value: Any, hint: Any, key: str) -> Any:
    hint = _optional_of(hint)
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return _checked_keys(hint, value, f"{key}.")
    if typing.get_origin(hint) is tuple and isinstance(value, list):
        item = typing.get_args(hint)[0]
        if dataclasses.is_dataclass(item):
            return [_checked_keys(item, v, f"{key}[{i}].") if isinstance(v, dict) else v
                    for i, v in enumerate(value)]
    return value


def _optional_of(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


class _NotAPath(TypeError):
    pass


def _path_hook(tp: type, value: Any) -> Any:
    if tp is Path and isinstance(value, str):
        return Path(value)
    raise _NotAPath


def _decode(data: dict[str, Any]) -> Config:
    """The checked tables converted by msgspec (TOML ints widen to float fields, nothing else is coerced); its
    errors are reworded as one line naming the key and the value, never a sensitive value."""
    table = _checked_keys(Config, data, "")
    try:
        return msgspec.convert(table, Config, dec_hook=_path_hook)
    except msgspec.ValidationError as exc:
        cause = exc.__cause__
        if cause is not None and not isinstance(cause, (FieldError, AlertsFieldError, OtlpFieldError, _NotAPath)):
            raise cause from None  # a record's own bug, not the config's: shown as it is
        _, sep, at = str(exc).rpartition(" - at `")
        steps = re.findall(r"\.([^.\[`]+)|\[(\d+|\.\.\.)\]", at) if sep else []
        if isinstance(cause, (FieldError, AlertsFieldError, OtlpFieldError)):
            where = ".".join(k for k in (_key_of(steps), cause.key) if k)
            raise ConfigError(f"{where}: {cause.problem}" if where else cause.problem) from None
        raise ConfigError(_wrong_type(table, steps)) from None


def _key_of(steps: list[tuple[str, str]]) -> str:
    return "".join(f".{name}" if name else f"[{index}]" for name, index in steps).lstrip(".")


def _wrong_type(table: dict[str, Any], steps: list[tuple[str, str]]) -> str:
    """The message for a value msgspec refused: follow its path through the field hints and the table."""
    hint: Any = Config
    value: Any = table
    key, sensitive = "", False
    for name, index in steps:
        hint = _optional_of(hint)
        if name:
            sensitive = bool(next(f for f in dataclasses.fields(hint) if f.name == name).metadata.get("sensitive"))
            hint, value, key = typing.get_type_hints(hint)[name], value[name], f"{key}.{name}".lstrip(".")
        elif index == "...":  # a table's value; msgspec does not say under which key
            value_hint = typing.get_args(hint)[1]
            bad = next(k for k, v in value.items() if not _fits(v, value_hint))
            hint, value, key = value_hint, value[bad], f"{key}.{bad}"
        else:
            hint, value, key = typing.get_args(hint)[0], value[int(index)], f"{key}[{index}]"
    hint = _optional_of(hint)
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        if isinstance(value, str):
            return f"{key}: must be one of {', '.join(typing.get_args(hint))}, got {value!r}"
        hint = str
    if origin is tuple:
        items = "tables" if dataclasses.is_dataclass(typing.get_args(hint)[0]) else "strings"
        return f"{key}: expected an array of {items}, got {_got(value, sensitive)}"
    if origin is dict or dataclasses.is_dataclass(hint):
        return f"{key}: expected a table, got {_got(value, sensitive)}"
    return f"{key}: expected {_TYPE_WORDS[hint]}, got {_got(value, sensitive)}"


def _fits(value: Any, hint: Any) -> bool:
    try:
        msgspec.convert(value, hint, dec_hook=_path_hook)
    except msgspec.ValidationError:
        return False
    return True


def config_from_dict(data: dict[str, Any], base_dir: Path | None = None) -> Config:
    """Validate a parsed TOML document; relative paths resolve against base_dir (the config file's folder)."""
    config = _decode(data)
    if base_dir is None:
        return config
    targets = tuple(dataclasses.replace(t, pidfile=base_dir / t.pidfile)
                    if t.pidfile is not None and not t.pidfile.is_absolute() else t for t in config.targets)
    receivers = tuple(dataclasses.replace(r, hmac_secret_file=base_dir / r.hmac_secret_file)
                      if r.hmac_secret_file is not None and not r.hmac_secret_file.is_absolute() else r
                      for r in config.receivers)
    return dataclasses.replace(config, store_dir=base_dir / config.store_dir, targets=targets, receivers=receivers)


def load_config(path: Path | None, *, stat: StatFn = os.lstat, readlink: Callable[[str], str] = os.readlink,
                trusted_uids: frozenset[int] | None = None) -> Config:
    """Defaults when path is None; otherwise the checked, parsed and validated file."""
    if path is None:
        return Config()
    try:
        fd = open_trusted(path, what="config file", stat=stat, readlink=readlink, trusted_uids=trusted_uids)
        with open(fd, "rb") as fh:
            data = tomllib.load(fh)
            mode = os.fstat(fd).st_mode
    except UntrustedPath:
        raise
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        config = config_from_dict(data, base_dir=Path(os.path.abspath(path)).parent)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    _refuse_readable_credentials(path, config, mode)
    return config


def credential_keys(config: Config) -> list[str]:
    """The keys of this config whose values carry a credential: a URL with user:password or a query (tokens
    travel there), a Slack webhook URL (the path is the token), and any receiver headers (Authorization)."""
    def carries(url: str) -> bool:
        parts = urlsplit(url)
        return bool(parts.username or parts.password or parts.query)

    keys = []
    for i, t in enumerate(config.targets):
        if t.latency is not None and carries(t.latency.url):
            keys.append(f"targets[{i}].latency.url")
    for i, r in enumerate(config.receivers):
        if r.kind == "slack" or carries(r.url):
            keys.append(f"receivers[{i}].url")
        if r.headers:
            keys.append(f"receivers[{i}].headers")
    if config.alerts.external_url and carries(config.alerts.external_url):
        keys.append("alerts.external_url")
    if config.otlp is not None:
        if config.otlp.endpoint and carries(config.otlp.endpoint):
            keys.append("otlp.endpoint")
        if config.otlp.headers:
            keys.append("otlp.headers")
    return keys


def _refuse_readable_credentials(path: Path, config: Config, mode: int) -> None:
    # The config is read by root, but any local user may read a 0644 file: a credential in it is a credential
    # given away (docs/security.md, "secrets travel in 0600 files"). A config without one may stay 0644.
    # `mode` is the file's as it was read, not the path's now.
    keys = credential_keys(config)
    if keys and mode & 0o044:
        raise ConfigError(f"{path}: {keys[0]}: holds a credential, but the file is readable by other users "
                          f"(mode {stat_mod.S_IMODE(mode):04o}); chmod 600 {path}")


# ---- the paths the config names: checked by agent.trust -------------------------------------------------------

def check_config_paths(config: Config, *, stat: StatFn = os.lstat, readlink: Callable[[str], str] = os.readlink,
                       trusted_uids: frozenset[int] | None = None) -> None:
    """Refuse at start a store directory or pidfile that another user could write (or create)."""
    check_trusted_path(config.store_dir, what="store directory", stat=stat, readlink=readlink,
                       trusted_uids=trusted_uids)
    for t in config.targets:
        if t.pidfile is not None:
            check_trusted_path(t.pidfile, what="pidfile", stat=stat, readlink=readlink, trusted_uids=trusted_uids)

"""Evaluation scenarios: the TOML schedule of load, faults and outside commands, parsed and checked."""

from __future__ import annotations

import re
import string
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from analysis.regression import CAUSE_LABELS

# The bundled workload's fault switches (workload.faults.FAULT_NAMES; analysis does not import workload).
FAULTS = ("gc", "lock", "syscall", "netloss", "cpuhog", "nocache", "io")
# The faults that start processes of their own beside the server (the cpuhog's spinners: its neighbours, not its
# children, workload/cpuhog.py): a phase may name them its culprits without a `run` command.
PROCESS_FAULTS = ("cpuhog",)
LABELS = ("normal", *CAUSE_LABELS)
PLACEHOLDERS = ("pid", "port", "seconds", "scenario_dir")

_TOP_KEYS = ("name", "interval_seconds", "load", "server", "phase")
_SERVER_KEYS = ("args", "children")
# The runner sets these itself: it reads the URL the server prints and hands it the admin token.
_RUNNER_FLAGS = ("--port", "--host", "--admin-token", "--admin-token-file", "--pidfile")
_LOAD_KEYS = ("rate", "max_tokens")
_PHASE_KEYS = ("seconds", "label", "fault", "rate", "run", "restart", "culprit")
_RESTART_KEYS = ("args", "env")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The runner sets these in the server's environment itself (the admin token, the tree the workload runs from).
_RUNNER_ENV = ("WORKLOAD_ADMIN_TOKEN", "PYTHONPATH", "PYTHONUNBUFFERED")


class ScenarioError(ValueError):
    """A scenario file that cannot run as written; the message names the key."""


@dataclass(frozen=True)
class Restart:
    """The server restarted as the phase begins, as a deploy does: on the same port, with `args` in place of the
    arguments it ran with (None: the same ones) and `env` added to the environment it started with."""

    args: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Phase:
    seconds: float
    label: str
    fault: str | None = None
    rate: float | None = None
    run: tuple[str, ...] | None = None
    restart: Restart | None = None
    # The phase's `run` command is the fault's culprit (a neighbour that allocates, writes, spins): its pid is
    # recorded beside each window of the phase, so scoring can check the cause names that process. Without a `run`,
    # the processes a PROCESS_FAULTS fault started (the cpuhog's spinners): their pids, any of them named counts.
    culprit: bool = False

    def argv(self, pid: int, port: int, scenario_dir: str) -> list[str]:
        """`run` with its placeholders filled in."""
        seconds = int(self.seconds) if float(self.seconds).is_integer() else self.seconds
        values = {"pid": pid, "port": port, "seconds": seconds, "scenario_dir": scenario_dir}
        return [arg.format_map(values) for arg in self.run or ()]


@dataclass(frozen=True)
class Scenario:
    name: str
    rate: float
    phases: tuple[Phase, ...]
    interval_seconds: float | None = None
    # As `python -m workload load --max-tokens` takes it: "32" or "16-48".
    max_tokens: str | None = None
    scenario_dir: str = "."
    # More arguments of `python -m workload serve`, e.g. ("--engine-process",).
    server_args: tuple[str, ...] = ()
    # Watch the server and every process it starts as one family target (docs/config.md "Families"): for a server
    # of several processes. Off by default: a fault's helper processes (the cpuhog's spinners are the server's
    # children) would otherwise count as the server's own work.
    server_children: bool = False

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def restarts(self) -> bool:
        """Some phase restarts the server: it then listens on a port chosen up front, the same for every process."""
        return any(p.restart is not None for p in self.phases)

    def rate_of(self, phase: Phase) -> float:
        return self.rate if phase.rate is None else phase.rate

    def bounds(self) -> list[tuple[float, float]]:
        """Each phase's [start, end) in seconds from the scenario's start."""
        out, t = [], 0.0
        for p in self.phases:
            out.append((t, t + p.seconds))
            t += p.seconds
        return out

    def phase_at(self, offset: float) -> int | None:
        """Index of the phase running `offset` seconds after the start; None outside the schedule."""
        for i, (start, end) in enumerate(self.bounds()):
            if start <= offset < end:
                return i
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        phases = tuple(Phase(seconds=p["seconds"], label=p["label"], fault=p.get("fault"), rate=p.get("rate"),
                             run=tuple(p["run"]) if p.get("run") is not None else None,
                             restart=_restart_of(p.get("restart")), culprit=bool(p.get("culprit", False)))
                       for p in data["phases"])
        return cls(name=data["name"], rate=data["rate"], phases=phases, interval_seconds=data.get("interval_seconds"),
                   max_tokens=data.get("max_tokens"), scenario_dir=data.get("scenario_dir", "."),
                   server_args=tuple(data.get("server_args", ())),
                   server_children=bool(data.get("server_children", False)))


def load_scenario(path: Path) -> Scenario:
    """Read and check one scenario file; ScenarioError (naming the file and key) on any problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return parse_scenario(text, scenario_dir=str(path.resolve().parent))
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def parse_scenario(text: str, scenario_dir: str = ".") -> Scenario:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"not valid TOML: {exc}") from None
    _no_unknown(data, _TOP_KEYS, "")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ScenarioError(f"name: must be a non-empty string, got {name!r}")
    interval = data.get("interval_seconds")
    if interval is not None:
        interval = _number("interval_seconds", interval, low=0.5, high=60.0)
    load = data.get("load")
    if not isinstance(load, dict):
        raise ScenarioError(f"load: must be a table with rate (requests per second), got {load!r}")
    _no_unknown(load, _LOAD_KEYS, "load.")
    if "rate" not in load:
        raise ScenarioError("load.rate: missing (Poisson arrivals per second, the default of every phase)")
    rate = _number("load.rate", load["rate"], low=0.01, high=1000.0)
    max_tokens = _max_tokens(load.get("max_tokens"))
    raw_phases = data.get("phase")
    if not isinstance(raw_phases, list) or not raw_phases:
        raise ScenarioError(f"phase: need at least one [[phase]] table, got {raw_phases!r}")
    phases = tuple(_phase(i, p) for i, p in enumerate(raw_phases))
    return Scenario(name=name.strip(), rate=rate, phases=phases, interval_seconds=interval, max_tokens=max_tokens,
                    scenario_dir=scenario_dir, server_args=_server_args(data.get("server", {})),
                    server_children=_server_children(data.get("server", {})))


def _server_args(server: Any) -> tuple[str, ...]:
    if not isinstance(server, dict):
        raise ScenarioError(f"server: must be a table (args = [...]), got {server!r}")
    _no_unknown(server, _SERVER_KEYS, "server.")
    args = server.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) and a for a in args):
        raise ScenarioError(f"server.args: must be a list of non-empty strings, got {args!r}")
    for arg in args:
        if arg.split("=", 1)[0] in _RUNNER_FLAGS:
            raise ScenarioError(f"server.args: {arg!r} is set by the scenario runner itself")
    return tuple(args)


def _server_children(server: dict) -> bool:
    children = server.get("children", False)
    if not isinstance(children, bool):
        raise ScenarioError(f"server.children: must be true or false, got {children!r}")
    return children


def _phase(i: int, raw: Any) -> Phase:
    where = f"phase[{i}]"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: must be a table, got {raw!r}")
    _no_unknown(raw, _PHASE_KEYS, f"{where}.")
    if "seconds" not in raw:
        raise ScenarioError(f"{where}.seconds: missing")
    seconds = _number(f"{where}.seconds", raw["seconds"], low=1.0, high=86400.0)
    label = raw.get("label")
    if label not in LABELS:
        raise ScenarioError(f"{where}.label: must be one of {', '.join(LABELS)}, got {label!r}")
    fault = raw.get("fault")
    if fault is not None and fault not in FAULTS:
        raise ScenarioError(f"{where}.fault: unknown fault {fault!r} (choose one of {', '.join(FAULTS)})")
    rate = raw.get("rate")
    if rate is not None:
        rate = _number(f"{where}.rate", rate, low=0.0, high=1000.0)
    run = raw.get("run")
    if run is not None:
        run = _argv(f"{where}.run", run)
    restart = raw.get("restart")
    if restart is not None:
        if fault is not None or run is not None:
            raise ScenarioError(f"{where}.restart: a phase that restarts the server cannot also set a fault or run a "
                                f"command (put them in the next phase)")
        restart = _restart(f"{where}.restart", restart)
    culprit = raw.get("culprit", False)
    if not isinstance(culprit, bool):
        raise ScenarioError(f"{where}.culprit: must be true or false, got {culprit!r}")
    if culprit and run is None and fault not in PROCESS_FAULTS:
        raise ScenarioError(f"{where}.culprit: names the phase's `run` command (or the processes of a fault that "
                            f"starts some: {', '.join(PROCESS_FAULTS)}) as the culprit, but the phase has neither")
    if culprit and run is not None and fault in PROCESS_FAULTS:
        raise ScenarioError(f"{where}.culprit: the phase both runs a command and starts the {fault} fault's "
                            f"processes; which is the culprit is ambiguous (split them into two phases)")
    return Phase(seconds=seconds, label=label, fault=fault, rate=rate, run=run, restart=restart, culprit=culprit)


def _restart(where: str, raw: Any) -> Restart:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: must be a table (args = [...], env = {{NAME = \"value\"}}), got {raw!r}")
    _no_unknown(raw, _RESTART_KEYS, f"{where}.")
    args = raw.get("args")
    if args is not None:
        if not isinstance(args, list) or not all(isinstance(a, str) and a for a in args):
            raise ScenarioError(f"{where}.args: must be a list of non-empty strings, got {args!r}")
        for arg in args:
            if arg.split("=", 1)[0] in _RUNNER_FLAGS:
                raise ScenarioError(f"{where}.args: {arg!r} is set by the scenario runner itself")
        args = tuple(args)
    env = raw.get("env", {})
    if not isinstance(env, dict):
        raise ScenarioError(f"{where}.env: must be a table of NAME = \"value\", got {env!r}")
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ScenarioError(f"{where}.env: {name!r} is not a variable name")
        if name in _RUNNER_ENV:
            raise ScenarioError(f"{where}.env: {name} is set by the scenario runner itself")
        if not isinstance(value, str) or "\0" in value:
            raise ScenarioError(f"{where}.env.{name}: must be a string without NUL, got {value!r}")
    return Restart(args=args, env=tuple(sorted(env.items())))


def _restart_of(data: Any) -> Restart | None:
    """A recording's restart (Scenario.to_dict's form), as it was parsed."""
    if data is None:
        return None
    args = data.get("args")
    return Restart(args=tuple(args) if args is not None else None, env=tuple((str(k), str(v)) for k, v in data["env"]))


def _argv(where: str, run: Any) -> tuple[str, ...]:
    if not isinstance(run, list) or not run or not all(isinstance(a, str) and a for a in run):
        raise ScenarioError(f"{where}: must be a non-empty list of non-empty strings, got {run!r}")
    for arg in run:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
        except ValueError as exc:
            raise ScenarioError(f"{where}: bad placeholder in {arg!r} ({exc})") from None
        if bad := [f for f in fields if f not in PLACEHOLDERS]:
            raise ScenarioError(f"{where}: unknown placeholder {{{bad[0]}}} in {arg!r} "
                                f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
    return tuple(run)


def _no_unknown(table: dict[str, Any], known: tuple[str, ...], prefix: str) -> None:
    for key in table:
        if key not in known:
            raise ScenarioError(f"{prefix}{key}: unknown key (known: {', '.join(known)})")


def _number(where: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where}: must be a number, got {value!r}")
    if not low <= value <= high:
        raise ScenarioError(f"{where}: must be within [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _max_tokens(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if isinstance(value, str):
        low, _, high = value.partition("-")
        if low.isdigit() and (not high or high.isdigit()) and 0 < int(low) <= int(high or low):
            return value
    raise ScenarioError(f"load.max_tokens: must be N or \"MIN-MAX\" with 0 < MIN <= MAX, got {value!r}")

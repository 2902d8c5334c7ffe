"""Every way a source can fail to measure a target gives that Window null + reason, never a zero reading."""

import struct
import subprocess
import time
from collections.abc import Iterable

import pytest

from agent.collectors import Collectors
from agent.config import Config, StacksConfig, TargetSpec
from agent.loop import CollectionLoop
from agent.state import AgentState
from agent.target_sources import source_factories
from agent.targets import Target
from analysis.health import Health
from analysis.window import GcReading, SyscallReading
from probes.pidfd import read_start_time
from tests.live import spawn_execd


def sleepers(n: int) -> list[subprocess.Popen]:
    return [spawn_execd(["sleep", "60"]) for _ in range(n)]


def stop(procs: Iterable[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def run_loop(procs: list[subprocess.Popen], probes: list[str], factories: dict | None = None, stacks: bool = False,
             settle: float = 0.5) -> list:
    specs = [TargetSpec(name=f"t{i}", pid=p.pid) for i, p in enumerate(procs)]
    config = Config(interval_seconds=1.0, targets=tuple(specs), stacks=StacksConfig(enabled=stacks))
    windows: list = []
    collectors = Collectors(probes, make_sources=lambda t: source_factories(t, config),
                            probe_factories=factories)
    loop = CollectionLoop(specs=specs, collectors=collectors, state=AgentState(), sink=windows.append, interval=1.0)
    try:
        loop.start()
        time.sleep(settle)
        loop.tick()
    finally:
        loop.close()
    return windows


@pytest.mark.bpf
def test_seventeenth_target_of_a_sixteen_slot_probe_has_no_reading(require_bpf):
    procs = sleepers(17)
    try:
        from probes.syscalls import SyscallsConfig, SyscallsProbe

        windows = run_loop(procs, ["syscalls"], {"syscalls": lambda: SyscallsProbe(SyscallsConfig(max_targets=16))})
    finally:
        stop(procs)
    assert len(windows) == 17
    measured = [w for w in windows if w.syscalls is not None]
    left_out = [w for w in windows if w.syscalls is None]
    assert len(measured) == 16 and len(left_out) == 1
    assert all("syscalls" not in w.errors for w in measured)
    assert "all 16 target slots of syscalls are in use" in left_out[0].errors["syscalls"]
    # The highest pid is the one left out (slots are handed out in pid order).
    assert left_out[0].pid == max(p.pid for p in procs)


class _Failing:
    """A probe that fails the way offcpu and gcpause used to escape: ValueError / RuntimeError, not ProbeError."""

    name = "gc"

    def __init__(self, on: str, exc: Exception) -> None:
        self._on, self._exc, self._targets = on, exc, set()

    def start(self, targets: Iterable[int]) -> None:
        self._targets = set(targets)

    def set_targets(self, targets: Iterable[int]) -> None:
        if self._on == "set_targets":
            raise self._exc
        self._targets = set(targets)

    def read(self) -> dict[int, GcReading]:
        if self._on == "read":
            raise self._exc
        return {t: GcReading(collections=3) for t in self._targets}

    def host(self) -> None:
        return None

    def stop(self) -> None:
        self._targets = set()

    def health(self) -> Health:
        return Health(name=self.name, state="running", targets=len(self._targets))


@pytest.mark.parametrize("exc", [ValueError("bad map value 7"), RuntimeError("probe is not running")])
def test_a_probe_raising_on_read_gives_no_reading_with_its_message(exc):
    procs = sleepers(2)
    try:
        windows = run_loop(procs, ["gc"], {"gc": lambda: _Failing("read", exc)}, settle=0.0)
    finally:
        stop(procs)
    assert len(windows) == 2
    for w in windows:
        assert w.gc is None
        assert str(exc) in w.errors["gc"]


def test_a_new_target_a_probe_could_not_take_has_no_reading():
    first, late = sleepers(2)
    specs = [TargetSpec(name="first", pid=first.pid)]
    found = [specs[0]]
    config = Config(interval_seconds=1.0, targets=tuple(specs), stacks=StacksConfig(enabled=False))
    windows: list = []
    from agent.targets import discover

    # The second process appears after start(); the probe then fails to take it with a ValueError.
    loop = CollectionLoop(specs=specs, state=AgentState(), sink=windows.append, interval=1.0,
                          collectors=Collectors(["gc"], probe_factories={"gc": lambda: _Failing(
                              "set_targets", ValueError("too many: 2"))},
                              make_sources=lambda t: source_factories(t, config)),
                          discover_fn=lambda _specs, problems: discover(found, problems=problems))
    try:
        loop.start()
        found.append(TargetSpec(name="late", pid=late.pid))
        loop.tick()  # picks up "late"; set_targets fails
        loop.tick()
    finally:
        loop.close()
        stop([first, late])
    last = {w.target: w for w in windows}
    assert last["first"].gc.collections == 3
    assert last["late"].gc is None
    assert "too many: 2" in last["late"].errors["gc"]


@pytest.mark.bpf
def test_a_target_without_libpython_has_no_gc_reading(require_bpf):
    procs = sleepers(1)
    try:
        (window,) = run_loop(procs, ["gc"], settle=0.0)
    finally:
        stop(procs)
    assert window.gc is None
    assert window.errors["gc"].startswith("unsupported:") and "not a Python interpreter" in window.errors["gc"]


def test_pyspy_failing_to_attach_gives_no_stacks_reading(require_root):
    procs = sleepers(1)
    try:
        (window,) = run_loop(procs, [], stacks=True, settle=3.0)
    finally:
        stop(procs)
    assert window.stacks is None
    assert "failed to attach" in window.errors["stacks"]


def test_a_disabled_probe_is_not_loaded_has_no_health_and_is_not_an_error():
    (proc,) = sleepers(1)
    built: list[str] = []
    factories = {"gc": lambda: _Failing("never", ValueError("unused")),
                 "syscalls": lambda: built.append("syscalls")}  # disabled: must never be built
    spec = TargetSpec(name="t", pid=proc.pid)
    collectors = Collectors(["gc"], probe_factories=factories)
    try:
        collectors.start([Target(name="t", pid=proc.pid, start_time=read_start_time(proc.pid), cmdline=("sleep",),
                                 spec=spec)])
        (collected,) = collectors.read().values()
        health = collectors.health()
    finally:
        collectors.stop()
        stop([proc])
    assert built == [] and set(health) == {"gc"}
    assert "syscalls" not in collected.readings and "syscalls" not in collected.missing
    assert collected.readings["gc"].collections == 3


class _Surprising:
    """A probe raising what no domain error covers (a parser's struct.error, a bug's KeyError) on `on`.

    On start it takes every target but the last, then raises: what the gc probe does when one target's
    attach raised unexpectedly (it attaches the others first)."""

    def __init__(self, name: str, on: str, exc: Exception, stays_up: bool = True) -> None:
        self.name, self._on, self._exc, self._stays_up = name, on, exc, stays_up
        self._targets: set[int] = set()
        self._state = "stopped"

    def start(self, targets: Iterable[int]) -> None:
        ordered = sorted(targets)
        if self._on != "start":
            self._targets, self._state = set(ordered), "running"
            return
        self._targets = set(ordered[:-1]) if self._stays_up else set()
        self._state = "running" if self._stays_up else "stopped"
        raise self._exc

    def set_targets(self, targets: Iterable[int]) -> None:
        if self._on == "set_targets":
            raise self._exc
        self._targets = set(targets)

    def read(self) -> dict[int, GcReading | SyscallReading]:
        if self._on == "read":
            raise self._exc
        if self.name == "syscalls":
            return {t: SyscallReading(counts={"read": 3}) for t in self._targets}
        return {t: GcReading(collections=3) for t in self._targets}

    def host(self) -> None:
        return None

    def stop(self) -> None:
        self._targets, self._state = set(), "stopped"

    def health(self) -> Health:
        return Health(name=self.name, state=self._state, targets=len(self._targets))


SURPRISES = [struct.error("unpack_from requires a buffer of at least 64 bytes"), KeyError(4242)]


@pytest.mark.parametrize("exc", SURPRISES, ids=["struct.error", "KeyError"])
@pytest.mark.parametrize("on", ["start", "set_targets", "read"])
def test_a_probe_raising_unexpectedly_costs_only_itself(caplog, on, exc):
    """The loop's start() and tick() go on; the other probe measures every target, the new one included; the
    surprise is logged with its traceback, counted in the probe's health and named in the windows it cost."""
    first, second, late = sleepers(3)
    specs = [TargetSpec(name="first", pid=first.pid), TargetSpec(name="second", pid=second.pid)]
    found = list(specs)
    windows: list = []
    state = AgentState()
    from agent.targets import discover

    factories = {"gc": lambda: _Surprising("gc", on, exc), "syscalls": lambda: _Surprising("syscalls", "never", exc)}
    loop = CollectionLoop(specs=specs, state=state, sink=windows.append, interval=1.0,
                          collectors=Collectors(["gc", "syscalls"], probe_factories=factories),
                          discover_fn=lambda _specs, problems: discover(found, problems=problems))
    try:
        with caplog.at_level("ERROR", logger="infersight.collectors"):
            loop.start()
            found.append(TargetSpec(name="late", pid=late.pid))
            loop.tick()  # picks up "late": set_targets
            loop.tick()
    finally:
        loop.close()
        stop([first, second, late])
    # Each target's first window: "late" appears at the first tick and has its first window at the second.
    firsts = {w.target: w for w in reversed(windows)}
    assert set(firsts) == {"first", "second", "late"}
    assert all(w.syscalls is not None and w.syscalls.counts == {"read": 3} for w in windows)
    shown = {"start": "starting", "set_targets": "changing its targets", "read": "reading"}[on]
    name = "struct.error" if isinstance(exc, struct.error) else "KeyError"
    why = f"{shown} failed unexpectedly: {name}: {exc}"
    cost = {"start": ["second"], "set_targets": ["late"], "read": ["first", "second", "late"]}[on]
    for target, w in firsts.items():
        if target in cost:
            assert w.gc is None and why in w.errors["gc"], (target, w.errors)
        else:
            assert w.gc.collections == 3 and "gc" not in w.errors
    health = state.snapshot().health["gc"]
    assert health.error_count >= 1 and health.state == "running"
    if on == "set_targets":  # still true: after start, the next change of targets took the one start missed
        assert why in health.reason
    logged = [r for r in caplog.records if r.name == "infersight.collectors" and r.exc_info]
    assert logged and logged[0].exc_info[1] is exc


def test_a_probe_that_failed_to_start_unexpectedly_is_tried_again_when_the_targets_change(caplog):
    """A surprise that leaves the probe down (the target that caused it may go): failed, with the reason and a
    count, and started again at the next change of targets."""
    first, late = sleepers(2)
    attempts: list[_Surprising] = []

    def build() -> _Surprising:
        attempts.append(_Surprising("gc", "start" if not attempts else "never", KeyError("slot"), stays_up=False))
        return attempts[-1]

    spec = TargetSpec(name="first", pid=first.pid)
    collectors = Collectors(["gc"], probe_factories={"gc": build})
    target = Target(name="first", pid=first.pid, start_time=read_start_time(first.pid), cmdline=("sleep",), spec=spec)
    try:
        with caplog.at_level("ERROR", logger="infersight.collectors"):
            collectors.start([target])
        down = collectors.health()["gc"]
        (collected,) = collectors.read().values()
        other = Target(name="late", pid=late.pid, start_time=read_start_time(late.pid), cmdline=("sleep",),
                       spec=TargetSpec(name="late", pid=late.pid))
        collectors.set_targets([target, other])
        up = collectors.health()["gc"]
        readings = {key[0]: c.readings.get("gc") for key, c in collectors.read().items()}
    finally:
        collectors.stop()
        stop([first, late])
    assert down.state == "failed" and down.error_count == 1
    assert "starting failed unexpectedly: KeyError: 'slot'" in down.reason
    assert "starting failed unexpectedly" in collected.missing["gc"]
    assert len(attempts) == 2 and up.state == "running" and up.error_count == 1
    assert {pid: r.collections for pid, r in readings.items()} == {first.pid: 3, late.pid: 3}

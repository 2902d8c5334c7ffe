"""Every way a source can fail to measure a target gives that Window null + reason, never a zero reading."""

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
from analysis.window import GcReading
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
        windows = run_loop(procs, ["syscalls"])
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

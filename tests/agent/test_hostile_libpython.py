"""A target mapping a crafted libpython costs only itself: the agent's loop, with the real gc probe, keeps
watching and measuring the others (issue: a truncated section table ended `infersight run`, a FIFO hung it)."""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest

from agent.collectors import Collectors
from agent.config import Config, StacksConfig, TargetSpec
from agent.loop import CollectionLoop
from agent.state import AgentState
from agent.target_sources import source_factories
from tests.probes.crafted_libpython import Mapper, build_mapper, release_fifo_readers

# Generous: a loaded 2-core CI host compiles the gc probe in a few seconds.
DEADLINE = 90.0

# Its own collections, counted by gc.callbacks: the ground truth. Automatic collection is off, so each "go"
# runs exactly the collections it reports.
GC_CHILD = r"""
import gc, sys
gc.disable()
count = [0]
gc.callbacks.append(lambda phase, info: count.__setitem__(0, count[0] + (phase == "stop")))
print("ready", flush=True)
for line in sys.stdin:
    keep = [[i] for i in range(50000)]
    for _ in range(40):
        gc.collect()
    print(count[0], flush=True)
    count[0] = 0
"""


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {DEADLINE} s")
        time.sleep(0.05)


@pytest.mark.bpf
def test_crafted_libpythons_cost_only_their_own_targets(require_bpf, cc, tmp_path, python_exe) -> None:
    binary = build_mapper(cc)
    mappers: dict[str, Mapper] = {}
    server = None
    stop = threading.Event()
    runner = None
    loop = None
    windows: list = []
    failure: list[BaseException] = []
    try:
        for kind in ("truncated", "huge", "fifo"):
            mappers[kind] = Mapper(binary, tmp_path / kind, kind)
        server = subprocess.Popen([python_exe, "-c", GC_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        assert server.stdout.readline().strip() == "ready"
        specs = [TargetSpec(name="server", pid=server.pid),
                 *(TargetSpec(name=kind, pid=m.pid) for kind, m in mappers.items())]
        config = Config(interval_seconds=1.0, targets=tuple(specs), stacks=StacksConfig(enabled=False))
        state = AgentState()
        loop = CollectionLoop(specs=specs, state=state, sink=windows.append, interval=1.0,
                              collectors=Collectors(["gc"], make_sources=lambda t: source_factories(t, config)))

        def run() -> None:
            try:
                loop.run(stop)
            except BaseException as exc:  # handed to the test: the agent's loop must never raise
                failure.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        try:
            _wait(lambda: failure or any(w.target == "server" for w in list(windows)), "a first window")
        except AssertionError:
            release_fifo_readers(mappers["fifo"].fifo)
            raise AssertionError("the agent wrote no window: blocked on the FIFO at the fifo target's path") from None
        assert not failure, f"the agent's loop raised: {failure[0]!r}"

        server.stdin.write("go\n")
        server.stdin.flush()
        collections = int(server.stdout.readline())
        assert collections >= 40

        def measured() -> int:
            return sum(w.gc.collections for w in list(windows) if w.target == "server" and w.gc is not None)

        _wait(lambda: measured() >= collections, f"the server's {collections} collections in its windows")
        seen = len(windows)
        _wait(lambda: len(windows) >= seen + 4, "another window of each target")  # still running
        stop.set()
        runner.join(DEADLINE)
        assert not runner.is_alive() and not failure
        snapshot = state.snapshot()
    finally:
        stop.set()
        if runner is not None and runner.is_alive():
            release_fifo_readers(mappers["fifo"].fifo)
            runner.join(10)
        if loop is not None:
            loop.close()
        for mapper in mappers.values():
            mapper.stop()
        if server is not None:
            server.kill()
            server.wait()

    by_target: dict[str, list] = {}
    for w in windows:
        by_target.setdefault(w.target, []).append(w)
    assert set(by_target) == {"server", "truncated", "huge", "fifo"}
    # The normal target: every window measured, exactly its own collections.
    assert all(w.gc is not None for w in by_target["server"])
    assert measured() == collections
    # The crafted ones: no reading, and the reason names the file and what is wrong with it.
    reasons = {
        "truncated": r"section table of \d+ entries \(\d+ bytes at offset 0x[0-9a-f]+\) runs past the end of the file",
        "huge": rf"symbol table \(section \d+\) \({2**62} bytes at offset 0x[0-9a-f]+\) runs past the end of the file",
    }
    gc_health = snapshot.health["gc"]
    assert gc_health.state == "running" and gc_health.error_count == 0
    for kind, why in reasons.items():
        pid, path = mappers[kind].pid, mappers[kind].path
        expected = rf"unsupported: pid {pid}: {path} is not a usable ELF file: {why} \(\d+ bytes\)"
        for w in by_target[kind]:
            assert w.gc is None
            assert re.fullmatch(expected, w.errors["gc"]), w.errors["gc"]
        assert re.fullmatch(expected.removeprefix("unsupported: "), gc_health.unsupported[pid])
    # The FIFO over the mapped path is bypassed: root reads and traces exactly the mapped file (map_files), a copy
    # of the real libpython that this C process never runs: a real zero, not a hang.
    assert all(w.gc is not None and w.gc.collections == 0 for w in by_target["fifo"])
    assert snapshot.agent_errors["loop"] == 0

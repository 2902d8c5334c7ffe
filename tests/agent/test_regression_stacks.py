"""On a real run at the default sampling rate, the stored regression flame graph names what the fault made hot."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agent.config import Config, TargetSpec
from agent.loop import CollectionLoop
from agent.probeset import ProbeSet
from agent.profiles import from_store
from agent.state import AgentState
from agent.store import Store
from agent.target_sources import make_target_sources
from analysis.flamegraph.diff import diff
from benchmarks.openloop import OpenLoop
from workload.client import set_fault
from workload.launch import launched_server

pytestmark = [pytest.mark.slow, pytest.mark.workload]

# The function each fault makes hot, as py-spy names it (`--function`: qualified name, first line).
HOT = {"nocache": "Engine._logits_full", "gc": "GcChurn.hook"}
BASELINE_S, FAULT_S = 30.0, 30.0


@pytest.mark.parametrize("fault", sorted(HOT))
def test_regression_flame_graph_names_the_hot_function(require_root, tmp_path: Path, fault: str) -> None:
    # Defaults as shipped, and no burst: the steady rate alone must name the function; a burst only adds samples.
    config = Config(store_dir=tmp_path, interval_seconds=5.0)
    store = Store.open(tmp_path)
    stop = threading.Event()
    with launched_server() as srv:
        spec = TargetSpec(name="w", pid=srv.proc.pid)
        loop = CollectionLoop(specs=[spec], probes=ProbeSet([]), make_sources=lambda t: make_target_sources(t, config),
                              state=AgentState(), sink=store.add_window, interval=config.interval_seconds)
        load = OpenLoop(srv.url, rate=3.0)
        load.start()
        runner = threading.Thread(target=loop.run, args=(stop,), daemon=True)
        try:
            loop.start()
            runner.start()
            t0 = time.time()
            time.sleep(BASELINE_S)
            set_fault(srv.url, fault, True, srv.token)
            t_fault = time.time()
            # One window plus one py-spy segment after the switch, stacks are the fault's only.
            time.sleep(FAULT_S + config.interval_seconds + config.pyspy_segment_seconds)
            set_fault(srv.url, fault, False, srv.token)
        finally:
            stop.set()
            runner.join(timeout=30)
            loop.close()
            load.stop()
    try:
        margin = config.interval_seconds + config.pyspy_segment_seconds
        baseline = from_store(store, "w", t0 + margin, t_fault, "active")
        current = from_store(store, "w", t_fault + margin, time.time(), "active")
    finally:
        store.close()
    movers = [m for m in diff(baseline, current).movers(top=5, by="total") if m.total_delta > 0]
    print(f"\n{fault}: active samples baseline {baseline.total()}, regression {current.total()} "
          f"over {FAULT_S:.0f} s at {config.pyspy_rate_hz} Hz; top movers "
          + ", ".join(f"{m.name} {m.total_delta:+.1f} pp" for m in movers))
    assert current.total() >= 50, f"too few samples to name anything: {current.total()}"
    assert any(HOT[fault] in m.name for m in movers[:3]), [(m.name, round(m.total_delta, 1)) for m in movers]

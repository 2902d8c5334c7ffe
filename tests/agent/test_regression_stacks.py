"""On a real run at the default sampling rates, the stored regression flame graph names what the fault made hot."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agent.collectors import Collectors
from agent.config import Config, TargetSpec
from agent.loop import CollectionLoop
from agent.state import AgentState
from agent.store import Store
from agent.target_sources import source_factories
from analysis.flamegraph.diff import diff
from analysis.flamegraph.stored import from_store
from benchmarks.openloop import OpenLoop
from workload.client import set_fault
from workload.launch import launched_server

pytestmark = [pytest.mark.slow, pytest.mark.workload]

# The function each fault makes hot, as py-spy names it (`--function`: qualified name, first line).
HOT = {"nocache": "Engine._logits_full", "gc": "GcChurn.hook"}
BASELINE_S, FAULT_S = 30.0, 30.0


@pytest.mark.parametrize("fault", sorted(HOT))
def test_regression_flame_graph_names_the_hot_function(require_root, tmp_path: Path, fault: str) -> None:
    # Defaults as shipped: the steady rate, then the burst rate from the window after the fault starts, when
    # a detector that opens the regression at its first bad window would fire BurstPolicy (tested apart).
    config = Config(store_dir=tmp_path, interval_seconds=5.0)
    store = Store.open(tmp_path)
    stop = threading.Event()
    opened_at: list[float] = []

    def regression_open(target: str) -> bool:
        return bool(opened_at) and time.time() >= opened_at[0]

    with launched_server() as srv:
        spec = TargetSpec(name="w", pid=srv.proc.pid)
        collectors = Collectors([], make_sources=lambda t: source_factories(t, config, wants_burst=regression_open))
        loop = CollectionLoop(specs=[spec], collectors=collectors, state=AgentState(), sink=store.add_window, interval=config.interval_seconds)
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
            opened_at.append(t_fault + config.interval_seconds)
            # One window plus one py-spy segment after the switch, stacks are the fault's only.
            # No switching it off: the server, overloaded by the fault, stops with the test.
            time.sleep(FAULT_S + config.interval_seconds + config.stacks.segment_seconds)
        finally:
            stop.set()
            runner.join(timeout=30)
            loop.close()
            load.stop()
    try:
        margin = config.interval_seconds + config.stacks.segment_seconds
        baseline = from_store(store, "w", t0 + margin, t_fault, "active")
        current = from_store(store, "w", t_fault + margin, time.time(), "active")
    finally:
        store.close()
    grew = sorted((m for m in diff(baseline, current).functions if m.total_delta > 0), key=lambda m: -m.total_delta)
    movers = grew[:3]
    print(f"\n{fault}: active samples baseline {baseline.total()} (steady {config.stacks.rate_hz} Hz), regression "
          f"{current.total()} over {FAULT_S:.0f} s (burst {config.stacks.burst_rate_hz} Hz); top growers "
          + ", ".join(f"{m.name} {m.total_delta:+.1f} pp" for m in movers))
    assert current.total() >= 200, f"too few samples for a regression flame graph: {current.total()}"
    assert any(HOT[fault] in m.name for m in movers), [(m.name, round(m.total_delta, 1)) for m in grew[:8]]

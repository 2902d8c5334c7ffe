"""The one place the evaluation touches the agent's collection: watch one server, hand back its Windows per tick, and
the change each window revealed in what it runs (agent.changes), as the daemon records it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analysis.window import Window

# The change a window revealed, as the agent stores it (agent.store.changes.StoredChange.to_dict()); None: none.
ObserveChange = Callable[[Window], "dict | None"]


@dataclass
class Collector:
    """tick() -> this tick's Windows of the watched server; close() stops probes and samplers."""

    tick: Callable[[], list[Window]]
    close: Callable[[], None]
    # Sources that could not start (name -> reason), for the run's log.
    problems: dict[str, str]
    # Called once per window, in order; None where the collection reads no identities.
    observe: ObserveChange | None = None


def start_collection(pid: int, metrics_url: str, interval: float, children: bool = False,
                     port: int | None = None) -> Collector:
    """BPF probes + py-spy + psutil + latency for `pid` (with `children`, and every process it starts: a server of
    several processes, `serve --engine-process`), as the daemon runs them (needs root). With `port`, whatever process
    listens on that port instead of `pid`: a server restarted on the same port stays the same target, as a deploy does
    to the daemon's `port` selector.

    Each process's identity is read and compared as the daemon does ([identity] at its defaults), over a store of
    its own in a temporary folder removed by close()."""
    from agent.changes import ChangeTracker
    from agent.config import Config, LatencySpec, TargetSpec
    from agent.identity import IdentityReader
    from agent.single_target import watch_one
    from agent.store import Store

    selector = {"port": port} if port is not None else {"pid": pid, "children": children}
    spec = TargetSpec(name="workload", latency=LatencySpec.from_preset("workload", url=metrics_url), **selector)
    config = Config(interval_seconds=interval, targets=(spec,))
    watch = watch_one(config)
    folder = Path(tempfile.mkdtemp(prefix="infersight-eval-store-"))
    store = Store.open(folder / "store")
    tracker = ChangeTracker(store, IdentityReader(config.identity.env_allowlist, config.identity.refresh_windows),
                            settle_windows=config.identity.settle_windows)

    def observe(window: Window) -> dict | None:
        watched = watch.loop.watched
        target = next((t for t in watched if t.name == window.target and t.pid == window.pid), None)
        if target is None:
            return None
        change = tracker.observe(target, window)
        tracker.forget(watched)
        return change.to_dict() if change is not None else None

    def close() -> None:
        try:
            watch.close()
        finally:
            store.close()
            shutil.rmtree(folder, ignore_errors=True)

    return Collector(tick=lambda: watch.tick().windows, close=close, problems=watch.problems(), observe=observe)

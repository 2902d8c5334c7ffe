"""`infersight collect`: the probes and sources for one pid, printed as Windows, without the daemon."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

from agent import logs
from agent.config import Config, ProbesConfig, TargetSpec
from agent.loop import CollectionLoop
from agent.probeset import ProbeSet
from agent.state import AgentState
from agent.target_sources import make_target_sources
from analysis.window import Window

log = logging.getLogger("infersight.collect")


def _summary(w: Window) -> str:
    parts = [f"{time.strftime('%H:%M:%S', time.localtime(w.end))} pid {w.pid} {w.duration:.1f}s"]
    if w.syscalls:
        parts.append(f"syscalls {sum(w.syscalls.counts.values())}")
    if w.offcpu:
        parts.append(f"offcpu {w.offcpu.seconds:.3f}s")
    if w.gc:
        parts.append(f"gc {w.gc.collections} ({w.gc.pause_seconds * 1000:.1f} ms)")
    if w.runqueue:
        parts.append(f"runq p99 {w.runqueue.histogram.quantile(0.99):.0f}us")
    if w.tcp:
        parts.append(f"retrans {w.tcp.retransmits}")
    if w.process:
        parts.append(f"cpu {w.process.cpu_seconds:.2f}s rss {w.process.rss_bytes >> 20}MiB")
    if w.stacks:
        parts.append(f"stacks {sum(w.stacks.active.values())}+{sum(w.stacks.idle.values())} idle")
    if w.errors:
        parts.append("errors: " + "; ".join(f"{k}: {v}" for k, v in sorted(w.errors.items())))
    return "  ".join(parts)


def main(pid: int, duration: float | None, interval: float, as_json: bool, probes: list[str],
         pyspy: bool = True, pyspy_rate: int = 49) -> int:
    logs.setup("warning")
    spec = TargetSpec(name=f"pid{pid}", pid=pid)
    enabled = {name: name in probes for name in ProbesConfig().enabled()}
    # One py-spy segment per window at the asked rate: `collect` is a short look, not the always-on agent.
    config = Config(interval_seconds=max(interval, 1.0), pyspy_rate_hz=pyspy_rate, probes=ProbesConfig(**enabled),
                    pyspy_segment_seconds=max(1, min(60, int(interval))), targets=(spec,))

    def emit(window: Window) -> None:
        print(window.to_json() if as_json else _summary(window), flush=True)

    state = AgentState()
    loop = CollectionLoop(specs=[spec], probes=ProbeSet(probes),
                          make_sources=lambda t: make_target_sources(t, config, pyspy=pyspy),
                          state=state, sink=emit, interval=interval)
    loop.start()
    if not loop.watched:
        loop.close()
        print(f"infersight: no process with pid {pid}", file=sys.stderr)
        return 1
    for name, health in state.snapshot()["health"].items():
        # No GPU is a normal host, not something to warn about; each window still says so.
        if health.get("state") not in ("running", "ok") and not name.startswith("gpu:"):
            print(f"infersight: {name}: {health.get('state')}: {health.get('reason')}", file=sys.stderr)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    deadline = time.monotonic() + duration if duration else None
    try:
        while not stop.is_set():
            wait = interval if deadline is None else min(interval, deadline - time.monotonic())
            if stop.wait(max(0.0, wait)):
                break
            report = loop.tick()
            if report.gone:
                print(f"infersight: pid {pid} exited", file=sys.stderr)
                break
            if deadline is not None and time.monotonic() >= deadline - 1e-3:
                break
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()
    return 0

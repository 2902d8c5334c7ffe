"""`infersight collect`: the probes and sources for one target, printed as Windows, without the daemon."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from agent import logs
from agent.config import Config, StacksConfig, TargetSpec
from agent.single_target import probes_config, watch_one
from agent.stop_signals import set_on_signal
from analysis.summary import summary_line, window_summary
from analysis.window import Window

log = logging.getLogger("infersight.collect")


def main(spec: TargetSpec, duration: float | None, interval: float, as_json: bool, probes: list[str],
         stacks: bool = True, stacks_rate_hz: int = 49) -> int:
    logs.setup("warning")
    # One py-spy segment per window at the asked rate: `collect` is a short look, not the always-on agent.
    config = Config(interval_seconds=max(interval, 1.0), probes=probes_config(probes), targets=(spec,),
                    stacks=StacksConfig(enabled=stacks, rate_hz=stacks_rate_hz,
                                        segment_seconds=max(1, min(60, int(interval))),
                                        steady_segment_seconds=max(1, min(60, int(interval)))))

    stop = threading.Event()

    def emit(window: Window) -> None:
        try:
            print(window.to_json() if as_json else summary_line(window_summary(window)), flush=True)
        except BrokenPipeError:
            # The reader went (`| head`): stop like on Ctrl-C, unloading the probes. Later writes and the
            # interpreter's final flush go to /dev/null instead of raising again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            stop.set()

    watch = watch_one(config, sink=emit, interval=interval)
    loop = watch.loop
    if not loop.watched:
        loop.close()
        print(f"infersight: {watch.target_detail() or 'no process selected'}", file=sys.stderr)
        return 1
    for name, problem in watch.problems().items():
        print(f"infersight: {name}: {problem}", file=sys.stderr)

    signal.signal(signal.SIGTERM, set_on_signal(stop))
    deadline = time.monotonic() + duration if duration else None
    try:
        while not stop.is_set():
            wait = interval if deadline is None else min(interval, deadline - time.monotonic())
            if stop.wait(max(0.0, wait)):
                break
            report = loop.tick()
            if report.gone:
                print(f"infersight: {watch.target_detail() or f'{spec.name} exited'}", file=sys.stderr)
                break
            if deadline is not None and time.monotonic() >= deadline - 1e-3:
                break
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()
    return 0

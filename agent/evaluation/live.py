"""Run one scenario for real: its own server, the load, each phase's fault or command, collection and detector."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from agent.evaluation import processes
from agent.evaluation.clients import OneWindowLate, RequestsLog
from agent.evaluation.collection import Collector, start_collection
from agent.evaluation.detection import DetectorFactory, Tracker
from agent.evaluation.processes import Children
from agent.evaluation.recording import LabelledWindow, RecordingWriter
from analysis.scenario import Phase, Scenario
from analysis.scoring import Outcome
from analysis.window import Window

StartCollection = Callable[..., Collector]


@dataclass
class LiveRun:
    scenario: Scenario
    interval: float
    windows: list[LabelledWindow] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    recorded: Path | None = None
    complete: bool = False
    # Phase index -> pid of the command a `culprit = true` phase ran, or the pids of the processes its fault started
    # (analysis.scenario.PROCESS_FAULTS): recorded beside each window of that phase.
    culprits: dict[int, int | tuple[int, ...]] = field(default_factory=dict)


class _Stop(KeyboardInterrupt):
    """SIGTERM during a run: unwinds like Ctrl-C so every child is ended."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(f"signal {signum}")


def run_live(scenario: Scenario, interval: float, factory: DetectorFactory | None, record: Path | None,
             progress: TextIO = sys.stderr, collect: StartCollection = start_collection, seed: int = 0,
             nice: int = 0) -> LiveRun:
    """Runs the whole schedule; every process it started is ended on any exit (Ctrl-C and SIGTERM included).

    `nice` runs the server and the load generator at that priority (e.g. -10 on a shared, busy host,
    so other people's work does not saturate the server before any fault does).
    """
    run = LiveRun(scenario=scenario, interval=interval)
    children = Children()
    collector: Collector | None = None
    writer: RecordingWriter | None = None
    late: OneWindowLate | None = None
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    work = Path(tempfile.mkdtemp(prefix="infersight-eval-"))
    server: processes.Server | None = None
    try:
        _say(progress, f"{scenario.name}: starting the workload server")
        # A server that a phase restarts keeps one port, chosen here, so its command line is the same each time.
        port = processes.free_port() if scenario.restarts else 0
        server = processes.start_server(children, cwd=work, nice=nice, args=scenario.server_args, port=port)
        _say(progress, f"{scenario.name}: server pid {server.pid} at {server.url}; loading probes")
        # Restarted, it is watched by its port (a new pid each time), as the daemon's `port` selector does.
        collector = (collect(server.pid, f"{server.url}/metrics", interval, scenario.server_children, port=server.port)
                     if scenario.restarts else
                     collect(server.pid, f"{server.url}/metrics", interval, scenario.server_children))
        for name, why in collector.problems.items():
            _say(progress, f"{scenario.name}: {name}: {why}")
        collector.tick()  # drop the window that covers probe start-up, before any load
        t0 = time.time()
        if record is not None:
            writer = RecordingWriter(record, scenario, interval, t0, extra={"server_nice": nice})
        schedule = ",".join(f"{scenario.rate_of(p):g}:{p.seconds:g}" for p in scenario.phases)
        # Every window waits one window for the clients' figures over it (what the load generator measured).
        late = OneWindowLate(RequestsLog(work / "requests.jsonl"), writer.add if writer is not None else _keep)
        processes.start_load(children, server, schedule, scenario.max_tokens, seed, work / "load.log", nice=nice,
                             requests_log=late.log.path)
        tracker = Tracker(factory) if factory is not None else None
        current = _Current(server=server, args=scenario.server_args, env={}, nice=nice)
        try:
            _schedule(run, scenario, interval, t0, current, children, collector, tracker, late, work, progress)
        finally:
            server = current.server
            if current.starting is not None:  # stop_all below ends the process it started
                current.starting.join(timeout=1.0)
        run.complete = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        if server is not None:
            processes.resume(server.pid)
        children.stop_all()
        if collector is not None:
            collector.close()
        if late is not None:  # the load has ended: the last window's requests are all logged
            late.flush()
        if writer is not None:
            run.recorded = writer.close(complete=run.complete)
        if run.complete:
            shutil.rmtree(work, ignore_errors=True)
        else:
            _say(progress, f"{scenario.name}: the server's, load's and commands' logs are kept in {work}")
    return run


@dataclass
class _Current:
    """The server running now: a phase's restart replaces it; what it runs with, for the next restart."""

    server: processes.Server
    args: tuple[str, ...]
    env: dict[str, str]
    nice: int
    # The restart under way: the new server loads its model in a thread while windows go on being cut, as the agent
    # cuts them through a real deploy; its Server, or why it did not start, once done.
    starting: threading.Thread | None = None
    started: processes.Server | None = None
    failed: BaseException | None = None

    def restart(self, children: Children, work: Path, args: tuple[str, ...], env: dict[str, str]) -> None:
        port = self.server.port
        processes.stop_server(children, self.server)
        self.args, self.env = args, env

        def start() -> None:
            try:
                self.started = processes.start_server(children, work, nice=self.nice, args=args, port=port, env=env)
            except BaseException as exc:  # handed to the schedule's thread, which raises it
                self.failed = exc
        self.starting = threading.Thread(target=start, name="eval-restart", daemon=True)
        self.starting.start()

    def poll(self) -> processes.Server | None:
        """The restarted server once it serves (None until then, or when none is starting); raises what stopped it."""
        if self.starting is None or self.starting.is_alive():
            return None
        self.starting = None
        if self.failed is not None:
            raise processes.EvalProcessError(f"the restarted server did not start: {self.failed}")
        assert self.started is not None
        self.server, self.started = self.started, None
        return self.server


def _keep(item: LabelledWindow) -> None:
    """Nothing records the window; it keeps its clients' figures in the run's list."""


def _schedule(run: LiveRun, scenario: Scenario, interval: float, t0: float, current_server: _Current,
              children: Children, collector: Collector, tracker: Tracker | None, late: OneWindowLate,
              work: Path, progress: TextIO) -> None:
    bounds = scenario.bounds()
    total = scenario.seconds
    current: int | None = None
    command = None
    command_ended = False
    next_tick = t0 + interval
    last_tick = t0
    while True:
        now = time.time()
        index = scenario.phase_at(now - t0)
        if index != current:
            if current is not None:
                _end_phase(scenario.phases[current], current_server.server, children, command)
                command = None
            current = index
            if index is None:
                break
            command = _begin_phase(scenario.phases[index], index, scenario, current_server, children, work, progress)
            command_ended = False
            if scenario.phases[index].culprit:
                run.culprits[index] = (command.pid if command is not None
                                       else processes.fault_pids(current_server.server, scenario.phases[index].fault))
        wake = min(next_tick, t0 + bounds[index][1])
        time.sleep(max(0.0, wake - time.time()))
        if (restarted := current_server.poll()) is not None:
            _say(progress, f"{scenario.name}: restarted server pid {restarted.pid} serves at {restarted.url}")
        if command is not None and not command_ended and command.poll() is not None:
            command_ended = True
            _command_ended(scenario, index, command, t0 + bounds[index][0], work, progress)
        if time.time() >= next_tick - 1e-3:
            last_tick = time.time()
            for window in collector.tick():
                _window(run, scenario, t0, window, tracker, late, progress, total, collector)
            next_tick += interval
            # A tick that overran its slot does not fire a burst of catch-up ticks.
            next_tick = max(next_tick, time.time() + 0.1)
    if time.time() - last_tick > interval / 2:  # the schedule ended well inside a window: keep that part
        for window in collector.tick():
            _window(run, scenario, t0, window, tracker, late, progress, total, collector)


def _begin_phase(phase: Phase, index: int, scenario: Scenario, current: _Current, children: Children,
                 work: Path, progress: TextIO) -> subprocess.Popen | None:
    what = [f"label {phase.label}", f"rate {scenario.rate_of(phase):g}/s"]
    if phase.restart is not None:
        args = phase.restart.args if phase.restart.args is not None else current.args
        env = {**current.env, **dict(phase.restart.env)}
        old = current.server.pid
        current.restart(children, work, args, env)
        what.append(f"pid {old} ended, restarting with {' '.join(args) or 'no arguments'}"
                    + "".join(f" {k}={v}" for k, v in sorted(env.items())))
    server = current.server
    if phase.fault:
        processes.set_fault(server, phase.fault, True)
        what.append(f"fault {phase.fault}")
    command = None
    if phase.run:
        argv = phase.argv(server.pid, server.port, scenario.scenario_dir)
        command = processes.start_command(children, argv, work / f"phase{index}.log")
        what.append(f"run {' '.join(argv)}")
    _say(progress, f"{scenario.name}: phase {index + 1}/{len(scenario.phases)} ({phase.seconds:g}s): {', '.join(what)}")
    return command


def _command_ended(scenario: Scenario, index: int, command: subprocess.Popen, began: float, work: Path,
                   progress: TextIO) -> None:
    """A phase's command that ended before its phase: fine when it succeeded (a one-shot `kill -STOP`), the end of
    the run when it failed, since the phase's fault then did not happen and its windows would be scored as if it
    had (an nftables rule that did not parse left a 'network' phase of normal traffic, and no word of it)."""
    after = f"after {time.time() - began:.1f}s"
    if command.returncode == 0:
        _say(progress, f"{scenario.name}: phase {index + 1}'s command finished {after} (status 0)")
        return
    log = work / f"phase{index}.log"
    said = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
    raise processes.EvalProcessError(
        f"{scenario.name}: phase {index + 1}'s command {' '.join(map(str, command.args))!r} failed {after} "
        f"(status {command.returncode}){': ' + said[0][-300:] if said else ''}; the phase's fault did not run "
        f"as written, so the run stops here")


def _end_phase(phase: Phase, server: processes.Server, children: Children, command: subprocess.Popen | None) -> None:
    if command is not None:
        children.stop(command)
        processes.resume(server.pid)
    if phase.fault:
        processes.set_fault(server, phase.fault, False)


def phase_of_window(scenario: Scenario, start: float, end: float) -> int | None:
    """The phase a window [start, end) (seconds from the scenario's start) is labelled with: the one at its middle,
    unless a fault phase shorter than the window lies at least half inside it. A burst shorter than a window that no
    window's middle fell in would otherwise label no window at all: not scored, and its episode a false alarm."""
    for index, (a, b) in enumerate(scenario.bounds()):
        phase = scenario.phases[index]
        if phase.label != "normal" and b - a < end - start and min(b, end) - max(a, start) >= (b - a) / 2:
            return index
    return scenario.phase_at((start + end) / 2)


def _window(run: LiveRun, scenario: Scenario, t0: float, window: Window, tracker: Tracker | None,
            late: OneWindowLate, progress: TextIO, total: float, collector: Collector) -> None:
    mid = (window.start + window.end) / 2 - t0
    index = phase_of_window(scenario, window.start - t0, window.end - t0)
    label = scenario.phases[index].label if index is not None else "normal"
    change = collector.observe(window) if collector.observe is not None else None
    if change is not None:
        _say(progress, f"{scenario.name}: change {change['id']}: "
                       + "; ".join(f"{d['part']}: {d['before']} → {d['after']}" for d in change["diff"]))
    item = LabelledWindow(window=window, label=label, phase=index, change=change,
                          culprit=run.culprits.get(index) if index is not None else None)
    run.windows.append(item)
    late.add(item)
    state = ""
    if tracker is not None:
        outcome = tracker.feed(item)
        run.outcomes.append(outcome)
        state = f"  detector {outcome.state}"
        if outcome.regression:
            state += f" ({outcome.top_cause})"
    lat = window.latency
    p99 = f"{lat.p99_seconds * 1000:.0f} ms" if lat and lat.p99_seconds is not None else "-"
    rate = f"{lat.request_rate:.1f}/s" if lat else "-"
    phase = f"phase {index + 1} {label}" if index is not None else "after the schedule"
    _say(progress, f"{scenario.name}: {mid + window.duration / 2:5.0f}/{total:.0f}s  {phase}  p99 {p99}  "
                   f"rate {rate}{state}")


def _say(out: TextIO, line: str) -> None:
    out.write(f"{time.strftime('%H:%M:%S')} {line}\n")
    out.flush()

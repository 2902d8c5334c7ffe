"""Run the schedule against one server: check the target, then per step load + scrape + window, then repeats."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import psutil

from agent.config import TargetSpec
from agent.loadtest.client import Endpoint, Shape, complete, run_step
from agent.loadtest.collection import Collection, busiest_thread, open_collection, thread_cpu
from agent.loadtest.figures import add_server, add_window, clearly_broken, client_figures
from agent.loadtest.idle_threads import idle_since, switches
from agent.loadtest.report import LoadTestReport
from agent.loadtest.schedule import Step
from agent.loadtest.server_metrics import BACKGROUND_SECONDS, ServerSampler
from analysis.capacity import Slo, StepFigures, find_knee, verdict
from analysis.errors import ReadingError
from analysis.window import Window


class TargetError(RuntimeError):
    """The URL or the pid is not a server this load test can drive and watch; the message is one line."""


@dataclass
class Options:
    url: str
    pid: int | None
    schedule: tuple[Step, ...]
    schedule_text: str
    slo: Slo
    shape: Shape = field(default_factory=Shape)
    metrics_url: str | None = None  # default: URL + /metrics
    probes: list[str] = field(default_factory=list)
    pyspy: bool = True
    pyspy_rate: int = 49
    seed: int = 0
    repeats: int = 1  # extra runs of the last good step, to measure run-to-run noise
    all_steps: bool = False  # keep stepping after the first step that breaks the SLO
    label: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    max_batch: int | None = None  # the server's batch limit; no endpoint exports it, so the user (or sweep) says
    spec: TargetSpec | None = None  # how the agent finds the server (a family); None: `pid` alone
    members: tuple[int, ...] = ()  # a family's processes when the test started (any of them may hold the port)
    background_s: float = BACKGROUND_SECONDS  # how long the server's own request rate is measured before step 1

    @property
    def scrape_url(self) -> str:
        return self.metrics_url or self.url.rstrip("/") + "/metrics"


def _listening_ports(proc: psutil.Process) -> set[int]:
    """The TCP ports the process itself listens on (a pre-fork server's workers hold the socket too).

    Its children are not asked: a parent that started the server (a shell, a test) is not the server.
    """
    return {c.laddr.port for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def check_completes(endpoint: Endpoint, shape: Shape) -> None:
    """Raise TargetError with one line unless the server completes one small request."""
    kind, _, _, _, detail = complete(endpoint, "the model", 2, 0, Shape(timeout_s=min(shape.timeout_s, 30.0),
                                                                      model=shape.model), threading.Event())
    if kind != "ok":
        raise TargetError(f"{endpoint.url} did not complete a test request ({kind}: {detail.strip()[:160]})")


def check_target(endpoint: Endpoint, sampler: ServerSampler, pid: int | None, members: tuple[int, ...] = ()) -> None:
    """Raise TargetError with one line unless the metrics URL answers and `pid` (or one of a family's `members`)
    serves the URL's port."""
    try:
        sampler.check()
    except ReadingError as exc:
        raise TargetError(f"cannot reach the server's metrics: {exc}") from None
    if pid is None:
        return
    try:
        proc = psutil.Process(pid)
        name = proc.name()
        ports = _listening_ports(proc)
        for member in members:
            if member != pid and endpoint.port not in ports:
                try:
                    ports |= _listening_ports(psutil.Process(member))
                except psutil.NoSuchProcess:
                    continue  # a member that exited since discovery holds no port
    except psutil.NoSuchProcess:
        raise TargetError(f"no process with pid {pid}") from None
    except psutil.AccessDenied:
        raise TargetError(f"not allowed to inspect pid {pid}; run as root") from None
    if endpoint.port not in ports:
        where = ", ".join(str(p) for p in sorted(ports)) or "no TCP port"
        raise TargetError(f"pid {pid} ({name}) is not the server at {endpoint.url}: it listens on {where}, "
                          f"not port {endpoint.port}")


class Runner:
    """One load test; `run()` returns its report. Every thread and probe it starts is gone when run() returns."""

    def __init__(self, options: Options, progress: TextIO, interrupt: threading.Event | None = None) -> None:
        self.o = options
        self.progress = progress
        self.interrupt = interrupt or threading.Event()
        self.endpoint = Endpoint(options.url)
        self.sampler = ServerSampler(options.scrape_url)
        self.collection: Collection | None = None
        self.stacks: dict[int, dict[str, int]] = {}
        self.background_rps = 0.0

    def _say(self, line: str) -> None:
        self.progress.write(line + "\n")
        self.progress.flush()

    def run(self) -> LoadTestReport:
        o = self.o
        check_target(self.endpoint, self.sampler, o.pid, o.members)
        # Before our own first request (the check below): what the server serves is then someone else's.
        background = self.sampler.background(o.background_s)
        self._say(f"loadtest: {background.text()}")
        self.background_rps = background.rps or 0.0
        check_completes(self.endpoint, o.shape)
        started = time.time()
        problems: dict[str, str] = {}
        if o.pid is not None and (o.probes or o.pyspy):
            self._say(f"loadtest: attaching to pid {o.pid} (probes: {', '.join(o.probes) or 'none'}, "
                      f"py-spy: {'on' if o.pyspy else 'off'})")
            self.collection = open_collection(o.pid, o.probes, o.pyspy, o.pyspy_rate, spec=o.spec)
            problems = self.collection.problems
            for name, why in sorted(problems.items()):
                self._say(f"loadtest: {name}: {why}")
        steps: list[StepFigures] = []
        try:
            for i, step in enumerate(o.schedule):
                if self.interrupt.is_set():
                    break
                fig = self._measure(i, step.rate, step.seconds, None)
                steps.append(fig)
                self._report_step(fig, len(o.schedule))
                if verdict(fig, o.slo) is not None and not o.all_steps:
                    break
            knee = find_knee(steps, o.slo)
            again = knee.last_good if knee.last_good is not None else (steps[0].index if steps else None)
            for _ in range(o.repeats if again is not None else 0):
                if self.interrupt.is_set():
                    break
                orig = steps[again]
                fig = self._measure(len(steps), orig.offered_rps, orig.planned_s, again)
                steps.append(fig)
                self._report_step(fig, len(o.schedule))
        finally:
            if self.collection is not None:
                self.collection.close()
        knee = find_knee(steps, o.slo)
        report = LoadTestReport(url=o.url, pid=o.pid, slo=o.slo, schedule=o.schedule_text, started=started,
                                finished=time.time(), steps=steps, label=o.label, settings=o.settings,
                                collection_problems=problems, background=background)
        report.flame_good = self.stacks.get(knee.last_good, {}) if knee.last_good is not None else {}
        report.flame_bad = self.stacks.get(knee.first_bad, {}) if knee.first_bad is not None else {}
        if not o.pyspy or o.pid is None:
            report.flame_note = "py-spy was off: no flame graphs"
        elif not (report.flame_good and report.flame_bad):
            report.flame_note = "no knee (or py-spy sampled nothing there): flame graphs need a good and a bad step"
        return report

    def _measure(self, index: int, rate: float, seconds: float, repeat_of: int | None) -> StepFigures:
        o = self.o
        if self.collection is not None:
            self.collection.cut()  # drops the drain and idle time since the previous step
        before, began = (thread_cpu(o.pid) if o.pid else {}), time.monotonic()
        switched = switches(o.pid) if o.pid else {}
        got: dict[str, Any] = {}

        def on_sent() -> None:
            got["server"] = self.sampler.finish()
            got["window"] = self.collection.cut() if self.collection is not None else None
            got["threads"], got["ended"] = (thread_cpu(o.pid) if o.pid else {}), time.monotonic()
            got["idle"] = idle_since(o.pid, switched) if switched else None

        # A repeat sends the very arrivals of its original, so the noise it measures is the server's,
        # as it is between two runs with the same seed.
        seed = o.seed + (index if repeat_of is None else repeat_of)
        self.sampler.start()
        try:
            load = run_step(self.endpoint, rate, seconds, o.shape, seed,
                            stop_check=lambda done, pending, t: clearly_broken(o.slo, done, pending, t),
                            interrupt=self.interrupt, on_sent=on_sent)
        finally:
            if "server" not in got:  # interrupted before sending ended: stop the scrape thread all the same
                self.sampler.finish()
        fig = client_figures(index, load)
        fig.repeat_of = repeat_of
        fig.max_batch = o.max_batch
        if o.max_batch is None:
            fig.unmeasured["max_batch"] = "the server's batch limit was not given (--server-max-batch)"
        add_server(fig, got["server"])
        window: Window | None = got["window"]
        busiest = busiest_thread(before, got["threads"], got["ended"] - began) if o.pid else None
        add_window(fig, window, busiest, os.cpu_count(), got.get("idle"))
        if window is not None and window.stacks is not None:
            self.stacks[index] = dict(window.stacks.active)
        if load.stopped_early:
            fig.unmeasured["stopped_early"] = load.stopped_early
        return fig

    def _report_step(self, s: StepFigures, planned: int) -> None:
        why = verdict(s, self.o.slo)
        p95 = "n/a" if s.client_p95_s is None else f"{s.client_p95_s * 1000:.0f} ms"
        cpu = "" if s.busiest_thread_cores is None else f", busiest thread {s.busiest_thread_cores:.2f} cores"
        queue = "" if s.queue_waiting_mean is None else f", queue {s.queue_waiting_mean:.1f}"
        tag = f"repeat of step {s.repeat_of + 1}" if s.repeat_of is not None else f"step {s.index + 1}/{planned}"
        early = " (stopped early)" if s.stopped_early else ""
        extra = self.background_rps
        plus = f" (+{extra:.2f} background = {s.offered_rps + extra:.2f} at the server)" if extra else ""
        self._say(f"{tag}: {s.offered_rps:g} req/s offered{plus} for {s.duration_s:.0f}s{early}: {s.achieved_rps:.2f} req/s, "
                  f"{s.tokens_per_s:.0f} tok/s, p95 {p95}, errors {s.error_rate:.1%}{cpu}{queue}: "
                  f"{'meets SLO' if why is None else 'FAILS: ' + why}")

"""`--sweep max-batch=...|http-threads=...`: restart the bundled server per value, load-test each, mark the optimum."""

from __future__ import annotations

import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.loadtest.report import LoadTestReport
from agent.loadtest.schedule import Sweep
from analysis.capacity_compare import NOISE_MARGIN, RELATIVE_FLOOR

REPO = Path(__file__).resolve().parent.parent.parent
SERVING = re.compile(r"workload: serving .* at (http://\S+) .*pid (\d+)")
SWEEP_VERSION = 1


class ServerStartError(RuntimeError):
    """The bundled server did not come up; the message carries the tail of its log."""


@dataclass
class ServerProcess:
    url: str
    pid: int
    popen: subprocess.Popen
    log: Path

    def stop(self) -> None:
        """SIGTERM (the server shuts its scheduler down cleanly), then SIGKILL if it lingers."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self.log.unlink(missing_ok=True)


def start_server(args: list[str], timeout_s: float = 180.0, python: str = sys.executable) -> ServerProcess:
    """Run `python -m workload serve --port 0 ARGS` as a child process; the agent never imports the workload."""
    log = Path(tempfile.mkstemp(prefix="infersight-sweep-server-", suffix=".log")[1])
    cmd = [python, "-m", "workload", "serve", "--port", "0", *args]
    with log.open("w") as err:
        popen = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)
    sel = selectors.DefaultSelector()
    assert popen.stdout is not None
    sel.register(popen.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not sel.select(timeout=1.0):
                if popen.poll() is not None:
                    break
                continue
            line = popen.stdout.readline()
            if not line and popen.poll() is not None:
                break
            if m := SERVING.search(line):
                return ServerProcess(m.group(1), int(m.group(2)), popen, log)
    finally:
        sel.close()
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
    ServerProcess("", popen.pid, popen, log).stop()
    raise ServerStartError(f"the bundled server ({' '.join(cmd[1:])}) did not start: {tail[0][:200]}")


@dataclass
class SweepPoint:
    value: int
    knee_rps: float | None  # achieved requests/s at the highest step meeting the SLO
    tokens_per_s: float | None
    p95_s: float | None
    ctx_switches_per_s: float | None
    involuntary_ctx_switches_per_s: float | None
    runq_wait_per_s: float | None
    bottleneck: str
    note: str = ""
    tokens_noise: float | None = None  # relative run-to-run noise of tokens/s from this run's repeated step


def point(value: int, report: LoadTestReport) -> SweepPoint:
    """The figures at the knee (or at the top step when every step passed) for one setting's run."""
    knee = report.knee()
    good = report.step(knee.last_good)
    b = report.bottleneck()
    noise = report.noise()["tokens_per_s"]
    if good is None:
        return SweepPoint(value, None, None, None, None, None, None, b.resource or "none", knee.reason, noise)
    return SweepPoint(value, good.achieved_rps, good.tokens_per_s, good.client_p95_s, good.ctx_switches_per_s,
                      good.involuntary_ctx_switches_per_s, good.runq_wait_per_s, b.resource or "none",
                      "" if knee.found else knee.reason, noise)


def tied(a: SweepPoint, b: SweepPoint) -> bool:
    """Tokens/s within what two runs of one setting differ by: compare's rule (twice the larger measured
    noise, at least 5 %), since each point is one run."""
    if a.tokens_per_s is None or b.tokens_per_s is None:
        return False
    noise = max((n for n in (a.tokens_noise, b.tokens_noise) if n is not None), default=0.0)
    rel = max(NOISE_MARGIN * noise, RELATIVE_FLOOR)
    return abs(a.tokens_per_s - b.tokens_per_s) <= rel * max(a.tokens_per_s, b.tokens_per_s)


@dataclass
class SweepResult:
    sweep: Sweep
    points: list[SweepPoint]
    reports: list[dict[str, Any]] = field(default_factory=list)
    command: str = ""  # the `infersight loadtest --sweep ...` line that ran it

    def tied_with_most(self) -> list[SweepPoint]:
        """The points whose tokens/s are within noise of the highest: any of them could be the most."""
        scored = [p for p in self.points if p.tokens_per_s is not None]
        if not scored:
            return []
        most = max(scored, key=lambda p: p.tokens_per_s or 0.0)
        return [p for p in scored if tied(p, most)]

    def optimum(self) -> SweepPoint | None:
        """Most tokens/s under the SLO; among settings tied within noise, the lower p95, then the lower setting
        (fewer threads or a smaller batch for the same throughput)."""
        tied_points = self.tied_with_most()
        if not tied_points:
            return None
        return min(tied_points, key=lambda p: (float("inf") if p.p95_s is None else p.p95_s, p.value))

    def to_dict(self) -> dict[str, Any]:
        best = self.optimum()
        return {"version": SWEEP_VERSION, "setting": self.sweep.setting, "values": list(self.sweep.values),
                "optimum": best.value if best else None, "tied": [p.value for p in self.tied_with_most()],
                "command": self.command,
                "points": [p.__dict__ for p in self.points], "reports": self.reports}

    def text(self) -> str:
        best = self.optimum()
        lines = [f"{self.sweep.setting:>12} {'knee req/s':>10} {'tokens/s':>9} {'p95 ms':>7} {'ctxsw/s':>8} "
                 f"{'invol/s':>8} {'runq s/s':>8}  bottleneck"]
        for p in self.points:
            def f(v: float | None, scale: float = 1.0, d: int = 1) -> str:
                return "n/a" if v is None else f"{v * scale:.{d}f}"
            mark = "  <- optimum" if best is not None and p.value == best.value else ""
            if not mark and best is not None and tied(p, best):
                mark = "  (tokens/s tied with the optimum within noise)"
            lines.append(f"{p.value:>12} {f(p.knee_rps, d=2):>10} {f(p.tokens_per_s):>9} {f(p.p95_s, 1000, 0):>7} "
                         f"{f(p.ctx_switches_per_s, d=0):>8} {f(p.involuntary_ctx_switches_per_s, d=0):>8} "
                         f"{f(p.runq_wait_per_s, d=3):>8}  {p.bottleneck}{mark}{'  (' + p.note + ')' if p.note else ''}")
        return "\n".join(lines)

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


def point(value: int, report: LoadTestReport) -> SweepPoint:
    """The figures at the knee (or at the top step when every step passed) for one setting's run."""
    knee = report.knee()
    good = report.step(knee.last_good)
    b = report.bottleneck()
    if good is None:
        return SweepPoint(value, None, None, None, None, None, None, b.resource or "none", knee.reason)
    return SweepPoint(value, good.achieved_rps, good.tokens_per_s, good.client_p95_s, good.ctx_switches_per_s,
                      good.involuntary_ctx_switches_per_s, good.runq_wait_per_s, b.resource or "none",
                      "" if knee.found else knee.reason)


@dataclass
class SweepResult:
    sweep: Sweep
    points: list[SweepPoint]
    reports: list[dict[str, Any]] = field(default_factory=list)

    def optimum(self) -> SweepPoint | None:
        scored = [p for p in self.points if p.tokens_per_s is not None]
        # Ties (the schedule's resolution) go to the lower p95.
        return max(scored, key=lambda p: (p.tokens_per_s or 0.0, -(p.p95_s or 0.0))) if scored else None

    def to_dict(self) -> dict[str, Any]:
        best = self.optimum()
        return {"version": SWEEP_VERSION, "setting": self.sweep.setting, "values": list(self.sweep.values),
                "optimum": best.value if best else None,
                "points": [p.__dict__ for p in self.points], "reports": self.reports}

    def text(self) -> str:
        best = self.optimum()
        lines = [f"{self.sweep.setting:>12} {'knee req/s':>10} {'tokens/s':>9} {'p95 ms':>7} {'ctxsw/s':>8} "
                 f"{'invol/s':>8} {'runq s/s':>8}  bottleneck"]
        for p in self.points:
            def f(v: float | None, scale: float = 1.0, d: int = 1) -> str:
                return "n/a" if v is None else f"{v * scale:.{d}f}"
            mark = "  <- optimum" if best is not None and p.value == best.value else ""
            lines.append(f"{p.value:>12} {f(p.knee_rps, d=2):>10} {f(p.tokens_per_s):>9} {f(p.p95_s, 1000, 0):>7} "
                         f"{f(p.ctx_switches_per_s, d=0):>8} {f(p.involuntary_ctx_switches_per_s, d=0):>8} "
                         f"{f(p.runq_wait_per_s, d=3):>8}  {p.bottleneck}{mark}{'  (' + p.note + ')' if p.note else ''}")
        return "\n".join(lines)

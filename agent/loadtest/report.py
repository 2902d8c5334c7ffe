"""The load test report record: what was run, every step's figures, the knee and bottleneck; JSON both ways."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agent.loadtest.server_metrics import BackgroundLoad
from analysis.capacity import Bottleneck, Knee, Slo, StepFigures, find_knee, name_bottleneck
from analysis.capacity_compare import Run, measure_noise

REPORT_VERSION = 1


class ReportError(ValueError):
    """A file that is not a load test report this version can read."""


@dataclass
class LoadTestReport:
    url: str
    pid: int | None
    slo: Slo
    schedule: str
    started: float
    finished: float
    steps: list[StepFigures]
    label: str = ""  # what this run was (e.g. "no-cache"), shown by compare
    settings: dict[str, Any] = field(default_factory=dict)  # request shape, probes, server flags of a sweep
    collection_problems: dict[str, str] = field(default_factory=dict)
    # Folded Python on-CPU stacks ("a;b;c" -> samples) of the last good and the first failing step.
    flame_good: dict[str, int] = field(default_factory=dict)
    flame_bad: dict[str, int] = field(default_factory=dict)
    flame_note: str = ""
    # The server's request rate before the first step (other traffic); None in reports older than the field.
    background: BackgroundLoad | None = None

    def at_server(self, offered_rps: float) -> float | None:
        """A step's load as the server saw it: offered + the background rate; None when there was none measured."""
        if self.background is None or not self.background.rps:
            return None
        return offered_rps + self.background.rps

    def knee(self) -> Knee:
        return find_knee(self.steps, self.slo)

    def step(self, index: int | None) -> StepFigures | None:
        return next((s for s in self.steps if s.index == index), None)

    def bottleneck(self) -> Bottleneck:
        knee = self.knee()
        return name_bottleneck(self.step(knee.last_good), self.step(knee.first_bad))

    def noise(self) -> dict[str, float | None]:
        return measure_noise(self.steps)

    def run(self, name: str) -> Run:
        return Run(name=name, slo=self.slo, steps=self.steps, noise=self.noise())

    def to_dict(self) -> dict[str, Any]:
        knee = self.knee()
        return {
            "version": REPORT_VERSION, "url": self.url, "pid": self.pid, "label": self.label,
            "slo": asdict(self.slo), "schedule": self.schedule, "started": self.started, "finished": self.finished,
            "settings": self.settings, "collection_problems": self.collection_problems,
            "steps": [s.to_dict() for s in self.steps],
            "knee": {**asdict(knee), "found": knee.found},
            "bottleneck": self.bottleneck().to_dict(),
            "noise": self.noise(),
            "flame": {"good": self.flame_good, "bad": self.flame_bad, "note": self.flame_note},
            # Absent, not null, in a report from before it was measured: such a file loads and saves unchanged.
            **({} if self.background is None else {"background": asdict(self.background)}),
        }


def from_dict(data: Any) -> LoadTestReport:
    """Derived parts (knee, bottleneck, noise) are recomputed from the steps, so a report is judged one way."""
    if not isinstance(data, dict) or data.get("version") != REPORT_VERSION:
        got = data.get("version") if isinstance(data, dict) else type(data).__name__
        raise ReportError(f"not a version-{REPORT_VERSION} load test report (version {got!r})")
    flame = data.get("flame") or {}
    if not isinstance(flame, dict):
        raise ReportError("load test report is missing or has a bad field: flame is not a table")
    # The file's layout to the record's: the flame graphs sit in one table; knee, bottleneck and noise are not read.
    record = {k: data[k] for k in ("url", "pid", "slo", "schedule", "started", "finished", "steps") if k in data}
    record.update(label=data.get("label") or "", settings=data.get("settings") or {},
                  collection_problems=data.get("collection_problems") or {}, flame_good=flame.get("good") or {},
                  flame_bad=flame.get("bad") or {}, flame_note=flame.get("note") or "",
                  background=data.get("background"))
    try:
        return msgspec.convert(record, LoadTestReport)
    except msgspec.ValidationError as exc:
        raise ReportError(f"load test report is missing or has a bad field: {exc}") from None


def load(path: Path) -> LoadTestReport:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    return from_dict(data)


def save(report: LoadTestReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True) + "\n")

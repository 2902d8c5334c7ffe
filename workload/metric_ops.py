"""Metric updates the engine process makes, recorded as data, shipped to the API process and applied there."""

import threading
from dataclasses import fields

from workload.engine_protocol import MetricOp
from workload.metrics import ServerMetrics

FIELDS = frozenset(f.name for f in fields(ServerMetrics) if f.name != "model_name")
METHODS = frozenset({"observe", "inc", "set"})


class OpRecorder:
    """Stands in for the prometheus metrics in the engine process: each update becomes a MetricOp."""

    def __init__(self) -> None:
        self._ops: list[MetricOp] = []
        self._lock = threading.Lock()

    def metrics(self, model_name: str) -> ServerMetrics:
        """A ServerMetrics whose every metric records into this recorder (the scheduler cannot tell)."""
        return ServerMetrics(**{name: _Metric(name, self) for name in FIELDS}, model_name=model_name)

    def add(self, op: MetricOp) -> None:
        with self._lock:
            self._ops.append(op)

    def drain(self) -> list[MetricOp]:
        with self._lock:
            ops, self._ops = self._ops, []
        return ops


class _Metric:
    def __init__(self, name: str, recorder: OpRecorder) -> None:
        self.name = name
        self.recorder = recorder

    def labels(self, *values: str) -> "_Child":
        return _Child(self.name, list(values), self.recorder)


class _Child:
    def __init__(self, name: str, labels: list[str], recorder: OpRecorder) -> None:
        self.name, self.label_values, self.recorder = name, labels, recorder

    def observe(self, value: float) -> None:
        self.recorder.add((self.name, self.label_values, "observe", float(value)))

    def inc(self, amount: float = 1.0) -> None:
        self.recorder.add((self.name, self.label_values, "inc", float(amount)))

    def set(self, value: float) -> None:
        self.recorder.add((self.name, self.label_values, "set", float(value)))


def apply(metrics: ServerMetrics, ops: list[MetricOp]) -> None:
    """Replays the engine's updates on the API process's metrics; an op naming no known metric is refused."""
    for name, labels, method, value in ops:
        if name not in FIELDS or method not in METHODS:
            raise ValueError(f"engine sent an unknown metric update {name!r}.{method!r}")
        getattr(getattr(metrics, name).labels(*labels), method)(value)

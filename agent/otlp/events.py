"""Regressions as OpenTelemetry log records (events): opened, re-ranked when the top cause changes, closed.

The record carries what an alert notification carries (agent.alerts.payloads: the same labels, summary,
description and links), as attributes; the schema is documented once, in docs/otlp.md. Records are encoded when
the detector reports and queued in the alert outbox (agent.store.alerts) under the receiver name `otlp:logs`,
which no configured receiver can have, so they survive a Collector outage and an agent restart like
notifications do and are posted by agent.otlp.exporter in order.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs._internal import LogRecord
from opentelemetry.sdk.resources import Resource

from agent.alerts import payloads
from agent.otlp.metrics import SCOPE, target_resource
from agent.store import Store
from agent.store import alerts as table
from agent.store.db import StoreError
from analysis.regression import Regression

OUTBOX_RECEIVER = "otlp:logs"
EVENTS = ("opened", "reranked", "closed")
# At most this many exemplar trace ids per record: enough to open a few slow requests.
MAX_EXEMPLARS = 5


def record_attributes(reg: Regression, event: str, *, host: str, external_url: str, now: float,
                      exemplar_trace_ids: Sequence[str] = ()) -> dict[str, object]:
    """The record's attributes: the alert's labels and annotations (agent.alerts.payloads), then the ranked causes
    with their scores and evidence, the functions that grew, and exemplar trace ids from the episode's windows."""
    labels = payloads.alert_labels(reg, host)
    annotations = payloads.alert_annotations(reg, external_url, now)
    causes = reg.causes[:payloads.MAX_CAUSES]
    functions = reg.functions[:payloads.MAX_FUNCTIONS]
    attrs: dict[str, object] = {
        "infersight.regression.event": event,
        "infersight.regression.id": reg.id,
        "target": reg.target,
        "cause": labels["cause"],
        "severity": reg.severity,
        "alertname": labels["alertname"],
        "host.name": host,
        "process.pid": reg.pid,
        "infersight.regression.score": float(reg.score),
        "infersight.regression.opened_at": payloads.rfc3339(reg.opened_at),
        "infersight.regression.summary": annotations["summary"],
        "infersight.regression.description": annotations["description"],
        "infersight.regression.url": annotations["regression_url"],
        "infersight.regression.flamegraph_url": annotations["flamegraph_url"],
        "infersight.regression.causes": [c.label for c in causes],
        "infersight.regression.cause_scores": [float(c.score) for c in causes],
        "infersight.regression.cause_evidence": [payloads.shorten(payloads.printable(c.evidence),
                                                                  payloads.MAX_EVIDENCE_CHARS) for c in causes],
        "infersight.regression.functions": [payloads.function_name(f) for f in functions],
        "infersight.regression.function_baseline_shares": [float(f.baseline_share) for f in functions],
        "infersight.regression.function_current_shares": [float(f.current_share) for f in functions],
    }
    if reg.closed_at is not None:
        attrs["infersight.regression.closed_at"] = payloads.rfc3339(reg.closed_at)
    if exemplar_trace_ids:
        attrs["infersight.regression.exemplar_trace_ids"] = list(exemplar_trace_ids[:MAX_EXEMPLARS])
    return attrs


def _severity(reg: Regression, event: str) -> tuple[SeverityNumber, str]:
    if event == "closed":
        return SeverityNumber.INFO, "INFO"
    return (SeverityNumber.ERROR, "ERROR") if reg.severity == "critical" else (SeverityNumber.WARN, "WARN")


def encode_record(reg: Regression, event: str, resource: Resource, *, host: str, external_url: str, now: float,
                  exemplar_trace_ids: Sequence[str] = ()) -> bytes:
    """One ExportLogsServiceRequest holding the event, encoded by the SDK's encoder."""
    number, text = _severity(reg, event)
    at = reg.closed_at if event == "closed" and reg.closed_at is not None else now
    record = LogRecord(timestamp=int(at * 1e9), observed_timestamp=int(now * 1e9), severity_number=number,
                       severity_text=text, event_name=f"infersight.regression.{event}",
                       body=payloads.alert_annotations(reg, external_url, now)["summary"],
                       attributes=record_attributes(reg, event, host=host, external_url=external_url, now=now,
                                                    exemplar_trace_ids=exemplar_trace_ids))
    readable = ReadableLogRecord(record, resource=target_resource(resource, reg.target), instrumentation_scope=SCOPE)
    return encode_logs([readable]).SerializeToString()


class RegressionEvents:
    """A detector listener (agent.detection.RegressionListener) that queues one record per event. It must come
    after the alert service among the listeners: the alert row it files the record under is the alerter's."""

    def __init__(self, store: Store, resource: Resource, *, host: str, external_url: str,
                 exemplars: Callable[[Regression], Sequence[str]] | None = None,
                 wake: Callable[[], None] | None = None, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._resource = resource
        self._host = host
        self._external_url = external_url.rstrip("/")
        self._exemplars = exemplars or (lambda reg: ())
        self._wake = wake or (lambda: None)
        self._clock = clock
        # Top cause last sent per open episode: a re-rank that keeps it sends nothing. Bounded by the open
        # episodes (one per target at most); after an agent restart the first update of an episode only sets it.
        self._top: dict[str, str] = {}
        self._lock = threading.Lock()

    def regression_opened(self, regression: Regression) -> None:
        self._queue(regression, "opened")
        if regression.closed_at is not None:
            self.regression_closed(regression)

    def regression_updated(self, regression: Regression) -> None:
        with self._lock:
            last = self._top.setdefault(regression.id, regression.top_cause)
        if last != regression.top_cause:
            self._queue(regression, "reranked")

    def regression_closed(self, regression: Regression) -> None:
        if regression.closed_at is None:
            return
        self._queue(regression, "closed")
        with self._lock:
            self._top.pop(regression.id, None)

    def _queue(self, reg: Regression, event: str) -> None:
        now = self._clock()
        body = encode_record(reg, event, self._resource, host=self._host, external_url=self._external_url,
                             now=now, exemplar_trace_ids=self._exemplars(reg))
        with self._lock, self._store.transaction() as conn:
            alert_id = _alert_id(conn, reg)
            table.enqueue(conn, alert_id=alert_id, receiver=OUTBOX_RECEIVER,
                          status="resolved" if event == "closed" else "firing", body=body, now=now)
            self._top[reg.id] = reg.top_cause
        self._wake()


def _alert_id(conn: sqlite3.Connection, reg: Regression) -> int:
    row = table.alert_state(conn, reg.id)
    if row is None:
        raise StoreError(f"no alert filed for regression {reg.id}: the alert service must be told first")
    return row[0]

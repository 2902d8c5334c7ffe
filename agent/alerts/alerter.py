"""From detector findings to queued notifications: group wait, frozen labels, escalations, repeats, resolves."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.alerts import payloads
from agent.alerts.config import SEVERITY_ORDER, AlertsConfig, ReceiverConfig
from agent.alerts.payloads import AlertEvent
from agent.store import Store
from agent.store import alerts as table
from agent.store.alerts import AGENT_OWNER, enqueue
from analysis.regression import Regression

# A firing alert posted to Alertmanager stays active this long past the next repeat before it lapses.
ALERTMANAGER_GRACE_SECONDS = 300.0


@dataclass(frozen=True)
class Replaced:
    """The alert an escalation ends: its labels (at the old severity) and Alertmanager fingerprint."""

    severity: str
    labels: dict[str, str]
    fingerprint: str


def more_severe(a: str, b: str) -> bool:
    return SEVERITY_ORDER.index(a) > SEVERITY_ORDER.index(b)


class Alerter:
    """The detector's entry point. Every call is a few store writes: it never waits on a receiver."""

    def __init__(self, config: AlertsConfig, receivers: tuple[ReceiverConfig, ...], store: Store, *, host: str,
                 external_url: str, clock: Callable[[], float] = time.time,
                 wake: Callable[[str], None] | None = None, owner: str = AGENT_OWNER) -> None:
        self.config = config
        self.receivers = receivers
        self.store = store
        self.host = host
        self.external_url = external_url.rstrip("/")
        self._clock = clock
        self._wake = wake or (lambda receiver: None)
        self._owner = owner
        # The collection loop and the scheduler thread both call in; one at a time keeps state moves simple.
        self._lock = threading.Lock()

    # ---- the detector's calls ---------------------------------------------------------------------------

    def regression_opened(self, reg: Regression) -> None:
        """A new episode: remembered now, notified after group_wait (with the causes ranked by then).
        Calling it again for a known regression id is an update, so a restarted detector cannot double-alert.

        Every call takes an episode already saved in the store (agent.detection saves, then tells its
        listeners): an alert holds the regression's id, and each notification is built from the row as last
        saved. An episode that is not there is refused (StoreError)."""
        now = self._clock()
        with self._lock, self.store.transaction() as conn:
            table.open_alert(conn, reg, now + self.config.group_wait_seconds)
            woken = self._raise_severity(conn, reg, now)
        self._wake_all(woken)
        if reg.closed_at is not None:
            self.regression_closed(reg)
        else:
            self.tick()

    def regression_updated(self, reg: Regression) -> None:
        """Re-ranked causes or a new score: the next notification reads them from the store. A higher severity
        than the alert's is notified at once (an escalation); a lower one changes nothing (the alert keeps the
        highest)."""
        now = self._clock()
        with self._lock, self.store.transaction() as conn:
            woken = self._raise_severity(conn, reg, now)
        self._wake_all(woken)
        self.tick()

    def regression_closed(self, reg: Regression) -> None:
        """The episode is over: a firing notification first if none went out yet (or an escalation if it ended
        more severe than notified), then the resolve."""
        now = self._clock()
        woken: set[str] = set()
        with self._lock, self.store.transaction() as conn:
            row = table.alert_state(conn, reg.id)
            if row is None or row[1] == "resolved":
                return
            closed = reg if reg.closed_at is not None else dataclasses.replace(reg, closed_at=now)
            table.close_alert(conn, row[0], closed.closed_at)
            woken |= self._raise_severity(conn, closed, now)
            if row[1] == "waiting":
                # Closed inside group_wait: the receivers still hear it began, then that it ended.
                woken |= self._fire(conn, row[0], now)
            if self.config.resolve:
                woken |= self._queue(conn, row[0], "resolved", now)
            table.mark_resolved(conn, row[0])
        self._wake_all(woken)

    # ---- time-driven --------------------------------------------------------------------------------------

    def tick(self) -> None:
        """Queue what time has made due: first notifications after group_wait, repeats of firing alerts."""
        now = self._clock()
        due_before = now - self.config.repeat_interval_seconds
        # Read first: the scheduler calls this every second, and most calls find nothing to do.
        if not table.any_due(self.store, now, due_before):
            return
        woken: set[str] = set()
        with self._lock, self.store.transaction() as conn:
            for aid in table.waiting_due(conn, now):
                woken |= self._fire(conn, aid, now)
            for aid in table.repeats_due(conn, due_before):
                woken |= self._queue(conn, aid, "firing", now)
                table.mark_repeated(conn, aid, now)
        self._wake_all(woken)

    def _wake_all(self, receivers: set[str]) -> None:
        for name in receivers:
            self._wake(name)

    # ---- inside a transaction -------------------------------------------------------------------------------

    def _raise_severity(self, conn: sqlite3.Connection, reg: Regression, now: float) -> set[str]:
        """Keep the alert's severity the highest the regression reached. Before the first notification that is
        all; after it, an escalation: the alert at the new severity fires now (severity is a label, so it is a
        new alert to Alertmanager) and, in the same notification, the one it replaces is resolved."""
        alert = table.open_alert_of(conn, reg.id)
        if alert is None or not more_severe(reg.severity, alert.severity):
            return set()
        if alert.state == "waiting":
            table.set_severity(conn, alert.id, reg.severity)
            return set()
        old = alert.labels or {}
        # Only the severity changes: the other labels (the cause among them) stay as first sent, so routes,
        # silences and inhibit rules that match on them keep matching the escalated alert.
        labels = {**old, "severity": reg.severity}
        table.escalate(conn, alert.id, reg.severity, labels, payloads.fingerprint(labels), now)
        return self._queue(conn, alert.id, "firing", now,
                           replaced=Replaced(alert.severity, old, alert.fingerprint))

    def _fire(self, conn: sqlite3.Connection, alert_id: int, now: float) -> set[str]:
        """Freeze the labels (the cause label is the top cause now), then queue the first firing."""
        reg, severity = table.regression_of(conn, alert_id)
        # The highest severity seen while waiting, even if the latest window was milder.
        if more_severe(reg.severity, severity):
            severity = reg.severity
        labels = payloads.alert_labels(dataclasses.replace(reg, severity=severity), self.host)
        table.fire(conn, alert_id, labels, payloads.fingerprint(labels), severity, now)
        return self._queue(conn, alert_id, "firing", now)

    def _queue(self, conn: sqlite3.Connection, alert_id: int, status: str, now: float,
               replaced: Replaced | None = None) -> set[str]:
        alert = table.to_send(conn, alert_id)
        fp, severity, target = alert.fingerprint, alert.severity, alert.target
        # The alert's severity, not the latest window's: a regression that eased keeps its alert as sent.
        reg = dataclasses.replace(alert.regression, severity=severity)
        annotations = payloads.alert_annotations(reg, self.external_url, now)
        generator_url = payloads.regression_url(reg, self.external_url)
        event = AlertEvent(fingerprint=fp, status=status, labels=alert.labels, annotations=annotations,
                           starts_at=reg.opened_at, ends_at=reg.closed_at if status == "resolved" else None,
                           generator_url=generator_url, causes=tuple(reg.causes), functions=tuple(reg.functions),
                           escalated_from=replaced.severity if replaced else None)
        ended = None
        if replaced is not None and self.config.resolve:
            ended = AlertEvent(fingerprint=replaced.fingerprint, status="resolved", labels=replaced.labels,
                               annotations=annotations, starts_at=reg.opened_at, ends_at=now,
                               generator_url=generator_url, causes=tuple(reg.causes),
                               functions=tuple(reg.functions))
        woken = set()
        for r in self.receivers:
            if not r.wants(severity, target):
                continue
            # The replaced alert's end goes to those that were told it began.
            events = [event] + ([ended] if ended is not None and r.wants(ended.labels["severity"], target) else [])
            enqueue(conn, alert_id=alert_id, receiver=r.name, status=status, body=self.body(r, events, now),
                    now=now, owner=self._owner)
            woken.add(r.name)
        return woken

    def body(self, receiver: ReceiverConfig, events: list[AlertEvent], now: float) -> bytes:
        """One notification's body for this receiver: the alert, then (at an escalation) the alert it ends."""
        data = self._render(receiver, events, now)
        if len(data) > receiver.max_body_bytes:
            # The description is the only unbounded part (evidence text from the detector): cut it to fit.
            events = [dataclasses.replace(e, annotations={
                **e.annotations, "description": e.annotations["description"][:500] + " … (truncated)"})
                for e in events]
            data = self._render(receiver, events, now)
        return data

    def _render(self, receiver: ReceiverConfig, events: list[AlertEvent], now: float) -> bytes:
        if receiver.kind == "slack":
            return payloads.encode(payloads.slack(events[0]))
        if receiver.kind == "alertmanager":
            return payloads.encode(payloads.alertmanager_v2(
                events, firing_ends_at=now + self.config.repeat_interval_seconds + ALERTMANAGER_GRACE_SECONDS))
        return payloads.encode(payloads.webhook_v4(events, receiver.name, self.external_url))

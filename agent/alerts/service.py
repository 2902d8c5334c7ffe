"""The alerting side of the agent in one object: secrets, alerter, per-receiver workers and a scheduler thread."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.alerts.alerter import Alerter
from agent.alerts.delivery import DeliveryCounters, ReceiverWorker
from agent.alerts.metrics import AlertCollector
from agent.alerts.secrets import load_secret
from agent.alerts.view import alerts_view
from agent.config import Config
from agent.store import Store
from agent.store.alerts import Outbox, ReceiverSummary
from analysis.regression import Regression

log = logging.getLogger("infersight.alerts")
SCHEDULER_SECONDS = 1.0
# Finished notifications are kept this long for the page and `infersight alerts`, then pruned.
KEEP_DONE_SECONDS = 7 * 86400.0


def external_url(config: Config) -> str:
    if config.alerts.external_url:
        return config.alerts.external_url.rstrip("/")
    host, port = config.listen_address
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class AlertService:
    """Built by the daemon (and by tests, and by the delivery subprocess of the kill -9 test) from the config
    and the open store. Secrets are read here, so a bad secret file stops the agent at start with one line."""

    def __init__(self, config: Config, store: Store, *, clock: Callable[[], float] = time.time,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.store = store
        self.outbox = Outbox(store)
        self.counters = DeliveryCounters()
        self._clock = clock
        self._on_error = on_error
        secrets = {r.name: load_secret(r) for r in config.receivers}
        self.workers = {r.name: ReceiverWorker(r, secrets[r.name], self.outbox, config.alerts, self.counters,
                                               clock=clock, on_error=on_error)
                        for r in config.receivers}
        self.alerter = Alerter(config.alerts, config.receivers, store, host=config.alerts.host or socket.gethostname(),
                               external_url=external_url(config), clock=clock, wake=self._wake)
        self._stop = threading.Event()
        self._scheduler = threading.Thread(target=self._schedule, name="alerts-scheduler", daemon=True)

    # The detector's entry points (called from the collection loop; none of them waits on a receiver).
    def regression_opened(self, reg: Regression) -> None:
        self.alerter.regression_opened(reg)

    def regression_updated(self, reg: Regression) -> None:
        self.alerter.regression_updated(reg)

    def regression_closed(self, reg: Regression) -> None:
        self.alerter.regression_closed(reg)

    def start(self) -> None:
        for w in self.workers.values():
            w.start()
        self._scheduler.start()
        if self.workers:
            log.info("alerts: delivering to %s", ", ".join(f"{r.name} ({r.kind} {r.safe_url})"
                                                           for r in self.config.receivers))

    def stop(self) -> None:
        self._stop.set()
        if self._scheduler.is_alive():
            self._scheduler.join(5)
        # Every worker is told first, so shutdown waits for the slowest attempt in flight, not their sum.
        for w in self.workers.values():
            w.request_stop()
        for w in self.workers.values():
            w.stop()

    def summaries(self) -> list[ReceiverSummary]:
        return self.outbox.summaries([r.name for r in self.config.receivers])

    def view(self) -> dict[str, Any]:
        """For the status page and /api/alerts (handed to the app factory as ALERTS)."""
        return alerts_view(self.outbox, self.config.receivers, self._clock())

    def collector(self) -> AlertCollector:
        return AlertCollector(self.counters, self.outbox, [r.name for r in self.config.receivers], self._clock)

    def _wake(self, receiver: str) -> None:
        worker = self.workers.get(receiver)
        if worker is not None:
            worker.wake()

    def _schedule(self) -> None:
        last_prune = 0.0
        while not self._stop.wait(SCHEDULER_SECONDS):
            try:
                self.alerter.tick()
                now = self._clock()
                if now - last_prune > 3600:
                    self.outbox.prune(now - KEEP_DONE_SECONDS)
                    last_prune = now
            except Exception:  # the next tick retries; counted and logged so it shows on the page
                if self._on_error:
                    self._on_error("alerts")
                log.exception("alert scheduling failed")

"""Per-receiver delivery: one thread per receiver, exponential backoff with jitter, bounded retry age."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable

from agent.alerts.config import AlertsConfig, ReceiverConfig
from agent.alerts.secrets import Secret
from agent.alerts.signing import sign_headers
from agent.alerts.transport import PostResult, post
from agent.store.alerts import AGENT_OWNER, Notification, Outbox

log = logging.getLogger("infersight.alerts")
# How often an idle worker looks at the outbox even without a wake-up (another process may have queued).
IDLE_POLL_SECONDS = 1.0
MAX_ERROR_CHARS = 300


class DeliveryCounters:
    """Outcomes since start, by (receiver, status): sent, failed, expired, retried."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, receiver: str, status: str, n: int = 1) -> None:
        with self._lock:
            self._counts[(receiver, status)] += n

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


def backoff_seconds(attempts: int, config: AlertsConfig, rng: random.Random) -> float:
    """Exponential in the attempts made, capped, with "equal jitter": half fixed, half random, so retries of
    many notifications after one outage do not arrive in lock-step."""
    # The exponent is capped before the power: 2.0 ** 1024 overflows, and with a small backoff_max_seconds a
    # day of retries is tens of thousands of attempts. 2 ** 32 is past any max/initial ratio the config allows.
    doublings = min(max(0, attempts - 1), 32)
    delay = min(config.backoff_max_seconds, config.backoff_initial_seconds * 2.0 ** doublings)
    return delay / 2 + rng.uniform(0, delay / 2)


def endpoint(receiver: ReceiverConfig) -> str:
    if receiver.kind != "alertmanager":
        return receiver.url
    base = receiver.url.rstrip("/")
    return base if base.endswith("/api/v2/alerts") else f"{base}/api/v2/alerts"


class ReceiverWorker:
    """Delivers one receiver's notifications, in order per alert, until stopped; a hung receiver holds only
    this thread."""

    def __init__(self, receiver: ReceiverConfig, secret: Secret | None, outbox: Outbox, config: AlertsConfig,
                 counters: DeliveryCounters, *, owner: str = AGENT_OWNER, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, on_error: Callable[[str], None] | None = None) -> None:
        self.receiver = receiver
        self._secret = secret
        self._outbox = outbox
        self._config = config
        self._counters = counters
        self._owner = owner
        self._clock = clock
        self._rng = rng or random.Random()
        self._on_error = on_error
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"alerts-{receiver.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop and wait: at most one attempt in flight, which its timeout bounds."""
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout if timeout is not None else self.receiver.timeout_seconds + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.step():
                    continue
                wakeup = self._outbox.next_wakeup(self.receiver.name, self._owner)
                wait = IDLE_POLL_SECONDS if wakeup is None else min(IDLE_POLL_SECONDS,
                                                                    max(0.0, wakeup - self._clock()))
            except Exception:
                # A store hiccup must not end delivery; counted and logged, then retried after a pause, since a
                # failure after the POST leaves the notification due and an immediate retry would re-send it
                # in a tight loop.
                if self._on_error:
                    self._on_error("alerts")
                log.exception("alert delivery to %s failed", self.receiver.name)
                wait = IDLE_POLL_SECONDS
            self._wake.wait(wait)
            self._wake.clear()

    def step(self) -> bool:
        """Expire what is too old, then make one attempt if one is due; True when an attempt was made."""
        now = self._clock()
        expired = self._outbox.expire(self.receiver.name, self._owner, now, self._config.retry_max_age_seconds)
        if expired:
            self._counters.add(self.receiver.name, "expired", expired)
            log.warning("alerts: %d notification(s) to %s expired after %g s of retries", expired,
                        self.receiver.name, self._config.retry_max_age_seconds)
        n = self._outbox.next_due(self.receiver.name, self._owner, now)
        if n is None:
            return False
        self.attempt(n)
        return True

    def attempt(self, n: Notification) -> PostResult:
        headers = {**self.receiver.headers, "Idempotency-Key": n.idempotency_key}
        if self._secret is not None:
            headers.update(sign_headers(self._secret.reveal(), n.idempotency_key, n.body, self._clock()))
        result = post(endpoint(self.receiver), n.body, headers, timeout=self.receiver.timeout_seconds,
                      safe_url=self.receiver.safe_url)
        now = self._clock()
        error = result.error[:MAX_ERROR_CHARS] if result.error else None
        if result.accepted:
            self._outbox.record(n.id, state="sent", now=now, http_status=result.status, error=None)
            self._counters.add(self.receiver.name, "sent")
        elif result.retryable:
            delay = backoff_seconds(n.attempts + 1, self._config, self._rng)
            self._outbox.record(n.id, state="pending", now=now, http_status=result.status, error=error,
                                next_attempt_at=now + delay)
            self._counters.add(self.receiver.name, "retried")
            log.info("alerts: %s %s to %s not delivered (%s); retry in %.1f s", n.status, n.fingerprint,
                     self.receiver.name, error, delay)
        else:
            self._outbox.record(n.id, state="failed", now=now, http_status=result.status, error=error)
            self._counters.add(self.receiver.name, "failed")
            log.warning("alerts: %s %s to %s refused for good (%s)", n.status, n.fingerprint, self.receiver.name,
                        error)
        return result

"""A receiver's worker: backoff from backoff_initial_seconds, capped at backoff_max_seconds, equal jitter; and it
survives its store failing."""

from __future__ import annotations

import random
import time
from pathlib import Path

from agent.alerts.config import AlertsConfig, ReceiverConfig
from agent.alerts.delivery import IDLE_POLL_SECONDS, DeliveryCounters, ReceiverWorker, backoff_seconds
from agent.store import Store
from agent.store.alerts import Outbox

DRAWS = 500


def test_backoff_doubles_per_attempt_stops_at_the_max_and_jitters_within_50_to_100_percent() -> None:
    config = AlertsConfig(backoff_initial_seconds=1.5, backoff_max_seconds=60)
    rng = random.Random(14)
    nominal = [1.5, 3, 6, 12, 24, 48, 60, 60, 60, 60]
    for attempts, want in enumerate(nominal, start=1):
        delays = [backoff_seconds(attempts, config, rng) for _ in range(DRAWS)]
        assert all(want / 2 <= d <= want for d in delays), (attempts, min(delays), max(delays))
        # Spread over the whole band, not stuck at one end: that is what keeps retries out of lock-step.
        assert min(delays) < want * 0.52 and max(delays) > want * 0.98, (attempts, min(delays), max(delays))
        assert abs(sum(delays) / DRAWS - want * 0.75) < want * 0.03


def test_backoff_after_thousands_of_attempts_is_still_the_max() -> None:
    # With backoff_max_seconds = 1 a day of retries is 86,400 attempts; 2 ** 1024 no longer fits a float.
    config = AlertsConfig(backoff_initial_seconds=1.0, backoff_max_seconds=1.0)
    rng = random.Random(1)
    assert all(0.5 <= backoff_seconds(a, config, rng) <= 1 for a in (1024, 1025, 86_400, 10**9))


def test_backoff_is_reproducible_with_a_seeded_rng_and_differs_across_seeds() -> None:
    config = AlertsConfig()

    def run(seed: int) -> list[float]:
        rng = random.Random(seed)
        return [backoff_seconds(a, config, rng) for a in range(1, 12)]

    assert run(3) == run(3) and run(3) != run(4)


def test_a_failing_store_neither_ends_the_worker_nor_spins_it(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store")
    store.close()
    errors: list[str] = []
    worker = ReceiverWorker(ReceiverConfig(name="r", url="http://127.0.0.1:1/"), None, Outbox(store), AlertsConfig(),
                            DeliveryCounters(), on_error=errors.append)
    started = time.monotonic()
    worker.start()
    # A second error proves the thread lived on after the first; on a loaded host the polls come late, so wait.
    deadline = started + IDLE_POLL_SECONDS * 20
    while len(errors) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(IDLE_POLL_SECONDS * 1.5)
    worker.stop()
    elapsed = time.monotonic() - started
    assert len(errors) >= 2, errors
    # At most about one error per idle poll: many more would be a retry without pausing.
    assert len(errors) <= elapsed / IDLE_POLL_SECONDS + 2, (len(errors), elapsed)

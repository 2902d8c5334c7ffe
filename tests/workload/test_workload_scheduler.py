"""Scheduler in-process with a real engine: joins between steps, queue bound, surviving a failed step."""

import pytest
import torch
from prometheus_client import CollectorRegistry

from workload import tokenizer
from workload.config import ModelConfig
from workload.engine import Engine, Sequence, generate
from workload.metrics import create_metrics
from workload.scheduler import Event, QueueFull, Request, Scheduler, SchedulerConfig

SMALL = ModelConfig(n_layers=2, d_model=64, n_heads=2, d_mlp=128, max_seq=256)


@pytest.fixture
def scheduler():
    torch.set_num_threads(1)
    metrics = create_metrics(CollectorRegistry(), "t")
    started = Scheduler(Engine(SMALL, n_slots=4), SchedulerConfig(max_batch=4, batch_window_s=0.0, max_waiting=3),
                        metrics)
    started.start()
    yield started
    started.stop()


def drain(request: Request, timeout: float = 30.0) -> tuple[list[int], Event]:
    tokens = []
    while True:
        event = request.events.get(timeout=timeout)
        if event.kind != "token":
            return tokens, event
        tokens.append(event.token)


def test_new_request_joins_a_running_batch(scheduler: Scheduler) -> None:
    long = scheduler.submit(Sequence(tokenizer.encode("long one"), 200, 0.0), 9)
    for _ in range(5):
        assert long.events.get(timeout=30).kind == "token"
    short = scheduler.submit(Sequence(tokenizer.encode("short"), 5, 0.7, seed=4), 6)
    short_tokens, short_end = drain(short)
    assert short_end.detail == "length"
    assert not long.seq.done, "the short request waited for the long one to finish"
    long_tokens, _ = drain(long)
    assert len(long_tokens) == 195
    # Joining mid-flight changes nothing about either request's tokens.
    reference = Engine(SMALL, n_slots=1)
    assert short_tokens == generate(reference, [tokenizer.encode("short")], 5, 0.7, seed=4)[0]
    assert long.seq.generated == generate(reference, [tokenizer.encode("long one")], 200, 0.0)[0]


def test_queue_bound_raises_queue_full(scheduler: Scheduler) -> None:
    running = []
    for _ in range(4):  # one at a time, each past its first token: the four hold all four slots
        running.append(scheduler.submit(Sequence([256], 250), 1))
        assert running[-1].events.get(timeout=30).kind == "token"
    waiting = [scheduler.submit(Sequence([256], 3), 1) for _ in range(3)]
    with pytest.raises(QueueFull, match="3 requests already waiting"):
        scheduler.submit(Sequence([256], 3), 1)
    for request in running:
        request.cancel()
    for request in waiting:
        assert drain(request)[1].detail == "length"


def test_failed_step_fails_its_requests_and_the_loop_goes_on(scheduler: Scheduler) -> None:
    def explode(batch_size: int) -> None:
        raise RuntimeError("injected step failure")

    scheduler.step_hooks.append(explode)
    doomed = scheduler.submit(Sequence([256, 65], 4), 2)
    tokens, end = drain(doomed)
    assert end.kind == "error" and "injected step failure" in end.detail and tokens == []
    scheduler.step_hooks.remove(explode)
    assert scheduler.engine.pool.free == scheduler.engine.pool.n_slots
    fine = scheduler.submit(Sequence([256, 65], 4), 2)
    assert drain(fine)[1].detail == "length"
    assert scheduler.metrics.engine_errors.labels("t")._value.get() == 1


def test_cancelled_request_frees_its_slot(scheduler: Scheduler) -> None:
    request = scheduler.submit(Sequence([256], 250), 1)
    assert request.events.get(timeout=30).kind == "token"
    request.cancel()
    _, end = drain(request)
    assert end.detail == "abort"
    assert scheduler.engine.pool.free == scheduler.engine.pool.n_slots

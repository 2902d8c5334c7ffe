"""Real HTTP receivers on loopback for the alert tests: each records what arrived and answers as told."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.alerts.service import AlertService
from agent.config import config_from_dict
from agent.store import Store
from analysis.regression import Cause, FunctionShift, Regression


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Arrival:
    at: float
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int | None

    @property
    def doc(self):
        return json.loads(self.body)


@dataclass
class Receiver:
    """A loopback HTTP server. `answer(n)` gets the 0-based request number and returns (status, delay_s)."""

    port: int = field(default_factory=free_port)
    answer: object = None
    arrivals: list[Arrival] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    n = len(receiver.arrivals)
                    status, delay = receiver.answer(n) if receiver.answer else (200, 0.0)
                    receiver.arrivals.append(Arrival(time.time(), self.path, dict(self.headers), body,
                                                     None if delay else status))
                if delay:
                    time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the sender gave up waiting: that is the point of a slow receiver

            def log_message(self, *args) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def accepted(self) -> list[Arrival]:
        return [a for a in self.arrivals if a.answered is not None and 200 <= a.answered < 300]


@pytest.fixture
def receivers():
    started: list[Receiver] = []

    def make(answer=None, start: bool = True) -> Receiver:
        r = Receiver(answer=answer)
        if start:
            r.start()
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


def make_regression(rid: str = "r1", target: str = "workload", severity: str = "warning", opened_at: float = 1000.0,
                    closed_at: float | None = None, top: str = "gc") -> Regression:
    causes = [Cause(label=top, score=0.8, evidence=f"{top} evidence: 41 ms/s vs 0.8 ms/s (x51)", value=41.0,
                    baseline=0.8),
              Cause(label="cpu_contention", score=0.1, evidence="run-queue p99 2 ms vs 1.8 ms")]
    return Regression(id=rid, target=target, pid=4242, opened_at=opened_at, severity=severity, score=5.5,
                      causes=causes, functions=[FunctionShift("gc_heavy (workload/model.py:42)", 0.01, 0.3)],
                      closed_at=closed_at, baseline_start=opened_at - 900, baseline_end=opened_at - 60)


@pytest.fixture
def make_reg():
    return make_regression


def wait_for(pred, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def service_for(tmp_path: Path):
    made: list[tuple[AlertService, Store]] = []

    def build(receivers: list[dict], **alerts) -> AlertService:
        conf = config_from_dict({"store_dir": str(tmp_path / "store"), "receivers": receivers,
                                 "alerts": {"group_wait_seconds": 0, "backoff_initial_seconds": 0.1,
                                            "backoff_max_seconds": 0.5, "host": "h1",
                                            "external_url": "http://infersight.test:9464", **alerts}})
        store = Store.open(conf.store_dir)
        svc = AlertService(conf, store)
        svc.start()
        made.append((svc, store))
        return svc

    yield build
    for svc, store in made:
        svc.stop()
        store.close()


# What agent.detection does for every listener: the episode is saved first, then passed on. An alert reads its
# regression from the store, so a test tells the alerter (or AlertService) the same way.
def say_opened(listener, reg: Regression) -> None:
    listener.store.save_regression(reg)
    listener.regression_opened(reg)


def say_updated(listener, reg: Regression) -> None:
    listener.store.save_regression(reg)
    listener.regression_updated(reg)


def say_closed(listener, reg: Regression) -> None:
    listener.store.save_regression(reg)
    listener.regression_closed(reg)

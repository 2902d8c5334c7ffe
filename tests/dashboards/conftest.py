"""Fixtures for the status page: an app over a real AgentState holding a known window."""

import pytest
from flask import Config, Flask

import dashboards.app
from agent.metrics import build_registry
from agent.state import AgentState
from agent.store import ReadOnlyStore, Store
from analysis.health import Health
from analysis.snapshot import TargetStatus
from analysis.window import (
    GcReading,
    LatencyReading,
    Log2Histogram,
    OffCpuReading,
    ProcessReading,
    RunQueueReading,
    SyscallReading,
    TcpReading,
    Window,
)
from dashboards.app import create_app


def make_window(target="server", pid=4242, start=1000.0, end=1005.0) -> Window:
    return Window(
        target=target, pid=pid, start=start, end=end,
        syscalls=SyscallReading(counts={"futex": 120, "read": 30}),
        offcpu=OffCpuReading(seconds=2.5),
        gc=GcReading(collections=3, pause_seconds=0.012, max_pause_seconds=0.006,
                     histogram=Log2Histogram(unit="us", counts=[0] * 12 + [3])),
        tcp=TcpReading(retransmits=2),
        runqueue=RunQueueReading(histogram=Log2Histogram(unit="us", counts=[5, 10, 2]), total_seconds=0.0001),
        process=ProcessReading(cpu_seconds=2.0, rss_bytes=300 * 2**20, threads=9),
        latency=LatencyReading(p50_seconds=0.05, p95_seconds=0.09, p99_seconds=0.12, requests=40, request_rate=8.0),
        errors={"stacks": "py-spy exited: boom"},
    )


def make_bare_window(target="native", pid=5151, start=1000.0, end=1005.0) -> Window:
    """A non-Python target on a host with `tcp = false`: syscalls, off-CPU and the process only; the rest was not
    measured, each with its reason."""
    return Window(
        target=target, pid=pid, start=start, end=end,
        syscalls=SyscallReading(counts={"read": 7}), offcpu=OffCpuReading(seconds=0.5),
        process=ProcessReading(cpu_seconds=0.1, rss_bytes=2**20, threads=1),
        errors={"gc": "unsupported: pid 5151 (/usr/bin/sleep) is not a Python interpreter",
                "runqueue": "failed: BPF program failed to load", "stacks": "unsupported: not a Python process"},
    )


@pytest.fixture
def state():
    s = AgentState(clock=lambda: 2000.0)
    s.set_target(TargetStatus(name="server", pid=4242, state="watching", since=1000.0))
    s.set_health("syscalls", Health(name="syscalls", state="running"))
    s.set_health("gc", Health(name="gc", state="unsupported", reason="no gc_collect_main in /usr/bin/python3"))
    s.record_window(make_window())
    return s


@pytest.fixture
def bare_client():
    """The page and /metrics over a state whose one window lacks most readings (make_bare_window)."""
    s = AgentState(clock=lambda: 2000.0)
    s.set_target(TargetStatus(name="native", pid=5151, state="watching", since=1000.0))
    s.record_window(make_bare_window())
    return create_app({"STATE": s, "REGISTRY": build_registry(s), "TESTING": True}).test_client()


@pytest.fixture
def app(state):
    return create_app({"STATE": state, "REGISTRY": build_registry(state), "TESTING": True})


@pytest.fixture
def client(app):
    return app.test_client()


class _ReadOnlyStoreConfig(Config):
    """The page's config in these tests: any Store handed to create_app reaches the blueprints as its read-only
    handle (Store.read_only(), as the agent hands it), so every page test also shows the page never writes."""

    opened: list[ReadOnlyStore] = []

    def __setitem__(self, key, value) -> None:
        if key == "STORE" and isinstance(value, Store):
            value = value.read_only()
            self.opened.append(value)
        super().__setitem__(key, value)

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


class _ReadOnlyPage(Flask):
    config_class = _ReadOnlyStoreConfig


@pytest.fixture(scope="session", autouse=True)
def page_store_read_only():
    # Session-wide: module-scoped apps are built before any function-scoped fixture runs.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dashboards.app, "Flask", _ReadOnlyPage)
        yield
    for store in _ReadOnlyStoreConfig.opened:
        store.close()

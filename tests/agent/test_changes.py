"""agent.changes: a target's settled identity compared across its processes, `change` records in a real store, the
metric, and (with real processes) the allowlist end to end: no other variable's value anywhere it could leak."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.changes import ChangeCollector, ChangeTracker
from agent.identity import IdentityReader
from agent.store import Store
from agent.targets import Target, read_proc
from analysis.window import LatencyReading, Window

SECRET = "zz-not-allowlisted-41c9"
CHILD = "import sys, time, numpy\nm = open(sys.argv[1], 'rb')\nprint('ready', flush=True)\ntime.sleep(120)\n"


def _window(target: Target, i: int, serving: bool = True) -> Window:
    w = Window(target=target.name, pid=target.pid, start=1000.0 + 5 * i, end=1005.0 + 5 * i)
    if serving:
        w.latency = LatencyReading(p50_seconds=0.01, p95_seconds=0.02, p99_seconds=0.03, requests=10.0)
    else:
        w.errors["latency"] = "connection refused"
    return w


class Server:
    """A real process standing in for a server, restarted with other environments like a deploy would."""

    def __init__(self, tmp_path: Path) -> None:
        self.model = tmp_path / "model.safetensors"
        self.model.write_bytes(b"\0" * 2048)
        self.script = tmp_path / "child.py"
        self.script.write_text(CHILD)
        self.proc: subprocess.Popen | None = None

    def start(self, env: dict[str, str], args: tuple[str, ...] = ()) -> Target:
        self.stop()
        self.proc = subprocess.Popen([sys.executable, str(self.script), str(self.model), *args],
                                     stdout=subprocess.PIPE, text=True, env={"PATH": os.environ["PATH"], **env})
        assert self.proc.stdout.readline().strip() == "ready"
        info = read_proc(self.proc.pid)
        return Target(name="srv", pid=info.pid, start_time=info.start_time, cmdline=info.cmdline, spec=None)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.stop()


def _run(tracker: ChangeTracker, target: Target, windows: int, first: int = 0) -> list:
    return [c for i in range(first, first + windows) if (c := tracker.observe(target, _window(target, i)))]


def test_first_identity_restart_and_change(server, tmp_path):
    env = {"OMP_NUM_THREADS": "2", "API_TOKEN": SECRET}
    with Store.open(tmp_path / "store") as store:
        tracker = ChangeTracker(store, IdentityReader(), settle_windows=3, boot=lambda: 0.0, ticks_per_second=100.0)
        first = server.start(env)
        assert _run(tracker, first, 6) == []  # the first identity is no change
        assert store.target_identity("srv")[0] == first.pid
        again = server.start(env)
        assert _run(tracker, again, 6, 6) == []  # a restart, same identity
        assert store.target_identity("srv")[0] == again.pid and store.changes() == []
        changed = server.start({**env, "OMP_NUM_THREADS": "1"}, args=("--max-batch", "1"))
        found = _run(tracker, changed, 6, 12)
        assert len(found) == 1
        change = store.changes("srv")[0]
        assert [d["part"] for d in change.diff] == ["cmdline", "env"]
        assert change.diff[1] == {"part": "env", "before": "OMP_NUM_THREADS=2", "after": "OMP_NUM_THREADS=1"}
        # Dated from the new process's start, not from when it settled.
        assert change.at == pytest.approx(changed.start_time / 100.0)
        assert change.seen_at == 1005.0 + 5 * 14  # the window in which it settled (its third)
        assert change.pid == changed.pid and tracker.latest() == {"srv": change.at}


def test_not_settled_before_it_serves(server, tmp_path):
    with Store.open(tmp_path / "store") as store:
        tracker = ChangeTracker(store, IdentityReader(), settle_windows=2)
        target = server.start({})
        for i in range(5):
            tracker.observe(target, _window(target, i, serving=False))
        assert store.target_identity("srv") is None
        tracker.observe(target, _window(target, 5))
        assert store.target_identity("srv") is not None


def test_an_exited_process_stores_nothing(server, tmp_path):
    with Store.open(tmp_path / "store") as store:
        tracker = ChangeTracker(store, IdentityReader(), settle_windows=1)
        target = server.start({})
        server.stop()
        assert tracker.observe(target, _window(target, 0)) is None
        assert tracker.gone_reads == 1 and store.target_identity("srv") is None


def test_only_allowlisted_values_anywhere_even_after_restarts(server, tmp_path, caplog):
    """Ground truth: the secret variable's value is in the process's environ (checked), and in none of the store's
    files, the metrics, the logs, nor what the API and CLI read back; the allowlisted one is in the store."""
    caplog.set_level(logging.DEBUG)
    env = {"OMP_NUM_THREADS": "4", "VLLM_X": "y", "HF_TOKEN": SECRET}
    store_dir = tmp_path / "store"
    with Store.open(store_dir) as store:
        tracker = ChangeTracker(store, IdentityReader(), settle_windows=1)
        for n, extra in enumerate(({}, {}, {"OMP_NUM_THREADS": "8"})):
            target = server.start({**env, **extra})
            assert SECRET.encode() in Path(f"/proc/{target.pid}/environ").read_bytes()
            _run(tracker, target, 3, 3 * n)
        registry = CollectorRegistry()
        registry.register(ChangeCollector(tracker.latest))
        metrics = generate_latest(registry).decode()
        shown = repr([c.to_dict() for c in store.changes()]) + repr(store.target_identity("srv"))
        assert len(store.changes()) == 1
    raw = b"".join(p.read_bytes() for p in store_dir.iterdir() if p.is_file())
    assert SECRET.encode() not in raw and b"HF_TOKEN" not in raw
    assert b'"OMP_NUM_THREADS":"8"' in raw and b'"VLLM_X":"y"' in raw
    assert SECRET not in metrics and 'infersight_target_change_timestamp_seconds{target="srv"}' in metrics
    assert SECRET not in caplog.text and "OMP_NUM_THREADS=4 → OMP_NUM_THREADS=8" in caplog.text
    assert SECRET not in shown


def test_metric_is_when_the_identity_began_and_a_restart_keeps_it(server, tmp_path):
    with Store.open(tmp_path / "store") as store:
        tracker = ChangeTracker(store, IdentityReader(), settle_windows=1, boot=lambda: 0.0, ticks_per_second=100.0)
        first = server.start({})
        _run(tracker, first, 2)
        assert tracker.latest() == {"srv": pytest.approx(first.start_time / 100.0)}
        _run(tracker, server.start({}), 2, 2)
        assert store.identities_since() == {"srv": pytest.approx(first.start_time / 100.0)}
        # A new agent on the same store starts from what it recorded.
        again = ChangeTracker(store, IdentityReader())
        assert again.latest() == tracker.latest()


def test_cli_lists_changes_as_text_and_json(server, tmp_path, capsys):
    from agent.cli import main

    with Store.open(tmp_path / "store") as store:
        tracker = ChangeTracker(store, IdentityReader(), settle_windows=1)
        _run(tracker, server.start({"OMP_NUM_THREADS": "4"}), 2)
        _run(tracker, server.start({"OMP_NUM_THREADS": "1"}), 2, 2)
    assert main(["changes", "--store", str(tmp_path / "store")]) == 0
    text = capsys.readouterr().out
    assert "env" in text and "OMP_NUM_THREADS=4 → OMP_NUM_THREADS=1" in text
    assert main(["changes", "--store", str(tmp_path / "store"), "--json", "--target", "srv"]) == 0
    line = capsys.readouterr().out.strip()
    assert '"after": {' in line and '"OMP_NUM_THREADS": "1"' in line
    assert main(["changes", "--store", str(tmp_path / "nowhere")]) != 0
    assert "no store at" in capsys.readouterr().err


def test_a_per_process_target_leaves_no_identity_behind(server, tmp_path):
    import dataclasses

    with Store.open(tmp_path / "store") as store:
        tracker = ChangeTracker(store, IdentityReader(), settle_windows=1)
        named = server.start({})
        per_process = dataclasses.replace(named, name=f"srv#{named.pid}")
        _run(tracker, named, 1)
        _run(tracker, per_process, 1)
        assert set(store.identities_since()) == {"srv", f"srv#{named.pid}"}
        tracker.forget([])
        assert set(store.identities_since()) == {"srv"} and set(tracker.latest()) == {"srv"}

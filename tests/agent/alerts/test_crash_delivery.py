"""Delivery killed with SIGKILL mid-run and restarted, against receivers that refuse, time out, and answer 500
before 200: nothing lost, order kept, keys stable. Once as a stand-in process that builds AlertService the way
`infersight run` does and raises the regressions itself, once as the real `infersight run` daemon (root, BPF
probes loaded) with the regressions raised from outside through the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from agent.alerts.alerter import Alerter
from agent.alerts.service import external_url
from agent.alerts.signing import verify
from agent.config import load_config
from agent.store import Store
from analysis.regression import Cause, Regression
from tests.agent.alerts.conftest import say_closed, say_opened
from tests.live import free_port, terminate, wait_http

REPO = Path(__file__).resolve().parents[3]
RAISED = 6
SECRET = b"kill-nine-secret"

# The same objects `infersight run` builds: config from the file, the store, AlertService and its threads.
DELIVERY = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from agent import logs
    from agent.config import load_config
    from agent.store import Store
    from agent.alerts.service import AlertService
    from analysis.regression import Cause, Regression

    config = load_config(Path(sys.argv[1]))
    logs.setup("debug")
    store = Store.open(config.store_dir)
    service = AlertService(config, store)
    service.start()
    base = 1_800_000_000.0
    for i in range(int(sys.argv[2])):
        reg = Regression(id=f"reg-{i}", target="workload", pid=100 + i, opened_at=base + 60 * i, severity="warning",
                         score=3.0, causes=[Cause("gc", 0.9, f"GC pause {i} ms/s vs 0.8 ms/s")])
        store.save_regression(reg)       # as the detector does: the episode first, then its listeners
        service.regression_opened(reg)   # a second call after a restart is an update, never a second alert
        print("opened", i, flush=True)
        time.sleep(0.2)
        reg.closed_at = base + 60 * i + 30
        store.save_regression(reg)
        service.regression_closed(reg)
        print("closed", i, flush=True)
    print("raised all", flush=True)
    while True:
        time.sleep(1)
""")


def start(config: Path, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DELIVERY, str(config), str(RAISED)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=log, text=True)


def read_until(proc: subprocess.Popen, line: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = proc.stdout.readline()
        if not got:
            raise AssertionError(f"delivery process ended before {line!r} (rc {proc.poll()})")
        if got.strip() == line:
            return
    raise AssertionError(f"no {line!r} within {timeout} s")


def all_in(receivers, raised: int) -> bool:
    """Every receiver accepted a firing and a resolve of every alert."""
    return all(len({(a.doc["alerts"][0]["fingerprint"], a.doc["status"]) for a in r.accepted()}) == 2 * raised
               for r in receivers)


def check_delivered(r, raised: int) -> None:
    accepted = r.accepted()
    # The count of distinct alerts equals what was raised.
    assert len({a.doc["alerts"][0]["fingerprint"] for a in accepted}) == raised
    assert {a.doc["alerts"][0]["labels"]["regression"] for a in accepted} == {f"reg-{i}" for i in range(raised)}
    # Duplicates (a retry of something the receiver may have processed) carry the same key and body.
    by_key = defaultdict(set)
    for a in r.arrivals:
        by_key[a.headers["Idempotency-Key"]].add(a.body)
    assert all(len(bodies) == 1 for bodies in by_key.values())
    # Exactly one key per (alert, status): nothing was queued twice, before or after the restart.
    assert len(by_key) == 2 * raised
    # Firing before resolved: no resolve even arrived before its firing had been accepted.
    for fp in {a.doc["alerts"][0]["fingerprint"] for a in accepted}:
        fired = min(a.at for a in accepted if a.doc["alerts"][0]["fingerprint"] == fp and a.doc["status"] == "firing")
        first_resolve = min(a.at for a in r.arrivals
                            if a.doc["alerts"][0]["fingerprint"] == fp and a.doc["status"] == "resolved")
        assert fired < first_resolve


def alerts_toml(refusing, slow, flaky) -> str:
    """The [alerts] table and the three receivers both kill -9 tests deliver to."""
    return textwrap.dedent(f"""
        [alerts]
        group_wait_seconds = 0.3
        backoff_initial_seconds = 0.2
        backoff_max_seconds = 1.0
        host = "crash-host"
        [[receivers]]
        name = "refusing"
        url = "{refusing.url}"
        timeout_seconds = 1
        [[receivers]]
        name = "slow"
        url = "{slow.url}"
        timeout_seconds = 1
        [[receivers]]
        name = "flaky"
        url = "{flaky.url}"
    """)


@pytest.mark.slow
def test_kill_nine_mid_delivery_loses_nothing(tmp_path: Path, receivers) -> None:
    refusing = receivers(start=False)   # nothing listens on its port until later
    slow = receivers(answer=lambda n: (200, 3.0) if n < 3 else (200, 0.0))
    flaky = receivers(answer=lambda n: (500, 0.0) if n < 5 else (200, 0.0))
    signed = receivers()
    secret = tmp_path / "signed.secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    config = tmp_path / "infersight.toml"
    config.write_text('store_dir = "store"\n' + alerts_toml(refusing, slow, flaky) + textwrap.dedent(f"""
        [[receivers]]
        name = "signed"
        url = "{signed.url}"
        hmac_secret_file = "signed.secret"
    """))
    config.chmod(0o644)
    log = open(tmp_path / "delivery.log", "w")
    first = start(config, log)
    try:
        read_until(first, "closed 2", 30)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    with Store.open(tmp_path / "store") as store:
        (pending,), = store.query("SELECT COUNT(*) FROM alert_notifications WHERE state = 'pending'")
    assert pending > 0, "the kill should land while notifications are still queued"

    second = start(config, log)
    try:
        read_until(second, "raised all", 30)
        refusing.start()

        deadline = time.monotonic() + 60
        while not all_in((refusing, slow, flaky, signed), RAISED) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all_in((refusing, slow, flaky, signed), RAISED), {r.url: len(r.accepted())
                                                                  for r in (refusing, slow, flaky, signed)}
    finally:
        second.kill()
        second.wait(10)
        log.close()

    for r in (refusing, slow, flaky, signed):
        check_delivered(r, RAISED)
    assert all(verify(SECRET, a.headers, a.body) for a in signed.arrivals)
    logged = (tmp_path / "delivery.log").read_text()
    assert "connection refused by http://127.0.0.1:" in logged and "timed out after 1 s" in logged
    assert SECRET.decode() not in logged
    assert len(slow.arrivals) > len(slow.accepted()) and len(flaky.arrivals) > len(flaky.accepted())


def raise_regressions(alerter: Alerter, numbers: range) -> None:
    """What the daemon's detector listener does for an episode, from outside: the store is the only channel."""
    base = 1_800_000_000.0
    for i in numbers:
        reg = Regression(id=f"reg-{i}", target="workload", pid=100 + i, opened_at=base + 60 * i, severity="warning",
                         score=3.0, causes=[Cause("gc", 0.9, f"GC pause {i} ms/s vs 0.8 ms/s")])
        say_opened(alerter, reg)
        time.sleep(0.2)
        reg.closed_at = base + 60 * i + 30
        say_closed(alerter, reg)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.bpf
def test_kill_nine_of_the_real_daemon_mid_delivery_loses_nothing(require_bpf, tmp_path: Path, receivers) -> None:
    refusing = receivers(start=False)
    slow = receivers(answer=lambda n: (200, 3.0) if n < 2 else (200, 0.0))
    flaky = receivers(answer=lambda n: (500, 0.0) if n < 5 else (200, 0.0))
    all_receivers = (refusing, slow, flaky)
    agent_port = free_port()
    os.chmod(tmp_path, 0o700)
    config_path = tmp_path / "infersight.toml"
    config_path.write_text(textwrap.dedent(f"""
        interval_seconds = 2
        store_dir = "store"
        listen = "127.0.0.1:{agent_port}"
        [[targets]]
        name = "workload"
        process_regex = "no-such-process-{agent_port}-kill-nine"
    """) + alerts_toml(refusing, slow, flaky))
    config_path.chmod(0o644)
    config = load_config(config_path)
    log = open(tmp_path / "agent.log", "w")

    def run_agent() -> subprocess.Popen:
        agent = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config_path)], cwd=REPO,
                                 stdout=log, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{agent_port}/api/status", 60)
        # A whole agent, BPF probes loaded, is what gets killed; not one still starting up.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{agent_port}/api/status", timeout=5) as resp:
                sources = json.load(resp)["sources"]
            if sources and all(src["state"] == "running" for src in sources):
                return agent
            time.sleep(0.3)
        raise AssertionError(f"the agent's sources did not all start: {sources}")

    first = second = None
    try:
        first = run_agent()
        with Store.open(config.store_dir) as store:
            alerter = Alerter(config.alerts, config.receivers, store, host="crash-host",
                              external_url=external_url(config))
            raise_regressions(alerter, range(0, 3))
            # Killed while the slow receiver holds an attempt open: that notification is in flight.
            deadline = time.monotonic() + 30
            while not slow.arrivals and time.monotonic() < deadline:
                time.sleep(0.02)
            assert slow.arrivals, "the agent never tried the slow receiver"
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
            (pending,), = store.query("SELECT COUNT(*) FROM alert_notifications WHERE state = 'pending'")
            assert pending > 0, "the kill should land while notifications are still queued"
            # Raised while no agent runs: the next one must deliver them too.
            raise_regressions(alerter, range(3, RAISED))
        second = run_agent()
        refusing.start()
        deadline = time.monotonic() + 60
        while not all_in(all_receivers, RAISED) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all_in(all_receivers, RAISED), {r.url: len(r.accepted()) for r in all_receivers}
    finally:
        if first is not None and first.poll() is None:
            first.kill()
            first.wait(10)
        terminate(second)
        log.close()

    assert second.returncode == 0, "the restarted agent did not stop cleanly"
    for r in all_receivers:
        check_delivered(r, RAISED)
    assert len(slow.arrivals) > len(slow.accepted()) and len(flaky.arrivals) > len(flaky.accepted())
    # The attempt in flight at the kill was made again, under the same key.
    in_flight = slow.arrivals[0].headers["Idempotency-Key"]
    assert sum(a.headers["Idempotency-Key"] == in_flight for a in slow.arrivals) >= 2
    logged = (tmp_path / "agent.log").read_text()
    assert "connection refused by http://127.0.0.1:" in logged and "timed out after 1 s" in logged
    assert "Traceback" not in logged and logged.count('"msg": "stopped"') == 1

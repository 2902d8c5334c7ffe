"""`infersight alert test` and `infersight alerts` as a user runs them (subprocesses) against real receivers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from agent.alerts.service import AlertService
from agent.config import load_config
from agent.store import Store
from tests.agent.alerts.conftest import say_opened

REPO = Path(__file__).resolve().parents[3]
SECRET = "cli-secret-do-not-print"
# Not hex and not a word the output uses, so it cannot appear by chance (a random
# delivery key once contained "abc").
QUERY_TOKEN = "qtok-Zx9-redact-me"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def write_config(tmp_path: Path, receivers: list[str], secret_mode: int = 0o600) -> Path:
    secret = tmp_path / "ops.secret"
    secret.write_text(SECRET)
    secret.chmod(secret_mode)
    path = tmp_path / "infersight.toml"
    path.write_text('store_dir = "store"\n[alerts]\ngroup_wait_seconds = 0\n' + "\n".join(receivers))
    path.chmod(0o600)  # receivers may hold credentials: docs/security.md
    return path


def receiver_toml(name: str, url: str, extra: str = "") -> str:
    return textwrap.dedent(f"""
        [[receivers]]
        name = "{name}"
        url = "{url}"
        targets = ["only-this-one"]
        {extra}
    """)


def test_alert_test_sends_firing_then_resolved_and_exits_0(tmp_path: Path, receivers) -> None:
    r = receivers()
    conf = write_config(tmp_path, [receiver_toml("ops", r.url, 'hmac_secret_file = "ops.secret"')])
    done = cli("alert", "test", "--receiver", "ops", "--config", str(conf))
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()[1:]] == ["firing", "resolved"]
    assert "accepted, HTTP 200" in done.stdout and SECRET not in done.stdout + done.stderr
    assert [a.doc["status"] for a in r.arrivals] == ["firing", "resolved"]
    assert {a.doc["alerts"][0]["labels"]["target"] for a in r.arrivals} == {"infersight-test"}
    assert all(a.headers["X-Infersight-Signature"].startswith("sha256=") for a in r.arrivals)


def test_alert_test_exits_1_when_not_accepted_and_leaves_nothing_pending(tmp_path: Path, receivers) -> None:
    r = receivers(answer=lambda n: (503, 0.0))
    conf = write_config(tmp_path, [receiver_toml("ops", r.url)])
    done = cli("alert", "test", "--receiver", "ops", "--config", str(conf))
    assert done.returncode == 1
    assert "firing: NOT accepted: HTTP 503" in done.stdout and "resolved: not sent" in done.stdout
    assert len(r.arrivals) == 1
    with Store.open(tmp_path / "store") as store:
        assert store.query("SELECT state, COUNT(*) FROM alert_notifications GROUP BY state") == [("failed", 2)]


def test_alert_test_usage_errors_are_one_line(tmp_path: Path, receivers) -> None:
    r = receivers()
    conf = write_config(tmp_path, [receiver_toml("ops", r.url, 'hmac_secret_file = "ops.secret"')],
                        secret_mode=0o644)
    unknown = cli("alert", "test", "--receiver", "nope", "--config", str(conf))
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "infersight: no receiver named 'nope' (receivers: ops)"
    readable = cli("alert", "test", "--receiver", "ops", "--config", str(conf))
    assert readable.returncode == 2 and len(readable.stderr.strip().splitlines()) == 1
    assert "readable or writable by other users (mode 0644)" in readable.stderr and SECRET not in readable.stderr
    assert r.arrivals == []
    missing = cli("alert", "test", "--config", str(conf))
    assert missing.returncode == 2 and "--receiver" in missing.stderr


def test_alerts_lists_delivery_state(tmp_path: Path, receivers, make_reg) -> None:
    good = receivers()
    down = receivers(answer=lambda n: (500, 0.0))
    conf_path = write_config(tmp_path, [receiver_toml("good", good.url).replace('targets = ["only-this-one"]', ""),
                                        receiver_toml("down", down.url + "?token=" + QUERY_TOKEN).replace(
                                            'targets = ["only-this-one"]', "")])
    config = load_config(conf_path)
    with Store.open(config.store_dir) as store:
        service = AlertService(config, store)
        service.start()
        reg = make_reg("listed-1")
        say_opened(service, reg)
        deadline = time.monotonic() + 10
        while (not good.accepted() or not down.arrivals) and time.monotonic() < deadline:
            time.sleep(0.05)
        service.stop()
    done = cli("alerts", "--json", "--config", str(conf_path))
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    by = {r["name"]: r for r in view["receivers"]}
    assert by["good"]["sent"] == 1 and by["down"]["pending"] == 1 and "HTTP 500" in by["down"]["last_error"]
    assert by["down"]["url"].endswith("/hook?…") and QUERY_TOKEN not in done.stdout
    (alert,) = view["alerts"]
    assert alert["regression_id"] == "listed-1" and alert["state"] == "firing"
    assert {(n["receiver"], n["state"]) for n in alert["notifications"]} == {("good", "sent"), ("down", "pending")}
    text = cli("alerts", "--config", str(conf_path))
    assert text.returncode == 0
    assert "receiver down (webhook" in text.stdout and "1 pending" in text.stdout
    assert "alert listed-1 on workload: warning, firing" in text.stdout


def test_a_receiver_url_with_a_bad_port_is_one_config_line_not_a_traceback(tmp_path: Path) -> None:
    conf = write_config(tmp_path, [receiver_toml("ops", "http://u:tok@127.0.0.1:abc/hook")])
    for args in (("alerts",), ("alert", "test", "--receiver", "ops")):
        done = cli(*args, "--config", str(conf))
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [
            f"infersight: config error: {conf}: receivers[0].url: has an invalid port (must be a number within [1, 65535])"]
        assert "tok" not in done.stderr

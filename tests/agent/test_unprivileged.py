"""A real unprivileged local user (created here, removed after) cannot steer, stall or grow the root agent."""

import json
import os
import pwd
import signal
import socket
import subprocess
import time
import urllib.request
import uuid

import psutil
import pytest

from agent.config import Config, ProbesConfig, TargetSpec
from agent.daemon import Agent

pytestmark = [pytest.mark.root, pytest.mark.slow]

# The user's own code runs under the system Python: the venv lives under paths it need not be able to read.
USER_PYTHON = "/usr/bin/python3"


@pytest.fixture
def local_user(require_root):
    name = f"isx{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True, timeout=30)
    entry = pwd.getpwnam(name)
    started: list[subprocess.Popen] = []

    def spawn(argv: list[str], **kw) -> subprocess.Popen:
        # A session of its own: the whole tree (sh and its sleep) goes at teardown, or userdel refuses.
        proc = subprocess.Popen(argv, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/",
                                start_new_session=True, **kw)
        started.append(proc)
        return proc

    yield entry, spawn
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    subprocess.run(["userdel", name], check=True, capture_output=True, timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape_seconds(url: str) -> float:
    began = time.monotonic()
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        assert resp.status == 200
        resp.read()
    return time.monotonic() - began


# Run as the user: 20 slow profiles (kept open), a huge window list, a rebinding Host, then idle.
USER_ATTACK = r"""
import http.client, json, sys, threading, time
port = int(sys.argv[1])
out = {}
def profile(i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/debug/pprof/profile?seconds=30&target=" + ("root" if i % 2 else "x"))
    out.setdefault("profile", []).append(c.getresponse().status)
threads = [threading.Thread(target=profile, args=(i,), daemon=True) for i in range(20)]
for t in threads: t.start()
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("GET", "/api/windows?limit=10000")
out["windows"] = c.getresponse().status
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("GET", "/api/status", headers={"Host": "evil.example"})
out["rebind"] = c.getresponse().status
print(json.dumps(out), flush=True)
time.sleep(30)
"""


def test_an_unprivileged_user_cannot_steer_stall_or_grow_the_agent(local_user, tmp_path):
    user, spawn = local_user
    marker = f"infersight-bait-{uuid.uuid4().hex}"
    # 25 processes of the user that match the target's regex, and one of root's.
    baits = [spawn(["sh", "-c", "sleep 120", marker]) for _ in range(25)]
    root_bait = subprocess.Popen(["sh", "-c", "sleep 120", marker], start_new_session=True)
    port = _free_port()
    config = Config(store_dir=tmp_path / "store", listen=f"127.0.0.1:{port}", interval_seconds=1.0,
                    probes=ProbesConfig(syscalls=False, offcpu=False, gc=False, tcp=False, runqueue=False),
                    targets=(TargetSpec(name="root", process_regex=marker),))
    agent = Agent(config)
    url = f"http://127.0.0.1:{port}"
    me = psutil.Process()
    try:
        agent.web.start()
        agent.loop.start()
        agent.loop.tick()
        agent.loop.tick()
        # Steer: only root's process is watched; no py-spy runs on a user's process.
        assert [t.pid for t in agent.loop.watched] == [root_bait.pid]
        bait_pids = {str(b.pid) for b in baits}
        for child in me.children(recursive=True):
            try:
                argv = child.cmdline()
            except (psutil.ZombieProcess, psutil.NoSuchProcess):
                continue  # ended (another test's leftover): nothing that runs now; `watched` above is the proof
            assert not bait_pids & set(argv), f"agent started {argv} on a user's process"
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert 'infersight_target_processes_skipped{reason="not_allowed_user",target="root"} 25.0' in metrics
        with urllib.request.urlopen(f"{url}/", timeout=10) as resp:
            assert "25 owned by users not in allowed_users" in resp.read().decode()

        # Stall and grow: the user's requests, while root scrapes.
        rss_before = me.memory_info().rss
        attack = spawn([USER_PYTHON, "-c", USER_ATTACK, str(port)], stdout=subprocess.PIPE, text=True)
        said = json.loads(attack.stdout.readline())
        assert said["windows"] == 400 and said["rebind"] == 421, said
        worst = max(_scrape_seconds(url) for _ in range(10))
        assert worst < 0.1, f"/metrics took {worst * 1000:.0f} ms while the user held 20 profiles open"
        assert me.memory_info().rss - rss_before < 50 << 20
        assert os.stat(tmp_path / "store" / "infersight.db").st_mode & 0o077 == 0, "the user could read the store"
    finally:
        agent.loop.close()
        agent.web.stop()
        agent.store.close()
        agent.lock.release()
        os.killpg(root_bait.pid, signal.SIGKILL)
        root_bait.wait()


def test_connections_held_by_a_user_leave_metrics_answering(local_user):
    # Fails before the per-user limit: the user's 1,100 connections, each sent a byte every 3 s so that none is
    # ever idle, filled the server's 1,000 and no scrape was answered within 60 s (tests/agent/bench_held_connections.py
    # reproduces both figures).
    from tests.agent.bench_held_connections import scrape_seconds, serve_agent_app, start_holder, stop_holder

    user, _ = local_user
    web, port = serve_agent_app()
    holder = None
    try:
        holder = start_holder(user, port, 1100, 3.0, eager=False)
        time.sleep(7)  # two of the user's rounds: every connection has been accepted or refused by now
        took = [scrape_seconds(web.url, timeout=15) for _ in range(5)]
        assert max(took) < 1.0, f"/metrics took {[round(t, 2) for t in took]} s while the user held 1,100 connections"
        assert web.peer_limit.refused >= 1100 - 64
        held = [ch for ch in list(web._server.active_channels.values())
                if getattr(ch, "infersight_peer", None) == f"uid {user.pw_uid}"]
        assert 0 < len(held) <= 64, len(held)
    finally:
        if holder is not None:
            stop_holder(holder)
        web.stop()

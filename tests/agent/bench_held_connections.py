"""Measure /metrics latency while an unprivileged local user holds connections to the agent, trickling a byte each.

    sudo .venv/bin/python -m tests.agent.bench_held_connections --connections 1100 --scrapes 10

Creates a throwaway user, starts the agent's web server (agent.daemon.WebServer, the real one) over a real app,
and runs the user's script (system Python, as that user): it opens `--connections` TCP connections to the agent,
sends one byte of an endless request header on each every `--period` seconds (so none is ever idle), and
reconnects whatever the agent closes (`--eager`: at once; else at its next round). Once all are open, root scrapes
/metrics `--scrapes` times, a second apart, and the script prints each scrape's latency and the user's reconnects.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable

# Runs as the user, under the system Python. argv: port, connections, period, check (seconds between checks for
# connections the agent closed; equal to period unless eager).
HOLDER = r"""
import json, resource, socket, sys, time
port, n, period, check = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 64), hard))
HEADER = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000_000

def connect():
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    return [s, 0]

conns = [connect() for _ in range(n)]
reconnects = 0
print(json.dumps({"open": n}), flush=True)
next_byte = time.monotonic()
while True:
    now = time.monotonic()
    send = now >= next_byte
    if send:
        next_byte = now + period
    for c in conns:
        closed = False
        try:
            closed = c[0].recv(4096, socket.MSG_DONTWAIT) is not None  # data or EOF: the agent let go of it
        except BlockingIOError:
            pass
        except OSError:
            closed = True
        if not closed and send:
            try:
                c[1] += c[0].send(HEADER[c[1]:c[1] + 1])
            except BlockingIOError:
                pass  # still in the listen queue: the kernel holds the byte once it connects
            except OSError:
                closed = True
        if closed:
            c[0].close()
            c[:] = connect()
            reconnects += 1
    print(json.dumps({"reconnects": reconnects}), flush=True)
    time.sleep(check)
"""

USER_PYTHON = "/usr/bin/python3"


def make_user() -> tuple[pwd.struct_passwd, Callable[[], None]]:
    name = f"isx{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True, timeout=30)
    return pwd.getpwnam(name), lambda: subprocess.run(["userdel", name], check=True, capture_output=True, timeout=30)


def start_holder(user: pwd.struct_passwd, port: int, connections: int, period: float,
                 eager: bool) -> subprocess.Popen:
    proc = subprocess.Popen([USER_PYTHON, "-c", HOLDER, str(port), str(connections), str(period),
                             str(0.05 if eager else period)],
                            user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/", start_new_session=True,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    said = json.loads(proc.stdout.readline())
    assert said == {"open": connections}, said
    return proc


def last_reconnects(proc: subprocess.Popen) -> int:
    """The user's reconnect count so far (its stdout is read up to now without blocking)."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    count = 0
    for line in proc.stdout:
        count = json.loads(line).get("reconnects", count)
    return count


def stop_holder(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def scrape_seconds(url: str, timeout: float = 60.0) -> float:
    """Seconds for one /metrics answer; `timeout` when none came."""
    began = time.monotonic()
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as resp:
            resp.read()
            assert resp.status == 200
    except OSError:
        return timeout
    return time.monotonic() - began


def serve_agent_app():
    from agent.daemon import WebServer
    from agent.metrics import build_registry
    from agent.state import AgentState
    from dashboards.app import create_app

    state = AgentState()
    app = create_app({"STATE": state, "REGISTRY": build_registry(state)})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    web = WebServer(app, "127.0.0.1", port)
    web.start()
    return web, port


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=1100)
    parser.add_argument("--period", type=float, default=3.0)
    parser.add_argument("--eager", action="store_true", help="reconnect what the agent closes at once")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after the connections open")
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("must run as root (it creates a user)")
    from agent.daemon import raise_nofile

    raise_nofile()
    # A run stopped by timeout(1) still removes its user and its connections (the finally below).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    user, remove_user = make_user()
    web, port = serve_agent_app()
    holder = None
    try:
        holder = start_holder(user, port, args.connections, args.period, args.eager)
        time.sleep(args.settle)
        took = []
        for _ in range(args.scrapes):
            took.append(scrape_seconds(web.url))
            time.sleep(1.0)
        print(json.dumps({"connections": args.connections, "period_s": args.period, "eager": args.eager,
                          "scrape_s": [round(t, 3) for t in took], "max_s": round(max(took), 3),
                          "median_s": round(sorted(took)[len(took) // 2], 3),
                          "user_reconnects": last_reconnects(holder)}))
    finally:
        if holder is not None:
            stop_holder(holder)
        web.stop()
        remove_user()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

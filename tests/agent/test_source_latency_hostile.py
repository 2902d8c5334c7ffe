"""The latency scrape against hostile targets, each a real server in its own process (hostile_metrics.py): a drip,
a flood, a million series, a redirect, a port held by someone else. Each costs its own reading only: bounded in
time and memory, refused with a reason."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sources import listener as listener_mod
from agent.sources.latency import LatencySource
from agent.sources.listener import ListenerCheck, NotTheTarget
from agent.sources.scrape import DEFAULT_MAX_BODY_BYTES, MAX_LINE_BYTES, LineFilter
from analysis.errors import NoAnswer, ReadingError
from tests.agent.hostile_metrics import HOSTILE, IMPOSTOR, METRIC, wait_listening
from tests.live import free_port


@pytest.fixture
def hostile() -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(mode: str, *args: str, **popen) -> tuple[str, subprocess.Popen]:
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(HOSTILE), mode, str(port), *args], **popen)
        procs.append(proc)
        wait_listening(port, proc)
        return f"http://127.0.0.1:{port}/metrics", proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def scrape_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("scrape ")]


def test_a_target_that_drips_is_cut_off_at_the_deadline(hostile) -> None:
    # On main: urlopen's timeout is per receive, so a byte a second kept the read (and the tick) going for good.
    url, _ = hostile("drip")
    src = LatencySource(url, METRIC, timeout=2.0)
    began = time.monotonic()
    with pytest.raises(NoAnswer, match=r"did not answer: timed out, \d+ bytes in 2 s") as raised:
        src.read()
    took = time.monotonic() - began
    assert 1.9 <= took < 3.0, took
    assert raised.value.stage == "response"
    src.close()
    assert not scrape_threads(), "the scrape's thread outlived close()"


def test_a_flood_is_refused_at_the_byte_cap_and_never_held(hostile) -> None:
    url, _ = hostile("flood", "--bytes", str(1 << 30))  # 1 GiB, no Content-Length, made as it is sent
    src = LatencySource(url, METRIC, timeout=10.0)
    tracemalloc.start()
    began = time.monotonic()
    try:
        with pytest.raises(ReadingError, match=f"answered more than {DEFAULT_MAX_BODY_BYTES} bytes "
                                               r"\(max_body_bytes\); refused after reading \d+") as raised:
            src.read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    took = time.monotonic() - began
    assert not isinstance(raised.value, NoAnswer)  # it answered, too much: no news about the server being down
    read = int(str(raised.value).rsplit(" ", 1)[1])
    assert DEFAULT_MAX_BODY_BYTES < read <= DEFAULT_MAX_BODY_BYTES + 1
    # Streamed and filtered as it came: what Python held at once is a few chunks, not the 16 MiB read.
    assert peak < 2 << 20, peak
    assert took < 5.0, took
    src.close()


def test_an_announced_gigabyte_is_refused_before_its_body(hostile) -> None:
    url, _ = hostile("announce", "--bytes", str(1 << 30))
    src = LatencySource(url, METRIC, timeout=5.0, max_body_bytes=1 << 20)
    with pytest.raises(ReadingError, match=r"more than 1048576 bytes \(max_body_bytes\); refused after reading "
                                           r"(\d+)") as raised:
        src.read()
    assert int(str(raised.value).rsplit(" ", 1)[1]) < 1 << 20, "more than the headers was read"
    src.close()


def test_a_million_series_are_refused_after_the_cap_not_parsed(hostile) -> None:
    url, _ = hostile("series", "--metric", METRIC, "--series", "1000000")
    src = LatencySource(url, METRIC, timeout=10.0)  # the default max_series: 10,000
    began = time.monotonic()
    with pytest.raises(ReadingError, match=r"more than 10000 series of the families read \(max_series\)"):
        src.read()
    took = time.monotonic() - began
    # Stopped at the 10,001st line (~0.5 MB), not after the 40 MB: cheap, and nothing parsed.
    assert took < 2.0, took
    assert src.health().detail["last_body_bytes"] is None
    src.close()


def test_a_redirect_is_an_answer_never_followed(hostile) -> None:
    asked: list[str] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            asked.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            return None

    elsewhere = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    threading.Thread(target=elsewhere.serve_forever, daemon=True).start()
    try:
        to = f"http://127.0.0.1:{elsewhere.server_address[1]}/metrics?token=s3cret"
        url, _ = hostile("redirect", "--to", to)
        src = LatencySource(url, METRIC, timeout=2.0)
        with pytest.raises(ReadingError, match=r"HTTP 302, a redirect to 'http://127.0.0.1:\d+/metrics\?…', "
                                               r"which is not followed") as raised:
            src.read()
        assert "s3cret" not in str(raised.value)
        src.close()
    finally:
        elsewhere.shutdown()
        elsewhere.server_close()
    assert asked == [], "root was sent to fetch another address"


def test_close_stops_a_scrape_in_flight_at_once(hostile) -> None:
    url, _ = hostile("drip")
    src = LatencySource(url, METRIC, timeout=30.0)
    src.begin()
    time.sleep(0.5)
    assert scrape_threads(), "no scrape in flight"
    began = time.monotonic()
    src.close()
    assert time.monotonic() - began < 1.5
    assert not scrape_threads()


def test_at_most_one_scrape_per_target_is_in_flight() -> None:
    # A job that does not end at its deadline (a name lookup cannot be interrupted): the next reads say so and
    # start nothing, so a target cannot pile up threads.
    release = threading.Event()
    calls: list[float] = []

    def stuck(url: str, timeout: float) -> str:
        calls.append(time.monotonic())
        release.wait(30)
        return f"# TYPE {METRIC} histogram\n"

    src = LatencySource("http://127.0.0.1:1/metrics", METRIC, timeout=0.3, fetch=stuck)
    try:
        with pytest.raises(NoAnswer, match="did not answer: timed out"):
            src.read()
        for _ in range(3):
            with pytest.raises(NoAnswer, match="still running past its deadline; none other is started"):
                src.read()
        assert len(calls) == 1 and len(scrape_threads()) == 1
        release.set()
        deadline = time.monotonic() + 10
        while scrape_threads() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert src.read().requests == 0  # the first good scrape: the baseline
        assert len(calls) == 2
    finally:
        release.set()
        src.close()


def test_the_url_userinfo_is_sent_as_basic_auth() -> None:
    seen: list[str | None] = []

    class Auth(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization"))
            body = f"# TYPE {METRIC} histogram\n{METRIC}_bucket{{le=\"+Inf\"}} 1\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            return None

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Auth)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        src = LatencySource(f"http://scraper:p%40ss@127.0.0.1:{httpd.server_address[1]}/metrics", METRIC)
        src.prime()
        src.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert seen == ["Basic c2NyYXBlcjpwQHNz"]  # base64 of "scraper:p@ss"


def test_lines_of_the_families_read_are_bounded_and_others_skipped() -> None:
    lines = LineFilter((METRIC,), max_series=10)
    lines.feed(b"other_metric{x=\"" + b"y" * (3 * MAX_LINE_BYTES))  # arriving in pieces, never ending here
    lines.feed(b"y" * MAX_LINE_BYTES + b"\"} 1\n" + f"{METRIC}_count 3\n".encode())
    assert lines.finish() == f"{METRIC}_count 3\n" and lines.series == 1
    long = LineFilter((METRIC,), max_series=10)
    long.feed(f"{METRIC}_bucket{{le=\"+Inf\",x=\"".encode())
    with pytest.raises(ReadingError, match=f"a line of '{METRIC}_bucket' longer than {MAX_LINE_BYTES} bytes"):
        long.feed(b"y" * MAX_LINE_BYTES)  # refused as soon as it is too long, before it ends


# -- who answers --------------------------------------------------------------------------------


def test_a_port_held_by_another_process_is_refused_and_health_says_so(require_root) -> None:
    # The target restarted, and meanwhile another user bound its port and answers with made-up figures.
    port = free_port()
    impostor = subprocess.Popen(["/usr/bin/python3", "-c", IMPOSTOR, str(port)], user=65534, group=65534,
                                extra_groups=[], cwd="/")
    target = subprocess.Popen(["sleep", "60"])
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_listening(port, impostor)
        src = LatencySource(url, METRIC, timeout=2.0, owner_pids=lambda: (target.pid,))
        with pytest.raises(NotTheTarget, match=r"port \d+ is not the target's: it is held by a socket of uid 65534 "
                                               "that neither the target nor its descendants have open"):
            src.read()
        health = src.health()
        assert health.state == "failed" and "not the target's" in health.reason
        assert health.detail["owner"].startswith("refused: port") and "uid 65534" in health.detail["owner"]
        assert health.detail["scrapes"] == 0, "the impostor's answer was used"
        src.close()
    finally:
        for proc in (target, impostor):
            proc.kill()
            proc.wait()


def test_the_targets_own_port_is_checked_once_then_remembered(hostile, monkeypatch) -> None:
    url, server = hostile("normal")
    listed: list[int] = []
    real = listener_mod.socket_inodes

    def counting(pids, wanted, proc_root=Path("/proc")):
        listed.append(len(wanted))
        return real(pids, wanted, proc_root)

    monkeypatch.setattr(listener_mod, "socket_inodes", counting)
    src = LatencySource(url, METRIC, timeout=2.0, owner_pids=lambda: (server.pid,))
    src.prime()
    for _ in range(3):
        src.read()
    assert src.health().detail["owner"] == f"checked: port {url.split(':')[2].split('/')[0]} is listened on by " \
                                           f"the target (pid {server.pid})"
    assert listed == [1], "the target's fds were listed again although its listening socket did not change"
    src.close()


def test_a_port_held_by_the_targets_child_is_the_targets(hostile) -> None:
    # A launcher whose child serves (TGI's launcher and router): the launcher is the target, the child binds.
    port = free_port()
    launcher = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\n"
                                 "sys.exit(subprocess.call([sys.executable] + sys.argv[1:]))",
                                 str(HOSTILE), "normal", str(port)], start_new_session=True)
    try:
        wait_listening(port, launcher)
        src = LatencySource(f"http://127.0.0.1:{port}/metrics", METRIC, timeout=2.0, owner_pids=lambda: (launcher.pid,))
        src.prime()
        assert src.health().detail["owner"] == f"checked: port {port} is listened on by the target (pid {launcher.pid})"
        src.close()
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)  # the child server too
        launcher.wait()


def test_a_url_elsewhere_says_its_owner_was_not_checked() -> None:
    assert ListenerCheck("http://10.1.2.3:8000/metrics", lambda: (1,)).check() == \
        "not checked: 10.1.2.3 is not a loopback address"
    assert ListenerCheck("http://metrics.internal:8000/m", lambda: (1,)).check() == \
        "not checked: 'metrics.internal' is a name, not a loopback address"
    port = free_port()
    assert ListenerCheck(f"http://localhost:{port}/m", lambda: (1,)).check() == \
        f"not checked: nothing listens on port {port} in the agent's network namespace"


def test_every_listener_that_can_take_the_connection_must_be_the_targets() -> None:
    # The target holds 127.0.0.1:P; another socket on [::]:P (dual-stack) could take the connection too.
    port = free_port()
    mine = socket.socket()
    mine.bind(("127.0.0.1", port))
    mine.listen(1)
    check = ListenerCheck(f"http://127.0.0.1:{port}/metrics", lambda: (os.getpid(),))
    try:
        assert check.check().startswith("checked:")
        # Forked away, so it is no descendant of the target (this process).
        child = subprocess.Popen([sys.executable, "-c", "import os, socket, sys, time\n"
                                  "if os.fork(): os._exit(0)\n"
                                  "s = socket.socket(socket.AF_INET6)\n"
                                  "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)\n"
                                  f"s.bind(('::', {port})); s.listen(1); print(os.getpid(), flush=True)\n"
                                  "time.sleep(60)"],
                                 stdout=subprocess.PIPE, text=True)
        stray = int(child.stdout.readline())
        child.wait()
        try:
            # Its V6ONLY is not shown by the kernel: a `::` listener is counted as able to take IPv4 connections.
            with pytest.raises(NotTheTarget):
                check.check()
        finally:
            os.kill(stray, signal.SIGKILL)
    finally:
        mine.close()


def test_the_owner_check_costs_little_once_its_verdict_is_remembered() -> None:
    # Figures for docs/sources.md: `pytest -s -k owner_check_costs`. The listener is the process's last fd, the
    # worst place for the listing; the remembered check is one sock_diag query, whatever the fd count.
    held = [socket.socket() for _ in range(1000)]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    check = ListenerCheck(f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", lambda: (os.getpid(),))

    def mean_ms(fn, n: int) -> float:
        began = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - began) / n * 1000

    try:
        listing = mean_ms(lambda: (setattr(check, "_verified", None), check.check()), 20)
        remembered = mean_ms(check.check, 200)
        from_proc = mean_ms(lambda: listener_mod.proc_listeners(listener.getsockname()[1]), 20)
    finally:
        listener.close()
        for s in held:
            s.close()
    print(f"\nowner check, {len(held) + 1} fds: listing {listing:.2f} ms, remembered {remembered:.3f} ms; "
          f"/proc/net/tcp instead {from_proc:.2f} ms")
    assert remembered < 5.0, remembered

"""The collection loop on real processes and real probes: windows, unsupported targets, restarts, failures."""

import http.server
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from agent.collectors import Collectors
from agent.config import Config, LatencySpec, StacksConfig, TargetSpec
from agent.loop import CollectionLoop
from agent.state import AgentState
from agent.target_sources import source_factories
from tests.live import spawn_execd, start_port_drop

PY_CHILD = "import gc, os, sys, time\nwhile True:\n    gc.collect(); os.getppid(); time.sleep(0.02)\n"


def spawn(marker: str, code: str = PY_CHILD, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    # The marker in argv lets a process_regex spec find exactly this test's children. A listening socket in
    # `pass_fds` makes the child a holder of its port, as a server is (the latency scrape checks that).
    return spawn_execd([sys.executable, "-c", code, marker], pass_fds=pass_fds)


def stop(*procs):
    for p in procs:
        p.kill()
        p.wait()


def make_loop(specs, probes, sink, interval=1.0):
    config = Config(interval_seconds=max(1.0, interval), targets=tuple(specs), stacks=StacksConfig(enabled=False))
    state = AgentState()
    collectors = Collectors(probes, make_sources=lambda t: source_factories(t, config))
    loop = CollectionLoop(specs=specs, collectors=collectors, state=state, sink=sink, interval=interval)
    return loop, state


@pytest.mark.bpf
def test_windows_carry_probe_and_process_readings(require_bpf):
    child = spawn(f"loop-{uuid.uuid4().hex}")
    sleeper = subprocess.Popen(["sleep", "60"])
    windows = []
    specs = [TargetSpec(name="py", pid=child.pid), TargetSpec(name="sleeper", pid=sleeper.pid)]
    loop, state = make_loop(specs, ["syscalls", "gc", "offcpu"], windows.append)
    try:
        time.sleep(0.3)
        loop.start()
        time.sleep(1.0)
        loop.tick()
        time.sleep(1.0)
        loop.tick()
    finally:
        loop.close()
        stop(child, sleeper)
    by_target = {}
    for w in windows:
        by_target.setdefault(w.target, []).append(w)
    py, sl = by_target["py"], by_target["sleeper"]
    assert len(py) == 2 and len(sl) == 2
    # Consecutive windows share their boundary: nothing between them is lost or counted twice.
    assert py[0].end == py[1].start
    for w in py:
        assert w.syscalls.counts.get("getppid", 0) > 10
        assert w.gc.collections > 10
        # A single-threaded child: off-CPU + on-CPU = the window. psutil reads CPU time a little after the
        # probes' boundary and in 10 ms ticks; the probe's own tests check conservation exactly.
        assert w.offcpu.seconds > 0.5
        assert abs(w.offcpu.seconds + w.process.cpu_seconds - w.duration) < 0.05 + 0.05 * w.duration
        assert "gc" not in w.errors
    for w in sl:
        assert w.gc is None, "a probe that cannot trace the target gives no reading, not zeros"
        assert "unsupported" in w.errors["gc"] and "not a Python interpreter" in w.errors["gc"]
        assert w.syscalls is not None and w.offcpu.seconds > 0.9 * w.duration
        # `sleep` is blocked all along: no CPU, counted as a measured zero rather than left out.
        assert w.process is not None and w.process.cpu_seconds < 0.05 * w.duration, w.process
    health = state.snapshot().health
    assert health["gc"].state == "running"
    assert sleeper.pid in health["gc"].unsupported


@pytest.mark.bpf
def test_restarted_target_is_found_again_within_one_window(require_bpf):
    marker = f"restart-{uuid.uuid4().hex}"
    first = spawn(marker)
    windows = []
    loop, state = make_loop([TargetSpec(name="server", process_regex=marker)], ["syscalls", "gc"], windows.append)
    second = None
    try:
        time.sleep(0.3)
        loop.start()
        assert [t.pid for t in loop.watched] == [first.pid]
        time.sleep(1.0)
        loop.tick()
        stop(first)
        second = spawn(marker)
        time.sleep(0.5)
        report = loop.tick()  # the old pid's last window; the new pid is picked up at its end
        assert report.gone == ["server"] and report.added == ["server"]
        assert [t.pid for t in loop.watched] == [second.pid]
        time.sleep(1.0)
        loop.tick()
    finally:
        loop.close()
        stop(*(p for p in (first, second) if p))
    pids = [w.pid for w in windows]
    assert pids == [first.pid, first.pid, second.pid]
    # The new process's first window starts where the old one's last ended: at most that window is lost.
    assert windows[2].start == windows[1].end
    assert windows[2].gc.collections > 10, "probes re-attached to the new pid"
    assert state.snapshot().targets["server"].pid == second.pid


def test_a_failing_store_drops_the_window_and_counts_it():
    child = spawn(f"sink-{uuid.uuid4().hex}")
    calls = []

    def sink(w):
        calls.append(w)
        if len(calls) == 1:
            raise OSError("disk full")

    loop, state = make_loop([TargetSpec(name="py", pid=child.pid)], [], sink)
    try:
        loop.start()
        loop.tick()
        loop.tick()
    finally:
        loop.close()
        stop(child)
    snap = state.snapshot()
    assert snap.dropped_windows == 1 and snap.agent_errors["store"] == 1
    assert snap.windows_written == 1


def test_a_stalled_tick_is_counted_late_not_merged():
    child = spawn(f"late-{uuid.uuid4().hex}")
    windows = []

    def slow_sink(w):
        windows.append(w)
        if len(windows) == 1:
            time.sleep(0.9)  # the next tick is due 0.5 s into this stall

    loop, state = make_loop([TargetSpec(name="py", pid=child.pid)], [], slow_sink, interval=0.5)
    stop_event = threading.Event()
    runner = threading.Thread(target=loop.run, args=(stop_event,))
    try:
        runner.start()
        time.sleep(2.6)
    finally:
        stop_event.set()
        runner.join()
        loop.close()
        stop(child)
    assert state.snapshot().late_ticks >= 1
    # Every window still ends where the next begins: a late tick is a longer window, counted.
    for a, b in zip(windows, windows[1:]):
        assert a.end == b.start


def test_missing_target_is_shown_waiting_with_the_reason():
    loop, state = make_loop([TargetSpec(name="ghost", process_regex=f"nothing-{uuid.uuid4().hex}")], [],
                            lambda w: None)
    loop.start()
    loop.tick()
    loop.close()
    ghost = state.snapshot().targets["ghost"]
    assert ghost.state == "waiting" and "no process matches" in ghost.detail


def test_secrets_in_command_lines_are_hidden():
    from analysis.redact import redact_cmdline

    argv = ["python", "-m", "workload", "serve", "--admin-token", "s3cret", "--api-key=abc", "--port", "8000"]
    shown = redact_cmdline(argv)
    assert "s3cret" not in shown and "abc" not in shown
    assert shown == "python -m workload serve --admin-token *** --api-key=*** --port 8000"


def test_exited_targets_leave_no_series_in_metrics(tmp_path):
    """The whole agent's /metrics, detector series included, and what it keeps per target in memory."""
    import socket
    import urllib.request

    from agent.config import DetectorConfig, ProbesConfig
    from agent.daemon import Agent

    marker = f"stale-{uuid.uuid4().hex}"
    children = [spawn(marker) for _ in range(3)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = Config(store_dir=tmp_path / "store", listen=f"127.0.0.1:{port}", interval_seconds=1.0,
                    stacks=StacksConfig(enabled=False),
                    probes=ProbesConfig(syscalls=False, offcpu=False, gc=False, tcp=False, runqueue=False),
                    detector=DetectorConfig(warmup_windows=8), targets=(TargetSpec(name="py", process_regex=marker),))
    agent = Agent(config)

    def scrape(path: str) -> str:
        with urllib.request.urlopen(f"{agent.web.url}{path}", timeout=10) as resp:
            return resp.read().decode()

    try:
        agent.web.start()
        agent.loop.start()
        agent.loop.tick()
        text = scrape("/metrics")
        scrape("/api/overview")
        for c in children:
            assert f'infersight_target_pid{{target="py#{c.pid}"}}' in text
            assert f'infersight_detector_armed{{target="py#{c.pid}"}}' in text
        gone = [c.pid for c in children[1:]]
        stop(children[1], children[2])
        agent.loop.tick()  # notices the two exits; the survivor is now plain "py"
        agent.loop.tick()
        text = scrape("/metrics")
        scrape("/api/overview")
        snapshot = agent.detection.snapshot()
        tracked = set(agent.detection._tracked)
        sparklines = set(agent.app.extensions.get("infersight_sparklines", {}))
        saved = {pid: agent.store.detector_state(f"py#{pid}") for pid in gone}
    finally:
        agent.close()
        stop(children[0])
    stale = sorted({line for line in text.splitlines() if "py#" in line})
    assert not stale, f"series of exited or renamed targets remain: {stale[:5]}"
    assert 'infersight_target_pid{target="py"}' in text and 'infersight_detector_armed{target="py"}' in text
    assert set(agent.state.snapshot().targets) == {"py"}
    # Nothing kept per target grows with every process a regex ever matched.
    assert set(snapshot.findings) == tracked == sparklines == {"py"}
    assert saved == {pid: None for pid in gone}, "baselines of processes gone for good stay in the store"


def test_a_latency_endpoint_that_never_answers_is_marked_unanswered_and_a_wrong_answer_is_not():
    # A listening socket nobody accepts from: what a SIGSTOPped server looks like (the kernel still queues the
    # connection). Beside it, a server that answers, with an error status.
    class Overloaded(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_error(503, "overloaded")

        def log_message(self, *args):
            pass

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    answering = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Overloaded)
    threading.Thread(target=answering.serve_forever, daemon=True).start()
    children = [spawn(f"unanswered-{uuid.uuid4().hex}", pass_fds=(sock.fileno(),))
                for sock in (silent, answering.socket)]
    specs = [TargetSpec(name="stopped", pid=children[0].pid,
                        latency=LatencySpec(url=f"http://127.0.0.1:{silent.getsockname()[1]}/metrics", metric="x",
                                            timeout_seconds=0.3)),
             TargetSpec(name="erring", pid=children[1].pid,
                        latency=LatencySpec(url=f"http://127.0.0.1:{answering.server_address[1]}/metrics",
                                            metric="x", timeout_seconds=0.3))]
    windows = []
    loop, _ = make_loop(specs, [], windows.append)
    try:
        loop.start()
        loop.tick()
    finally:
        loop.close()
        stop(*children)
        answering.shutdown()
        answering.server_close()
        silent.close()
    by_target = {w.target: w for w in windows}
    stopped, erring = by_target["stopped"], by_target["erring"]
    assert stopped.latency is None and "did not answer" in stopped.errors["latency"]
    assert stopped.unanswered == ["latency"] and stopped.unreachable == []
    assert erring.latency is None and "HTTP 503" in erring.errors["latency"]
    assert erring.unanswered == []
    # The other sources of both read as usual.
    assert stopped.process is not None and erring.process is not None


def test_a_port_cut_off_by_nftables_is_marked_unreachable_and_a_silent_one_only_unanswered(require_root):
    # The kernel completes the handshake for a listener that never accepts (a stopped server): connected, no reply.
    # An nftables drop of the port's packets, or a reset in its place: no connection at all, but the target's
    # listener is still there. A port nothing listens on at all: refused, and `closed` too.
    silent, cut, reset = socket.socket(), socket.socket(), socket.socket()
    for s in (silent, cut, reset):
        s.bind(("127.0.0.1", 0))
        s.listen(8)
    cut_port, reset_port = cut.getsockname()[1], reset.getsockname()[1]
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        closed_port = gone.getsockname()[1]
    drops = [start_port_drop(cut_port, 60), start_port_drop(reset_port, 60, action="reset")]
    children = [spawn(f"unreachable-{uuid.uuid4().hex}", pass_fds=(sock.fileno(),)) for sock in (silent, cut, reset)]
    children.append(spawn(f"unreachable-{uuid.uuid4().hex}"))
    specs = [TargetSpec(name=name, pid=child.pid,
                        latency=LatencySpec(url=f"http://127.0.0.1:{port}/metrics", metric="x", timeout_seconds=0.5))
             for name, child, port in (("silent", children[0], silent.getsockname()[1]),
                                       ("cut", children[1], cut_port), ("reset", children[2], reset_port),
                                       ("closed", children[3], closed_port))]
    windows = []
    loop, _ = make_loop(specs, [], windows.append)
    try:
        loop.start()
        loop.tick()
    finally:
        loop.close()
        for drop in drops:
            drop.terminate()
            drop.wait(10)
        stop(*children)
        for sock in (silent, cut, reset):
            sock.close()
    by_target = {w.target: w for w in windows}
    assert by_target["silent"].unanswered == ["latency"] and by_target["silent"].unreachable == []
    assert by_target["cut"].unanswered == ["latency"] and by_target["cut"].unreachable == ["latency"]
    assert "unreachable" in by_target["cut"].errors["latency"]
    assert by_target["reset"].unreachable == ["latency"], by_target["reset"].errors
    assert [w.closed for w in windows if w.target != "closed"] == [[], [], []], "a firewall leaves the listener there"
    assert by_target["closed"].unreachable == ["latency"] and by_target["closed"].closed == ["latency"]
    assert f"nothing listens on port {closed_port}" in by_target["closed"].errors["latency"]


@pytest.mark.bpf
def test_a_named_target_whose_process_ends_is_down_with_how_it_ended(require_bpf):
    from prometheus_client import generate_latest

    from agent.metrics import build_registry
    from probes.exits import ExitsProbe

    marker = f"down-{uuid.uuid4().hex}"
    child = spawn(marker)
    downs, forgotten = [], []
    specs = [TargetSpec(name="server", process_regex=marker)]
    config = Config(interval_seconds=1.0, targets=tuple(specs), stacks=StacksConfig(enabled=False))
    state = AgentState()
    collectors = Collectors(["syscalls"], make_sources=lambda t: source_factories(t, config))
    loop = CollectionLoop(specs=specs, collectors=collectors, state=state, sink=lambda w: None, interval=1.0,
                          exits=ExitsProbe(), on_forget=forgotten.append,
                          on_down=lambda *args: downs.append(args))
    try:
        loop.start()
        time.sleep(0.5)
        loop.tick()
        subprocess.run(["kill", "-KILL", str(child.pid)], check=True)
        child.wait()
        report = loop.tick()
    finally:
        loop.close()
    assert report.gone == ["server"] and loop.watched == []
    [(name, pid, at, reason)] = downs
    assert (name, pid) == ("server", child.pid) and forgotten == ["server"]
    assert reason.startswith("killed by SIGKILL (signal 9) from pid ") and reason.endswith("(kill)")
    snap = state.snapshot()
    assert snap.targets["server"].state == "down" and snap.targets["server"].detail == f"pid {child.pid} {reason}"
    assert "server" not in snap.latest, "the gauges of a process that is no more go"
    assert snap.totals["server"].syscalls, "its counters stay"
    assert snap.health["exits"].state == "running"
    text = generate_latest(build_registry(state)).decode()
    assert 'infersight_target_up{target="server"} 0.0' in text
    assert 'infersight_syscalls_total{syscall=' in text and 'target="server"' in text


@pytest.mark.bpf
def test_a_non_python_target_with_tcp_off_exports_no_gc_and_no_tcp_series(require_bpf, tmp_path):
    """Live: the real agent, its real probes and /metrics; 'not measured' is never a 0 there nor on the page."""
    import socket
    import urllib.request

    from agent.config import DetectorConfig, ProbesConfig
    from agent.daemon import Agent

    marker = f"native-{uuid.uuid4().hex}"
    native = spawn_execd(["sh", "-c", "while :; do sleep 0.05; done", marker])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = Config(store_dir=tmp_path / "store", listen=f"127.0.0.1:{port}", interval_seconds=1.0,
                    stacks=StacksConfig(enabled=False), probes=ProbesConfig(tcp=False, offcpu=False),
                    detector=DetectorConfig(enabled=False), targets=(TargetSpec(name="native", process_regex=marker),))
    agent = Agent(config)
    try:
        agent.web.start()
        agent.loop.start()
        time.sleep(1.0)
        agent.loop.tick()
        with urllib.request.urlopen(f"{agent.web.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        with urllib.request.urlopen(f"{agent.web.url}/", timeout=10) as resp:
            page = resp.read().decode()
    finally:
        agent.close()
        stop(native)
    mine = [line for line in text.splitlines() if 'target="native"' in line and not line.startswith("#")]
    assert any(line.startswith("infersight_syscalls_total{") for line in mine), mine
    assert any(line.startswith("infersight_runqueue_latency_seconds_count{") for line in mine), mine
    unmeasured = ("infersight_gc_", "infersight_tcp_retransmits_total", "infersight_offcpu_seconds_total")
    assert [line for line in mine if line.startswith(unmeasured)] == []
    section = page[page.index("<h3>native"):]
    assert "<dt>GC</dt><dd><span class=\"meta not-measured\">not measured</span>" in section
    assert "<dt>TCP retransmits</dt><dd><span class=\"meta not-measured\">not measured</span>" in section


CLOSING_SERVER = r"""
import signal, sys, threading
from http.server import BaseHTTPRequestHandler, HTTPServer

served = [0]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        served[0] += 10
        n = served[0]
        body = (f'# TYPE lat histogram\nlat_bucket{{le="0.1"}} {n}\nlat_bucket{{le="+Inf"}} {n}\n'
                f'lat_sum {n * 0.05}\nlat_count {n}\n').encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = [None]


def open_port(*_):
    HTTPServer.allow_reuse_address = True
    server[0] = HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    threading.Thread(target=server[0].serve_forever, daemon=True).start()


def close_port(*_):
    server[0].shutdown()
    server[0].server_close()


open_port()
signal.signal(signal.SIGUSR1, close_port)
signal.signal(signal.SIGUSR2, open_port)
print("ready", flush=True)
while True:
    signal.pause()
"""


def test_a_server_that_closes_its_port_is_down_while_alive_and_back_when_it_listens_again(tmp_path):
    """Live: the real agent, a real server process that closes its listening socket (SIGUSR1) and opens it again
    (SIGUSR2) without exiting: `down` after closed_windows, up 0, then closed when it answers."""
    import signal
    import urllib.request

    from agent.config import DetectorConfig, ProbesConfig
    from agent.daemon import Agent
    from tests.live import free_port

    port, agent_port = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-c", CLOSING_SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline() == "ready\n"
    spec = TargetSpec(name="svc", pid=server.pid,
                      latency=LatencySpec(url=f"http://127.0.0.1:{port}/metrics", metric="lat", timeout_seconds=0.5))
    off = {name: False for name in ("syscalls", "offcpu", "gc", "tcp", "runqueue", "exits")}
    config = Config(store_dir=tmp_path / "store", listen=f"127.0.0.1:{agent_port}", interval_seconds=1.0,
                    stacks=StacksConfig(enabled=False), probes=ProbesConfig(**off),
                    detector=DetectorConfig(warmup_windows=8), targets=(spec,))
    agent = Agent(config)

    def up() -> str:
        with urllib.request.urlopen(f"{agent.web.url}/metrics", timeout=10) as resp:
            return next(line for line in resp.read().decode().splitlines()
                        if line.startswith('infersight_target_up{target="svc"}'))

    try:
        agent.web.start()
        agent.loop.start()
        for _ in range(3):
            agent.loop.tick()
        server.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the listener is gone: connecting is refused
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) != 0:
                    break
            time.sleep(0.05)
        agent.loop.tick()
        first_closed = agent.detection.is_down("svc")
        agent.loop.tick()
        down = agent.detection.snapshot().findings["svc"].regression
        while_down = up()
        server.send_signal(signal.SIGUSR2)
        time.sleep(0.3)
        agent.loop.tick()
        after = agent.detection.snapshot().findings["svc"]
        back = up()
        seen = [(w.latency is not None, w.closed, w.errors.get("latency")) for w in agent.store.windows(target="svc")]
        [stored] = [r for r in agent.store.regressions() if r.top_cause == "down"] or [None]
    finally:
        agent.close()
        stop(server)
    assert not first_closed, "one closed window is not yet an outage"
    assert down is not None and down.top_cause == "down", "\n".join(map(repr, seen))
    assert down.causes[0].evidence.startswith(f"pid {server.pid} is alive but serves no one: nothing listens on its "
                                              f"latency port for 2 windows")
    assert while_down.endswith(" 0.0") and back.endswith(" 1.0")
    assert after.state != "down" and stored.closed_at is not None

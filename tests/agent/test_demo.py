"""`make demo`'s own safety: the admin token never on a command line, stale servers and busy ports named."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from agent import demo
from tests.conftest import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"the workload at {url} did not come up within {timeout} s")


@pytest.mark.workload
def test_demo_server_token_is_in_a_0600_file_and_never_in_argv_or_environ(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    port = _free_port()
    os.chdir(REPO)
    token = "demo-secret-0123456789"
    server = demo.start_server(var, port, token)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url)
        argv = open(f"/proc/{server.pid}/cmdline", "rb").read()
        assert token.encode() not in argv, "the token is readable by every user in ps"
        # Nor in its environment, whose first copy /proc/PID/environ keeps for the server's whole life.
        assert token.encode() not in open(f"/proc/{server.pid}/environ", "rb").read()
        assert stat.S_IMODE(os.stat(var / "admin-token").st_mode) == 0o600
        assert (var / "admin-token").read_text().strip() == token
        fault = [sys.executable, "-m", "workload", "fault", "gc", "off", "--url", url]
        ok = subprocess.run([*fault, "--token-file", str(var / "admin-token")], capture_output=True, text=True,
                            cwd=REPO, timeout=30, env={k: v for k, v in os.environ.items()
                                                       if k != demo.ADMIN_TOKEN_ENV})
        assert ok.returncode == 0, ok.stderr
        # A token file others can read is refused with one line, before anything is sent.
        (var / "loose").write_text(token)
        os.chmod(var / "loose", 0o644)
        loose = subprocess.run([*fault, "--token-file", str(var / "loose")], capture_output=True, text=True,
                               cwd=REPO, timeout=30)
        assert loose.returncode == 2 and "chmod 600" in loose.stderr and "Traceback" not in loose.stderr
    finally:
        server.terminate()
        server.wait(timeout=20)


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def test_demo_names_a_busy_port_in_one_line(tmp_path, listener):
    run = subprocess.run([sys.executable, "-m", "agent.demo", "--var", str(tmp_path / "var"), "--port",
                          str(listener)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 1
    assert run.stderr.strip().count("\n") == 0 and f"port {listener} " in run.stderr, run.stderr
    assert f"by pid {os.getpid()}" in run.stderr and "--port" in run.stderr


def test_agent_on_a_busy_port_is_one_line_naming_it(tmp_path, listener):
    config = tmp_path / "infersight.toml"
    config.write_text(f'listen = "127.0.0.1:{listener}"\nstore_dir = "store"\n'
                      '[[targets]]\nname = "x"\npid = 1\n')
    os.chmod(tmp_path, 0o755)
    run = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"cannot listen on 127.0.0.1:{listener}: Address already in use" in run.stderr


def test_children_left_by_a_killed_demo_are_stopped_and_strangers_are_not(tmp_path):
    from agent import demo_guard

    var = tmp_path / "var"
    var.mkdir()
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        demo_guard.record_children(var, [(ours.pid, "workload")])
        # A recorded pid whose start time differs is a stranger that reused the pid.
        (var / demo_guard.PIDS_FILE).write_text((var / demo_guard.PIDS_FILE).read_text()
                                                + f"{stranger.pid} 1 load\n")
        said = demo_guard.stop_stale(var)
        assert said == [f"stopped the workload (pid {ours.pid}) left running by an earlier demo"]
        assert ours.wait(timeout=5) is not None and stranger.poll() is None
    finally:
        for p in (ours, stranger):
            p.kill()
            p.wait()


def test_demo_children_die_with_a_killed_demo():
    code = ("import subprocess, sys, time\nfrom agent.demo_guard import die_with_parent\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "preexec_fn=die_with_parent)\nprint(c.pid, flush=True)\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    child = int(parent.stdout.readline())
    parent.kill()  # kill -9 of the demo
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.1)
    os.kill(child, 9)
    pytest.fail(f"child {child} outlived the killed demo")


def test_a_second_agent_on_the_same_store_refuses_in_one_line(tmp_path):
    from agent.config import Config, TargetSpec
    from agent.daemon import Agent
    from agent.pidlock import AlreadyRunning

    store = tmp_path / "store"
    first = Agent(Config(store_dir=store, listen=f"127.0.0.1:{_free_port()}",
                         targets=(TargetSpec(name="x", pid=1),)))
    try:
        with pytest.raises(AlreadyRunning, match=f"another infersight agent \\(pid {os.getpid()}\\) is using"):
            Agent(Config(store_dir=store, listen=f"127.0.0.1:{_free_port()}", targets=(TargetSpec(name="x", pid=1),)))
    finally:
        first.store.close()
        first.web.stop()
        first.lock.release()
    again = Agent(Config(store_dir=store, listen=f"127.0.0.1:{_free_port()}", targets=(TargetSpec(name="x", pid=1),)))
    again.store.close()
    again.web.stop()
    again.lock.release()


# ---- the real demo, as a newcomer meets it -----------------------------------------------------------------------


class Demo:
    """`python -m agent.demo` as a child, its stdout and stderr lines collected as they come."""

    def __init__(self, var, *extra: str) -> None:
        import queue

        self.var, self.port, self.listen = var, _free_port(), f"127.0.0.1:{_free_port()}"
        self.argv = [sys.executable, "-m", "agent.demo", "--var", str(var), "--port", str(self.port),
                     "--listen", self.listen, *extra]
        self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.seen: list[tuple[str, str]] = []
        for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr)):
            threading.Thread(target=self._read, args=(name, stream), daemon=True).start()

    def _read(self, name, stream) -> None:
        for line in stream:
            self.lines.put((name, line.rstrip("\n")))

    def wait_line(self, needle: str, timeout: float, stream: str = "err") -> str:
        import queue

        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                name, line = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            self.seen.append((name, line))
            if name == stream and needle in line:
                return line
        pytest.fail(f"the demo did not say {needle!r} within {timeout} s; it said {self.seen[-15:]}")

    def wait_running(self) -> None:
        # The workload (torch) and the agent's probes (BPF compiles) start here; generous on a loaded CI host.
        self.wait_line("infersight demo is running", 300, stream="out")

    def children(self) -> dict[str, int]:
        return {name: int(pid) for pid, _, name in (line.split() for line in (self.var / "demo.pids").read_text()
                                                       .splitlines())}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=90)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _gone(pid: int) -> bool:
    """Not running and not a zombie: reaped (its /proc entry is gone), or never ours."""
    return not os.path.exists(f"/proc/{pid}")


def _health_pid(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
        return json.load(resp)["pid"]


@pytest.mark.slow
@pytest.mark.workload
@pytest.mark.bpf
def test_a_second_demo_says_so_in_one_line_and_leaves_the_first_alone(require_bpf, tmp_path):
    # Fails before the demo lock: the second demo stopped the first one's server and load as 'left running by an
    # earlier demo', then failed on the busy port, and the first carried on with no server, saying nothing.
    first = Demo(tmp_path / "var")
    try:
        first.wait_running()
        kids = first.children()
        second = subprocess.run(first.argv, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second
        assert second.stderr.strip().count("\n") == 0, second.stderr
        assert f"a demo is already running in {str(tmp_path / 'var')!r} (pid {first.proc.pid}, status page " \
               f"http://{first.listen}/)" in second.stderr
        assert first.proc.poll() is None and all(_alive(pid) for pid in kids.values()), kids
        assert first.children() == kids
        assert _health_pid(f"http://127.0.0.1:{first.port}") == kids["workload"]
        with urllib.request.urlopen(f"http://{first.listen}/api/status", timeout=10) as resp:
            assert resp.status == 200
    finally:
        code = first.stop()
    assert code == 0
    assert all(_gone(pid) for pid in kids.values())


@pytest.mark.slow
@pytest.mark.workload
@pytest.mark.bpf
def test_a_killed_server_is_reaped_said_in_one_line_and_restarted_with_its_load(require_bpf, tmp_path):
    # Fails before the demo watched its children: the killed server stayed a zombie, the load fired at a dead
    # port, and the demo said nothing.
    demo = Demo(tmp_path / "var")
    try:
        demo.wait_running()
        kids = demo.children()
        os.kill(kids["workload"], signal.SIGKILL)
        said = demo.wait_line(f"the workload server (pid {kids['workload']}) was killed by SIGKILL; restarting it", 30)
        assert "the status page shows the outage meanwhile" in said
        assert _gone(kids["workload"]), "the killed server was left a zombie"
        deadline = time.monotonic() + 30
        while not _gone(kids["load"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(kids["load"]), "the load kept firing at a dead port"
        back = demo.wait_line("the workload server is back (pid ", 240)
        new = int(back.split("(pid ")[1].split(")")[0])
        assert new != kids["workload"] and _health_pid(f"http://127.0.0.1:{demo.port}") == new
        now = demo.children()
        assert now["workload"] == new and now["load"] != kids["load"] and _alive(now["load"])
        assert int((demo.var / "workload.pid").read_text()) == new
        # The new load reaches the new server.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{demo.port}/metrics", timeout=10) as resp:
                text = resp.read().decode()
            count = [float(line.split()[-1]) for line in text.splitlines()
                     if line.startswith("vllm:e2e_request_latency_seconds_count")]
            if count and count[0] > 0:
                break
            time.sleep(1)
        else:
            pytest.fail("no request of the restarted load reached the restarted server within 60 s")
        assert demo.proc.poll() is None
    finally:
        code = demo.stop()
    assert code == 0
    assert _gone(now["workload"]) and _gone(now["load"])


@pytest.mark.slow
@pytest.mark.workload
@pytest.mark.bpf
def test_with_no_restarts_a_dead_server_stops_the_demo_in_one_line(require_bpf, tmp_path):
    demo = Demo(tmp_path / "var", "--restarts", "0")
    try:
        demo.wait_running()
        kids = demo.children()
        os.kill(kids["workload"], signal.SIGKILL)
        demo.wait_line(f"the workload server (pid {kids['workload']}) was killed by SIGKILL; stopping the demo "
                       f"(--restarts 0)", 30)
        assert demo.proc.wait(timeout=90) == 1
        demo.wait_line("infersight demo stopped", 10, stream="out")
        assert all(_gone(pid) for pid in kids.values())
        assert not (demo.var / "demo.pids").exists()
    finally:
        demo.stop()

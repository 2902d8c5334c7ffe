"""`make demo`'s own safety: the admin token never on a command line, stale servers and busy ports named."""

import os
import socket
import stat
import subprocess
import sys
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
def test_demo_server_token_is_in_a_0600_file_and_never_in_argv(tmp_path):
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

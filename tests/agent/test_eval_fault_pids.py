"""The pids of the processes a fault started, read from the server's /admin/debug to record them as the phase's
culprit (a `culprit = true` cpuhog phase): a stub server answers what the workload's debug endpoint answers."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agent.evaluation import processes


def _serve(body: dict[str, Any], token: str = "t0k"):
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization"))
            ok = self.path == "/admin/debug" and self.headers.get("Authorization") == f"Bearer {token}"
            data = json.dumps(body if ok else {"error": "no"}).encode()
            self.send_response(200 if ok else 403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    return httpd, processes.Server(proc=None, url=f"http://127.0.0.1:{port}", port=port, token=token), seen


@pytest.mark.parametrize("body, pids", [
    ({"cpuhog_pids": [903, 901]}, (901, 903)),  # one process: the server's own list
    ({"cpuhog_pids": [], "engine": {"cpuhog_pids": [77, 78]}}, (77, 78)),  # the fault placed in the engine process
])
def test_the_fault_s_processes_are_read_with_the_token(body: dict[str, Any], pids: tuple[int, ...]) -> None:
    httpd, server, seen = _serve(body)
    try:
        assert processes.fault_pids(server, "cpuhog") == pids
        assert seen == ["Bearer t0k"]
    finally:
        httpd.shutdown()


def test_a_fault_on_with_no_process_listed_or_a_refused_read_is_an_error_not_an_empty_culprit() -> None:
    httpd, server, _ = _serve({"cpuhog_pids": [], "engine": None})
    try:
        with pytest.raises(processes.EvalProcessError, match="lists none"):
            processes.fault_pids(server, "cpuhog")
        wrong = processes.Server(proc=None, url=server.url, port=server.port, token="other")
        with pytest.raises(processes.EvalProcessError, match="cannot read"):
            processes.fault_pids(wrong, "cpuhog")
    finally:
        httpd.shutdown()
    with pytest.raises(processes.EvalProcessError, match="starts no processes"):
        processes.fault_pids(server, "gc")

"""A loopback OTLP/HTTP endpoint for `bench overhead --otlp`: it answers 200 to every POST and keeps nothing, so
the agent's export is measured as it runs against a Collector that keeps up."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OtlpSink:
    def __init__(self) -> None:
        self.requests = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                sink.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="otlp-sink", daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

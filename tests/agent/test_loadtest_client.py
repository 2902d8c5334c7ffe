"""The load test's streamed completion against a real HTTP server that keeps its stream alive without data."""

import http.server
import threading
import time

from agent.loadtest.client import Endpoint, Shape, complete


class KeepAlive(http.server.BaseHTTPRequestHandler):
    """Answers 200 and 10 s of SSE comment lines, never a token (or until the client leaves)."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for _ in range(200):
                self.wfile.write(b": keepalive\n\n")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            return

    def log_message(self, *args):
        pass


def test_a_stream_of_comment_lines_still_ends_at_the_steps_deadline():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{server.server_address[1]}")
        began = time.monotonic()
        kind, latency, ttft, tokens, detail = complete(endpoint, "hello", 4, 1, Shape(timeout_s=2.0),
                                                       threading.Event())
        # The socket never idles for its 2 s timeout: only the per-line deadline check ends the request.
        assert (kind, ttft, tokens) == ("timeout", None, 0)
        assert detail == "still streaming when the step's time ran out"
        assert 2.0 <= latency and time.monotonic() - began < 30
    finally:
        server.shutdown()
        server.server_close()

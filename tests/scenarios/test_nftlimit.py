"""The bandwidth-limit command of the network scenarios: what the port sends is policed to the rate, the table
goes with the command, and a rate out of range is one clear line."""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

NFTLIMIT = Path(__file__).with_name("nftlimit.py")


def _table_exists(port: int) -> bool:
    return subprocess.run(["nft", "list", "table", "inet", f"infersight_limit_{port}"],
                          capture_output=True).returncode == 0


def _download_seconds(listener: socket.socket, size: int) -> float:
    """Seconds to receive `size` bytes the listening side sends (so its port is the one policed)."""
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"x" * size)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as client:
        got = 0
        while got < size:
            chunk = client.recv(65536)
            assert chunk, "connection closed early"
            got += len(chunk)
    thread.join()
    return time.monotonic() - t0


def test_a_limit_polices_what_the_port_sends_and_the_table_leaves_with_the_command(require_root):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        assert _download_seconds(listener, 200_000) < 2.0
        limit = subprocess.Popen([sys.executable, str(NFTLIMIT), str(port), "60", "50"], stderr=subprocess.PIPE,
                                 text=True)
        try:
            deadline = time.monotonic() + 10
            while not _table_exists(port) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _table_exists(port)
            # 200 kB at 50 kB/s: 4 s at the least (the policer's burst lets a little more through at first).
            assert _download_seconds(listener, 200_000) > 2.5
        finally:
            limit.terminate()
            assert limit.wait(10) == 0, limit.stderr.read()
        assert not _table_exists(port)


def test_a_rate_out_of_range_is_one_line_before_any_rule():
    done = subprocess.run([sys.executable, str(NFTLIMIT), "8080", "1", "0"], capture_output=True, text=True)
    assert done.returncode != 0 and done.stderr.strip() == "rate must be within 1..9999999 kbytes/second, got 0"

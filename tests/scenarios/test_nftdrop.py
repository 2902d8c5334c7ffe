"""The packet-loss command the scenarios run: at 100 % every packet to the port is dropped (no connection is
made), or answered with a reset (refused at once), the table goes with the command, and a percent or an action
out of range is one clear line."""

import socket
import subprocess
import sys
import time

from tests.live import NFTDROP, drop_table_exists, start_port_drop


def _connects(port: int, timeout: float) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def test_a_full_drop_cuts_the_port_off_and_the_table_leaves_with_the_command(require_root):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        assert _connects(port, 1.0)
        drop = start_port_drop(port, 30)
        try:
            assert not _connects(port, 1.0), "a SYN got through a 100 % drop"
        finally:
            drop.terminate()
            assert drop.wait(10) == 0, drop.stderr.read()
        assert not drop_table_exists(port)
        assert _connects(port, 1.0)


def test_a_percent_out_of_range_is_one_line_before_any_rule():
    done = subprocess.run([sys.executable, str(NFTDROP), "1", "1", "101"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 1 and done.stderr.strip() == "percent must be within 1..100, got 101"


def test_a_full_reset_refuses_at_once_and_leaves_with_the_command(require_root):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        drop = start_port_drop(port, 30, action="reset")
        try:
            started = time.monotonic()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5.0).close()
                raise AssertionError("connected through a 100 % reset")
            except ConnectionRefusedError:
                pass
            assert time.monotonic() - started < 1.0, "a reset should refuse at once, not time out"
        finally:
            drop.terminate()
            assert drop.wait(10) == 0, drop.stderr.read()
        assert not drop_table_exists(port)
        assert _connects(port, 1.0)


def test_an_unknown_action_is_one_line_before_any_rule():
    done = subprocess.run([sys.executable, str(NFTDROP), "1", "1", "10", "bounce"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 1 and done.stderr.strip() == "action must be one of drop, reset, got 'bounce'"

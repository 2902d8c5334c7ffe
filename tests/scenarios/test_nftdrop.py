"""The packet-loss command the scenarios run: at 100 % every packet to the port is dropped (no connection is
made), or answered with a reset (refused at once), the table goes with the command, and a percent or an action
out of range is one clear line."""

import json
import socket
import subprocess
import sys
import time

import pytest

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


def _chains(port: int) -> dict[str, list[str]]:
    """nftdrop.py's table for `port`: each chain's hook and the port match of its rules."""
    listing = json.loads(subprocess.run(["nft", "-j", "list", "table", "inet", f"infersight_eval_drop_{port}"],
                                        capture_output=True, text=True, check=True).stdout)["nftables"]
    hooks = {item["chain"]["name"]: item["chain"]["hook"] for item in listing if "chain" in item}
    chains: dict[str, list[str]] = {hook: [] for hook in hooks.values()}
    for item in listing:
        if "rule" in item:
            match = item["rule"]["expr"][0]["match"]
            chains[hooks[item["rule"]["chain"]]].append(f"{match['left']['payload']['field']} {match['right']}")
    return chains


@pytest.mark.parametrize(("direction", "chains"), [
    ("to", {"input": ["dport {port}"]}),
    ("from", {"output": ["sport {port}"]}),
    ("both", {hook: ["dport {port}", "sport {port}"] for hook in ("input", "output")}),
])
def test_one_way_loss_drops_one_direction_in_one_hook(require_root, direction, chains):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        drop = start_port_drop(port, 30, direction=direction)
        try:
            assert _chains(port) == {hook: [rule.format(port=port) for rule in rules]
                                     for hook, rules in chains.items()}
            # Either way no handshake completes: the SYN or the SYN-ACK is lost.
            assert not _connects(port, 1.0)
        finally:
            drop.terminate()
            assert drop.wait(10) == 0, drop.stderr.read()
        assert not drop_table_exists(port)


def test_a_reset_from_the_port_is_refused_in_one_line():
    done = subprocess.run([sys.executable, str(NFTDROP), "1", "1", "10", "reset", "from"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 1
    assert done.stderr.strip() == "a reset answers packets sent to the port: use direction to or both with reset"

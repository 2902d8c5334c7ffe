"""The local user behind a TCP connection, asked of the kernel (sock_diag) for real connections."""

import socket
import subprocess

import pytest

from agent.peers import peer_uid

USER_PYTHON = "/usr/bin/python3"  # runs as nobody, who may not read the venv


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_peer_uid_names_the_user_owning_the_other_end(require_root, family, host):
    with socket.socket(family) as server:
        server.bind((host, 0))
        server.listen()
        port = server.getsockname()[1]
        nobody = subprocess.Popen([USER_PYTHON, "-c", f"import socket, sys; c = socket.create_connection(({host!r}, "
                                   f"{port})); sys.stdin.read()"], user=65534, group=65534, extra_groups=[],
                                  stdin=subprocess.PIPE)
        try:
            conn, addr = server.accept()
            with conn:
                assert peer_uid(conn.getsockname()[:2], addr[:2]) == 65534
            with socket.create_connection((host, port)) as mine:
                conn, addr = server.accept()
                with conn:
                    assert peer_uid(conn.getsockname()[:2], addr[:2]) == 0
                    assert mine.getsockname()[1] == addr[1]
        finally:
            nobody.stdin.close()
            nobody.wait(timeout=10)


def test_peer_uid_is_none_for_a_socket_not_on_this_host():
    # No socket of this host has that four-tuple: what a remote peer looks like.
    assert peer_uid(("127.0.0.1", 1), ("203.0.113.9", 40000)) is None
    assert peer_uid(("127.0.0.1", 1), ("not an address", 1)) is None

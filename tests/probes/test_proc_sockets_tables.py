"""One read of a namespace's TCP tables serves every caller for a moment: each read walks the kernel's whole hash
table (probes/sockets.py says why), and the agent asks for the same table from two probes and every family member.
In the agent's own namespace the read is a sock_diag dump (probes/sock_diag.py), checked against /proc's tables."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probes import sock_diag
from probes.sockets import FAMILIES, TCP_LISTEN, Endpoint, ProcSockets, normalize_ip, parse_proc_net_tcp, sockets_in_use

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0 100 0 0 10 0
   1: 0302010A:B26E 0A0A0A0A:01BB 01 00000000:00000000 00:00000000 00000000     0        0 1002 1 0 20 4 30 10 -1
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:2328 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1003 1 0 100 0 0 10 0
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _member(root: Path, pid: int, inodes: list[int], netns: Path, tcp6_in_use: int = 1) -> None:
    """A fake /proc/PID whose ns/net is `netns` (a hard link: one inode per namespace, as nsfs gives)."""
    net = root / str(pid) / "net"
    net.mkdir(parents=True)
    (net / "tcp").write_text(TCP)
    (net / "tcp6").write_text(TCP6)
    (net / "sockstat").write_text("sockets: used 9\nTCP: inuse 2 orphan 0 tw 209 alloc 3 mem 0\n")
    (net / "sockstat6").write_text(f"TCP6: inuse {tcp6_in_use}\nUDP6: inuse 0\n")
    (root / str(pid) / "ns").mkdir()
    os.link(netns, root / str(pid) / "ns" / "net")
    fd = root / str(pid) / "fd"
    fd.mkdir()
    for n, inode in enumerate(inodes, start=3):
        (fd / str(n)).symlink_to(f"socket:[{inode}]")


def test_members_of_one_namespace_share_one_read_of_each_table_until_it_ages(tmp_path):
    proc, ns = tmp_path / "proc", tmp_path / "ns-a"
    proc.mkdir()
    ns.write_text("")
    for pid, inodes in ((10, [1001]), (11, [1002]), (12, [1003])):
        _member(proc, pid, inodes, ns)
    clock = Clock()
    sockets = ProcSockets(proc, ttl=0.5, clock=clock)
    assert sockets.endpoints(10) == {Endpoint("0.0.0.0", 8080, True)}
    assert sockets.endpoints(11) == {Endpoint("10.1.2.3", 45678)}
    assert sockets.endpoints(12) == {Endpoint("::1", 9000, True)}
    assert sockets.table_reads == 2  # tcp and tcp6, once, for three members
    # The tables are what they were when read, for ttl seconds; then read afresh.
    (proc / "10" / "net" / "tcp").write_text(TCP.replace(":1F90", ":1F91"))
    clock.now += 0.4
    assert sockets.endpoints(10) == {Endpoint("0.0.0.0", 8080, True)}
    clock.now += 0.2
    assert sockets.endpoints(10) == {Endpoint("0.0.0.0", 8081, True)}
    assert sockets.table_reads == 4


def test_another_namespace_is_read_on_its_own(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (tmp_path / "ns-a").write_text("")
    (tmp_path / "ns-b").write_text("")
    _member(proc, 10, [1001], tmp_path / "ns-a")
    _member(proc, 20, [1001], tmp_path / "ns-b")
    (proc / "20" / "net" / "tcp").write_text(TCP.replace(":1F90", ":0050"))
    sockets = ProcSockets(proc, clock=Clock())
    assert sockets.endpoints(10) == {Endpoint("0.0.0.0", 8080, True)}
    assert sockets.endpoints(20) == {Endpoint("0.0.0.0", 80, True)}
    assert sockets.table_reads == 4


def test_a_table_whose_namespace_holds_no_socket_of_its_family_is_not_read(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (tmp_path / "ns").write_text("")
    _member(proc, 10, [1001, 1003], tmp_path / "ns", tcp6_in_use=0)
    sockets = ProcSockets(proc, clock=Clock())
    # sockstat6 says no TCP6 socket is hashed: tcp6 is not read (its listener 1003 would be a stale line here).
    assert sockets.endpoints(10) == {Endpoint("0.0.0.0", 8080, True)}
    assert sockets.table_reads == 1


@pytest.mark.parametrize("text, expected", [
    ("sockets: used 13\nTCP: inuse 3 orphan 0 tw 224 alloc 3 mem 0\n", 3),
    ("TCP6: inuse 0\nUDP6: inuse 0\n", None),  # asked for "TCP:", the v6 line is not it
    ("TCP: garbage\n", None),
])
def test_sockets_in_use_reads_the_tcp_line(text, expected):
    assert sockets_in_use(text, "TCP:") == expected


@pytest.mark.parametrize("diag", [True, False], ids=["sock_diag", "proc"])
def test_real_proc_one_read_per_family_in_use_serves_every_caller(diag):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        port = listener.getsockname()[1]
        sockets = ProcSockets(sock_diag=diag)
        for _ in range(4):  # two probes, two members: the agent's calls in one window
            assert Endpoint("127.0.0.1", port, True) in sockets.endpoints(os.getpid())
        v6 = sockets_in_use(Path("/proc/self/net/sockstat6").read_text(), "TCP6:") if Path(
            "/proc/self/net/sockstat6").exists() else 0
        reads = 1 + (1 if v6 else 0)
        assert (sockets.diag_dumps, sockets.table_reads) == ((reads, 0) if diag else (0, reads))
        assert sockets.sock_diag_off is None
    finally:
        listener.close()


def _own_socket_inodes() -> set[int]:
    return ProcSockets(sock_diag=False).socket_inodes(os.getpid())


def test_sock_diag_gives_what_proc_net_tcp_gives():
    """Ground truth: the kernel's /proc tables. Listeners on IPv4, IPv6 and dual-stack, connections both ways, an
    IPv4 peer on a dual-stack socket (IPv4-mapped), a bound socket that never listened (in neither)."""
    held = []
    v4 = socket.socket()
    v4.bind(("127.0.0.1", 0))
    v4.listen()
    dual = socket.socket(socket.AF_INET6)
    dual.bind(("::", 0))
    dual.listen()
    bound = socket.socket()
    bound.bind(("127.0.0.1", 0))
    held += [v4, dual, bound]
    for server in (v4, dual):
        client = socket.create_connection(("127.0.0.1", server.getsockname()[1]))
        accepted, _ = server.accept()
        held += [client, accepted]
    try:
        mine = _own_socket_inodes()
        assert len(mine) >= len(held)
        for table, family in FAMILIES.items():
            by_diag = {s.inode: Endpoint(normalize_ip(s.address), s.port, s.state == TCP_LISTEN)
                       for s in sock_diag.tcp_sockets(family)}
            by_proc = parse_proc_net_tcp(Path(f"/proc/self/net/{table}").read_text())
            assert {i: e for i, e in by_diag.items() if i in mine} == {i: e for i, e in by_proc.items() if i in mine}
        expected = {Endpoint("127.0.0.1", v4.getsockname()[1], True), Endpoint("::", dual.getsockname()[1], True)}
        got = ProcSockets(sock_diag=True).endpoints(os.getpid())
        assert expected <= got and got == ProcSockets(sock_diag=False).endpoints(os.getpid())
        assert Endpoint("127.0.0.1", bound.getsockname()[1], False) not in got  # never listened: not hashed
    finally:
        for s in held:
            s.close()


def test_the_whole_namespace_agrees_too():
    """Every socket of the namespace, not just ours; other processes open and close sockets between the two reads,
    so one of a few tries must match exactly."""
    for _ in range(5):
        by_diag = {s.inode for s in sock_diag.tcp_sockets(socket.AF_INET)}
        by_proc = set(parse_proc_net_tcp(Path("/proc/self/net/tcp").read_text()))
        if by_diag == by_proc:
            return
    pytest.fail(f"sock_diag and /proc/net/tcp never agreed: {len(by_diag ^ by_proc)} sockets differ")


def test_a_target_in_another_network_namespace_is_read_from_proc(tmp_path):
    """A netlink socket sees the agent's namespace only: another namespace's target is read from its /proc tables,
    and the agent's own listener on the same port is not the target's."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to make a network namespace")
    ready = tmp_path / "port"
    code = ("import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
            f"open({str(ready)!r},'w').write(str(s.getsockname()[1])); time.sleep(60)")
    child = subprocess.Popen(["unshare", "--net", sys.executable, "-c", code])
    try:
        for _ in range(100):
            if ready.exists() and ready.read_text():
                break
            time.sleep(0.05)
        port = int(ready.read_text())
        mine = socket.socket()
        mine.bind(("127.0.0.1", port))  # the same port in the agent's namespace: free here
        mine.listen()
        try:
            sockets = ProcSockets()
            assert sockets.endpoints(child.pid) == {Endpoint("127.0.0.1", port, True)}
            assert sockets.table_reads >= 1 and sockets.diag_dumps == 0
            assert Endpoint("127.0.0.1", port, True) in sockets.endpoints(os.getpid())
            assert sockets.diag_dumps >= 1
        finally:
            mine.close()
    finally:
        child.kill()
        child.wait()


def test_a_refused_dump_falls_back_to_proc_and_says_so(monkeypatch):
    def refused(family):
        raise OSError(2, "No such file or directory")

    monkeypatch.setattr(sock_diag, "tcp_sockets", refused)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        sockets = ProcSockets(sock_diag=True)
        assert Endpoint("127.0.0.1", listener.getsockname()[1], True) in sockets.endpoints(os.getpid())
        assert sockets.table_reads >= 1 and sockets.diag_dumps == 0
        assert "sock_diag refused" in sockets.sock_diag_off
    finally:
        listener.close()


def test_the_probes_share_one_instance_so_one_window_reads_each_table_once():
    from probes.delivery import DeliveryProbe
    from probes.sockets import shared
    from probes.tcpretrans import TcpRetransProbe

    assert TcpRetransProbe().sockets is shared() is DeliveryProbe()._sockets
    assert shared(Path("/elsewhere")) is not shared()

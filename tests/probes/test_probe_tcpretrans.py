"""tcpretrans probe: rendering, /proc socket parsing, and real retransmits in namespaces vs /proc/net/snmp."""

from __future__ import annotations

import os
import queue
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from analysis.errors import ProbeUnavailable, TargetGone, TracepointMissing
from analysis.window import TcpFlow, TcpReading
from probes.btf import NetnsOffsets
from probes.sockets import Endpoint, ProcSockets, owns, parse_proc_net_tcp
from probes.tcpretrans import (
    TcpRetransConfig,
    TcpRetransProbe,
    flow_from_key,
    render,
    state_name,
    tracepoint_has_field,
)
from tests.probes.netns_helper import NetnsPair, netns_pair_context, parse_snmp

# --- pure parts: no root needed ---------------------------------------------------------------


def test_render_defines_follow_config():
    text = render(TcpRetransConfig(max_flows=128, err_field=True, count_synack=True))
    assert text.startswith("#define MAX_FLOWS 128\n#define HAVE_ERR_FIELD 1\n#define COUNT_SYNACK 1\n")
    assert "#ifdef HAVE_ERR_FIELD" in text and "#ifdef COUNT_SYNACK" in text

    bare = render(TcpRetransConfig(err_field=False, count_synack=False))
    assert "#define HAVE_ERR_FIELD" not in bare and "#define COUNT_SYNACK" not in bare
    assert bare.startswith("#define MAX_FLOWS 4096\n")


def test_render_reads_the_namespace_only_with_offsets():
    config = TcpRetransConfig(err_field=True)
    assert "#define NETNS_SK_NET" not in render(config)
    text = render(config, NetnsOffsets(sk_net=48, net_inum=176))
    assert "#define NETNS_SK_NET 48\n" in text and "#define NETNS_NET_INUM 176\n" in text
    assert text.count("key.netns = netns_of(args->skaddr);") == 2  # both tracepoints


class _Sockets:
    """ProcSockets' two calls the attribution makes, from fixed tables: pid -> endpoints, pid -> netns inode."""

    sock_diag_off = None

    def __init__(self, endpoints: dict[int, set[Endpoint]], netns: dict[int, int | None]) -> None:
        self._endpoints, self._netns = endpoints, netns

    def endpoints(self, pid: int) -> set[Endpoint]:
        return self._endpoints[pid]

    def netns(self, pid: int) -> int | None:
        return self._netns[pid]


def _flow(retransmits: int, sport: int = 8000) -> TcpFlow:
    return TcpFlow(saddr="10.0.0.1", sport=sport, daddr="10.0.0.2", dport=40000, state="TCP_ESTABLISHED",
                   retransmits=retransmits)


@pytest.mark.parametrize("keyed", [True, False])
def test_attribution_keeps_to_the_targets_namespace_when_keyed(keyed):
    """Two targets on 0.0.0.0:8000 in namespaces 111 and 222, flows of both and of a third namespace with the same
    4-tuple. Keyed: each target gets its own namespace's flow, and a flow whose namespace read failed (0) goes to
    both, as it did before; not keyed (no BTF): every flow goes to both (address and port alone)."""
    listener = {Endpoint("0.0.0.0", 8000, listening=True)}
    probe = TcpRetransProbe(sockets=_Sockets({1: listener, 2: listener, 3: listener}, {1: 111, 2: 222, 3: None}))
    probe._netns = NetnsOffsets(sk_net=48, net_inum=176) if keyed else None
    probe._targets = {1, 2, 3}
    flows = [(111, _flow(5)), (222, _flow(7)), (333, _flow(11)), (0, _flow(2)), (111, _flow(13, sport=9000))]
    got = {pid: r.retransmits for pid, r in probe._attribute(flows).items()}
    if keyed:
        # pid 3's namespace is not shown by /proc: matched on address and port alone, as before.
        assert got == {1: 5 + 2, 2: 7 + 2, 3: 5 + 7 + 11 + 2}
        assert probe.health().detail["netns_unread"] == 1
    else:
        assert got == {1: 25, 2: 25, 3: 25}
        assert "netns_unread" not in probe.health().detail


def test_host_flows_sum_a_flow_over_namespaces():
    from probes.tcpretrans import _merged  # noqa: PLC0415 - the one private helper this tests
    merged = _merged([(111, _flow(5)), (222, _flow(7)), (111, _flow(1, sport=9000))])
    assert [(f.sport, f.retransmits) for f in merged] == [(8000, 12), (9000, 1)]


def test_config_rejects_bad_max_flows():
    with pytest.raises(ValueError, match="got 0"):
        TcpRetransConfig(max_flows=0)


def _fake_tracefs(root: Path, fields: str) -> Path:
    event = root / "events" / "tcp" / "tcp_retransmit_skb"
    event.mkdir(parents=True)
    (event / "format").write_text(f"name: tcp_retransmit_skb\nformat:\n{fields}\nprint fmt: \"x\"\n")
    return root


def test_tracepoint_has_field_reads_the_format(tmp_path):
    root = _fake_tracefs(tmp_path, "\tfield:int state;\toffset:24;\tsize:4;\tsigned:1;\n"
                                   "\tfield:__u8 saddr_v6[16];\toffset:42;\tsize:16;\tsigned:0;\n"
                                   "\tfield:int err;\toffset:76;\tsize:4;\tsigned:1;")
    assert tracepoint_has_field("tcp:tcp_retransmit_skb", "err", root)
    assert tracepoint_has_field("tcp:tcp_retransmit_skb", "saddr_v6", root)
    assert not tracepoint_has_field("tcp:tcp_retransmit_skb", "errno", root)
    with pytest.raises(TracepointMissing, match="tcp_retransmit_synack"):
        tracepoint_has_field("tcp:tcp_retransmit_synack", "err", root)


def test_start_fails_with_the_missing_tracepoint(tmp_path):
    root = _fake_tracefs(tmp_path, "\tfield:int state;\toffset:24;\tsize:4;\tsigned:1;")
    probe = TcpRetransProbe(TcpRetransConfig(tracefs=root))
    with pytest.raises(TracepointMissing, match="tcp:tcp_retransmit_synack"):
        probe.start([])
    health = probe.health()
    assert health.state == "failed" and "tcp_retransmit_synack" in health.reason


def test_read_before_start_is_a_domain_error():
    with pytest.raises(ProbeUnavailable, match="not started"):
        TcpRetransProbe().read()


def test_state_names():
    assert state_name(1) == "TCP_ESTABLISHED"
    assert state_name(4) == "TCP_FIN_WAIT1"
    assert state_name(12) == "TCP_NEW_SYN_RECV"
    assert state_name(99) == "TCP_STATE_99"


def test_flow_from_key_v4_v6_and_mapped():
    v4 = flow_from_key(2, bytes([10, 0, 0, 1]) + bytes(12), bytes([10, 0, 0, 2]) + bytes(12), 40000, 80, 1, 3)
    assert v4 == TcpFlow("10.0.0.1", 40000, "10.0.0.2", 80, "TCP_ESTABLISHED", 3)
    v6 = flow_from_key(10, bytes(15) + b"\x01", bytes([0x20, 0x01, 0x0d, 0xb8]) + bytes(11) + b"\x02", 1, 2, 2, 1)
    assert (v6.saddr, v6.daddr, v6.state) == ("::1", "2001:db8::2", "TCP_SYN_SENT")
    mapped = flow_from_key(10, bytes(10) + b"\xff\xff" + bytes([192, 0, 2, 7]), bytes(16), 1, 2, 8, 1)
    assert mapped.saddr == "192.0.2.7"
    with pytest.raises(ValueError, match="got 1"):
        flow_from_key(1, bytes(16), bytes(16), 1, 2, 1, 1)


# One listener on 0.0.0.0:8080, one connection 10.1.2.3:45678 -> 10.9.9.9:443, one socket of another process.
PROC_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0 100 0 0 10 0
   1: 0302010A:B26E 0909090A:01BB 01 00000000:00000000 00:00000000 00000000     0        0 1002 1 0 20 4 30 10 -1
   2: 0100007F:0016 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 9999 1 0 20 4 30 10 -1
"""
# [::1]:9000 listening, and an IPv4-mapped connected socket [::ffff:10.1.2.3]:5000.
PROC_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:2328 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1003 1 0 100 0 0 10 0
   1: 0000000000000000FFFF00000302010A:1388 0000000000000000FFFF00000909090A:01BB 01 00000000:00000000 00:00000000 00000000     0        0 1004 1 0 20 4 30 10 -1
"""


def _fake_proc(root: Path, pid: int, inodes: list[int]) -> Path:
    (root / str(pid) / "net").mkdir(parents=True)
    (root / str(pid) / "net" / "tcp").write_text(PROC_TCP)
    (root / str(pid) / "net" / "tcp6").write_text(PROC_TCP6)
    fd = root / str(pid) / "fd"
    fd.mkdir()
    (fd / "0").symlink_to("/dev/null")
    (fd / "1").symlink_to("pipe:[77]")
    for n, inode in enumerate(inodes, start=3):
        (fd / str(n)).symlink_to(f"socket:[{inode}]")
    return root


def test_parse_proc_net_tcp_decodes_addresses_ports_and_listeners():
    table = parse_proc_net_tcp(PROC_TCP)
    assert table[1001] == Endpoint("0.0.0.0", 8080, listening=True)
    assert table[1002] == Endpoint("10.1.2.3", 45678)
    assert table[9999] == Endpoint("127.0.0.1", 22)
    table6 = parse_proc_net_tcp(PROC_TCP6)
    assert table6[1003] == Endpoint("::1", 9000, listening=True)
    assert table6[1004] == Endpoint("10.1.2.3", 5000)
    assert parse_proc_net_tcp(PROC_TCP, only={1002, 4242}) == {1002: Endpoint("10.1.2.3", 45678)}


def test_proc_sockets_keeps_only_the_process_own_sockets(tmp_path):
    proc = _fake_proc(tmp_path, 42, [1001, 1002, 1004, 5555])
    assert ProcSockets(proc).endpoints(42) == {Endpoint("0.0.0.0", 8080, True), Endpoint("10.1.2.3", 45678),
                                               Endpoint("10.1.2.3", 5000)}
    with pytest.raises(TargetGone, match="43"):
        ProcSockets(proc).endpoints(43)


def test_owns_matches_local_endpoint_and_wildcard_listener():
    eps = {Endpoint("10.1.2.3", 45678), Endpoint("0.0.0.0", 8080, listening=True)}
    assert owns(eps, TcpFlow("10.1.2.3", 45678, "10.9.9.9", 443, "TCP_ESTABLISHED", 1))
    assert owns(eps, TcpFlow("10.7.7.7", 8080, "10.9.9.9", 50000, "TCP_SYN_RECV", 1))
    assert not owns(eps, TcpFlow("10.1.2.4", 45678, "10.9.9.9", 443, "TCP_ESTABLISHED", 1))
    assert not owns(eps, TcpFlow("10.1.2.3", 45679, "10.9.9.9", 443, "TCP_ESTABLISHED", 1))
    # A connected (non-listening) socket on the unspecified address does not own others' ports.
    assert not owns({Endpoint("0.0.0.0", 9)}, TcpFlow("10.0.0.1", 9, "10.0.0.2", 1, "TCP_ESTABLISHED", 1))


def test_parse_snmp_reads_retranssegs():
    text = ("Ip: Forwarding DefaultTTL\nIp: 1 64\n"
            "Tcp: RtoAlgorithm ActiveOpens RetransSegs\nTcp: 1 3 17\n")
    assert parse_snmp(text)["Tcp"]["RetransSegs"] == 17


# --- real kernel: BPF, namespaces, nftables, TCP -----------------------------------------------

# Both peers: move bytes, then hold the connection open (so nothing more is sent) until told
# "info" (print the socket's tcpi_total_retrans: retransmitted segments) or anything else (exit).
PEER = r"""
import socket, struct, sys
role, addr, port, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if role == "server":
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((addr, port))
    lsock.listen(8)
    print("listening", flush=True)
    conn, _ = lsock.accept()
    got = 0
    while got < total:
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        got += len(chunk)
    conn.sendall(b"done")
    print(f"received {got}", flush=True)
else:
    conn = socket.create_connection((addr, port))
    print(f"connected {conn.getsockname()[1]}", flush=True)
    conn.sendall(b"x" * total)
    reply = b""
    while len(reply) < 4:
        reply += conn.recv(4 - len(reply))
    print(f"sent {reply.decode()}", flush=True)
for line in sys.stdin:
    if line.strip() != "info":
        break
    info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    print(struct.unpack_from("I", info, 100)[0], flush=True)
"""


EOF_MARK = "\0eof"


class Peer:
    """One side of the test connection, a real python process inside a namespace."""

    def __init__(self, pair: NetnsPair, ns: str, role: str, addr: str, port: int, total: int) -> None:
        argv = pair.exec_argv(ns, [sys.executable, "-c", PEER, role, addr, str(port), str(total)])
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid

        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        # A thread owns the pipe, so waiting for a line with a timeout never misses one already buffered.
        for out in self.proc.stdout:
            self._lines.put(out.strip())
        self._lines.put(EOF_MARK)

    def line(self, timeout: float) -> str | None:
        """The peer's next line; None when it printed nothing within `timeout`."""
        try:
            out = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if out == EOF_MARK:
            raise AssertionError(f"peer {self.pid} exited with {self.proc.wait(timeout=10)}")
        return out

    def total_retrans(self) -> int:
        self.proc.stdin.write("info\n")
        self.proc.stdin.flush()
        return int(self.line(10))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def _tx_queue_empty(pid: int) -> bool:
    """Whether every ESTABLISHED TCP socket of `pid` has nothing unacknowledged or unsent."""
    inodes = ProcSockets().socket_inodes(pid)
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        if int(parts[9]) in inodes and parts[3] == "01" and int(parts[4].split(":")[0], 16) != 0:
            return False
    return True


def _wait_quiet(pair: NetnsPair, peers: list[Peer], timeout: float = 60.0) -> int:
    """Wait until nothing is left to retransmit; returns RetransSegs of both namespaces then."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if all(_tx_queue_empty(p.pid) for p in peers):
            now = pair.retrans_segs(pair.a) + pair.retrans_segs(pair.b)
            if now == last:
                return now
            last = now
        time.sleep(0.3)
    raise AssertionError(f"connection in {pair.a}/{pair.b} did not go quiet within {timeout}s")


def _sockets(pair: NetnsPair) -> str:
    """`ss -tin` of both namespaces, for a failure message."""
    out = []
    for ns in (pair.a, pair.b):
        ss = subprocess.run(pair.exec_argv(ns, ["ss", "-tin"]), capture_output=True, text=True)
        out.append(f"{ns}:\n{ss.stdout}{ss.stderr}")
    return "\n".join(out)


def _between(pair: NetnsPair, flows: list[TcpFlow]) -> list[TcpFlow]:
    return [f for f in flows if {f.saddr, f.daddr} == {pair.addr_a, pair.addr_b}]


@pytest.fixture
def probe(require_bpf):
    p = TcpRetransProbe()
    p.start([])
    yield p
    p.stop()


@pytest.fixture
def netns_pair(require_root):
    with netns_pair_context("istcp", rto_min_ms=10, rto_max_ms=1000) as pair:
        yield pair


@pytest.fixture
def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.flaky(reruns=2, reason="real TCP under random loss on a shared VM: a stalled transfer, or a retransmit this kernel counts without firing the tracepoint (docs/tcpretrans.md, tests/probes/tcpretrans_gaps.py)")
@pytest.mark.bpf
@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(180)
# Reads every 20 ms as well as every second: each read is a chance to lose an increment that lands
# while user space reads and clears the map, so the fast reader is the sharper test of that.
@pytest.mark.parametrize("read_every", [1.0, 0.02])
def test_retransmits_equal_snmp_retranssegs_and_are_attributed(probe, netns_pair, dead_pid, read_every):
    pair = netns_pair
    port = random.randrange(20000, 30000)
    pair.add_random_drop(pair.b, port)  # data and SYNs into b
    pair.add_random_drop(pair.a, port)  # ACKs, SYN-ACKs and the reply into a
    before = pair.retrans_segs(pair.a) + pair.retrans_segs(pair.b)
    missed_before = probe.missed_runs()
    total = 2_000_000

    server = Peer(pair, pair.b, "server", pair.addr_b, port, total)
    client = None
    try:
        assert server.line(10) == "listening"
        client = Peer(pair, pair.a, "client", pair.addr_b, port, total)
        # Targets change at run time, without a reload; a pid that already exited is dropped quietly.
        probe.set_targets([client.pid, server.pid, dead_pid])
        client_port = int(client.line(30).split()[1])

        windows: list[dict] = []
        hosts = []
        not_sent = send_failed = 0
        sent = None
        deadline = time.monotonic() + 120
        while sent is None and time.monotonic() < deadline:
            sent = client.line(read_every)
            windows.append(probe.read())
            hosts.append(probe.last_host)
            not_sent, send_failed = not_sent + probe.last_not_sent, send_failed + probe.last_send_failed
        assert sent == "sent done", f"transfer stalled; sockets:\n{_sockets(pair)}"
        assert server.line(10) == f"received {total}"

        after = _wait_quiet(pair, [client, server])
        windows.append(probe.read())
        hosts.append(probe.last_host)
        assert pair.retrans_segs(pair.a) + pair.retrans_segs(pair.b) == after, "retransmits after the quiet point"

        # Host-wide: the flows between our two addresses, summed over every window, are exactly the
        # kernel's own count in both namespaces. Runs the kernel skipped (another tracing program was
        # running on that CPU: other probes, other tests) are counted as missed, never silently.
        expected = after - before
        missed = probe.missed_runs() - missed_before
        ours = [f for h in hosts for f in _between(pair, h.flows)]
        client_total, server_total = client.total_retrans(), server.total_retrans()
        by_state: dict[tuple[str, str], int] = {}
        for f in ours:
            by_state[(f.saddr, f.state)] = by_state.get((f.saddr, f.state), 0) + f.retransmits
        assert expected > 50, f"only {expected} retransmits: the nftables loss did not bite"
        counted = sum(f.retransmits for f in ours) + missed
        # Exactly the kernel's count: an increment lost between a map read and its delete, or one
        # counted twice, fails here. The one known miss is the kernel's: under CPU contention a few
        # retransmits in ten thousand move RetransSegs and tcpi_total_retrans with no
        # tcp_retransmit_skb event at all (no program runs, classic or raw; see
        # tests/probes/tcpretrans_gaps.py), hence the reruns above; on a quiet host 20 of 20 were exact.
        assert counted == expected, (
            f"counted {counted} (flows + {missed} missed) vs RetransSegs {expected}: "
            f"snmp a={pair.retrans_segs(pair.a)} b={pair.retrans_segs(pair.b)}; flows by (saddr, state) {by_state}; "
            f"tcpi_total_retrans client={client_total} server={server_total}; not_sent={not_sent} "
            f"send_failed={send_failed}; windows={len(hosts)}; host totals "
            f"{sum(h.retransmits for h in hosts)} vs host flows {sum(f.retransmits for h in hosts for f in h.flows)}; "
            f"lost={probe.health().lost_events - probe.missed_runs()}; sockets {_sockets(pair)}")
        print(f"tcpretrans: RetransSegs {expected}, counted {counted} ({missed} missed runs) over {len(hosts)} windows")
        # The host total also counts every other namespace; summed over windows it covers every flow.
        assert sum(h.retransmits for h in hosts) >= sum(f.retransmits for h in hosts for f in h.flows)
        assert "TCP_ESTABLISHED" in {f.state for f in ours}

        # Per target: each side's flows are its own, and add up to its socket's tcpi_total_retrans.
        for w in windows:
            assert set(w) <= {client.pid, server.pid}
            assert dead_pid not in w
        assert probe.health().targets == 2
        mine = [f for w in windows for f in w.get(client.pid, TcpReading()).flows]
        assert mine and all((f.saddr, f.sport) == (pair.addr_a, client_port) for f in mine)
        assert sum(w[client.pid].retransmits for w in windows if client.pid in w) == sum(f.retransmits for f in mine)
        theirs = [f for w in windows for f in w.get(server.pid, TcpReading()).flows]
        assert all((f.saddr, f.sport) == (pair.addr_b, port) for f in theirs)
        assert sum(f.retransmits for f in mine + theirs) == sum(f.retransmits for f in ours)
        # Each socket's own count (tcpi_total_retrans) bounds its flows the same way. The accepted
        # socket's count starts at its request's SYN-ACK retransmits (some of them: a SYN-ACK re-sent
        # for a duplicate SYN may not be in it), so the server is bounded on both sides.
        gap_client = client_total - sum(f.retransmits for f in mine)
        server_data = sum(f.retransmits for f in theirs if f.state != "TCP_SYN_RECV")
        assert 0 <= gap_client <= missed, f"client {client_total} vs {mine}"
        assert server_data <= server_total <= sum(f.retransmits for f in theirs) + missed, (
            f"server {server_total} vs {theirs}")
    finally:
        server.close()
        if client is not None:
            client.close()


@pytest.mark.bpf
@pytest.mark.netns
@pytest.mark.timeout(60)
def test_synack_retransmits_counted_and_attributed_to_the_listener(probe, netns_pair):
    pair = netns_pair
    port = random.randrange(30000, 40000)
    # Every other SYN-ACK into a is dropped: the listener in b has to send it again.
    pair.add_input_rules(pair.a, [f"tcp sport {port} tcp flags & (syn | ack) == syn | ack numgen inc mod 2 == 0 drop"])
    before = pair.retrans_segs(pair.a) + pair.retrans_segs(pair.b)
    server = Peer(pair, pair.b, "server", pair.addr_b, port, 1000)
    client = None
    try:
        assert server.line(10) == "listening"
        probe.set_targets([server.pid])
        client = Peer(pair, pair.a, "client", pair.addr_b, port, 1000)
        client.line(30)
        assert client.line(30) == "sent done"
        after = _wait_quiet(pair, [client, server])
        by_target = probe.read()

        synacks = [f for f in _between(pair, probe.last_host.flows) if f.state == "TCP_SYN_RECV"]
        assert synacks and all((f.saddr, f.sport) == (pair.addr_b, port) for f in synacks)
        assert sum(f.retransmits for f in _between(pair, probe.last_host.flows)) == after - before
        assert [f for f in by_target[server.pid].flows if f.state == "TCP_SYN_RECV"] == synacks
    finally:
        server.close()
        if client is not None:
            client.close()


@pytest.mark.bpf
def test_reads_never_delete_a_live_entry_and_credit_late_increments(require_bpf):
    """The double-buffered drain, on the real map: user space writes stand in for the kernel's increments."""
    p = TcpRetransProbe()
    p.start([])
    try:
        flows, window = p._bpf[b"flows"], p._bpf[b"window"]

        def put(parity: int, count: int) -> None:
            key = flows.Key()
            key.parity, key.family, key.sport, key.dport, key.state = parity, 2, 40000, 443, 1
            key.saddr[:4], key.daddr[:4] = [10, 0, 0, 1], [10, 0, 0, 2]
            flows[key] = flows.Leaf(count)

        def parities() -> list[int]:
            return sorted(k.parity for k in flows.keys())

        assert window[0].value == 0
        put(0, 5)
        p.read()
        assert [f.retransmits for f in p.last_host.flows] == [5] and window[0].value == 1
        assert parities() == [0], "the closing parity was deleted while programs may still write it"

        put(0, 7)  # two increments from a program that loaded parity 0 just before the flip
        put(1, 3)  # the window's own three
        p.read()
        assert [(f.saddr, f.daddr, f.retransmits) for f in p.last_host.flows] == [("10.0.0.1", "10.0.0.2", 5)]
        assert window[0].value == 0 and parities() == [1]

        p.read()
        assert p.last_host.flows == [] and parities() == []
    finally:
        p.stop()


@pytest.mark.bpf
def test_health_and_idempotent_stop(require_bpf):
    p = TcpRetransProbe()
    p.start([os.getpid()])
    try:
        h = p.health()
        assert (h.state, h.reason, h.targets) == ("running", None, 1)
        with pytest.raises(ProbeUnavailable, match="already started"):
            p.start([])
        assert os.getpid() in p.read()
    finally:
        p.stop()
        p.stop()
    assert p.health().state == "stopped"



SAME_PORT = 18433
SYNACK = "tcp flags & (syn | ack) == syn | ack"


@pytest.mark.flaky(reruns=1, reason="real TCP under random loss on a shared VM: a retransmit this kernel counts without firing the tracepoint (docs/tcpretrans.md)")
@pytest.mark.bpf
@pytest.mark.netns
@pytest.mark.timeout(240)
def test_a_server_on_the_same_port_in_another_namespace_is_not_the_targets(require_bpf):
    """Two servers on 0.0.0.0 and the same port, each in its own network namespace with its own clients, at the same
    time. Ours: 6 clean connections. The other's: 10 connections, every other SYN-ACK and a fifth of the server's
    other segments dropped on the way to its clients. Ground truth is each server namespace's own RetransSegs (all of
    its sockets are its server's). The probe keyed by namespace gives each server its own namespace's count (ours:
    whatever its clean run resent, normally 0); the same probe with the namespace not read (TcpRetransConfig(netns=
    False): the code before this test, matching on local address and port alone) credits the other's retransmits to
    ours, which this test also asserts, so it shows the fault it guards against in the same run."""
    with netns_pair_context(tag="isrt", rto_min_ms=10) as ours, netns_pair_context(tag="isrt", rto_min_ms=10) as other:
        servers = [subprocess.Popen(p.exec_argv(p.a, [sys.executable, "-m", "tests.probes.delivery_peers", "server",
                                                      str(SAME_PORT)]), stdout=subprocess.PIPE, text=True)
                   for p in (ours, other)]
        keyed, alone = TcpRetransProbe(), TcpRetransProbe(TcpRetransConfig(netns=False))
        try:
            assert all(s.stdout.readline().strip() == "ready" for s in servers)
            other.add_input_rules(other.b, [f"tcp sport {SAME_PORT} {SYNACK} numgen inc mod 2 == 0 drop",
                                            f"tcp sport {SAME_PORT} numgen random mod 10 < 2 drop"])
            keyed.start([s.pid for s in servers])
            alone.start([servers[0].pid])
            assert keyed.health().detail["netns"] == "keyed"
            assert alone.health().detail["netns"].startswith("off (config)")
            keyed.read(), alone.read()
            before = {"ours": ours.retrans_segs(ours.a), "other": other.retrans_segs(other.a)}
            base = [sys.executable, "-m", "tests.probes.delivery_peers", "client"]
            theirs = subprocess.Popen(other.exec_argv(other.b, [*base, other.addr_a, str(SAME_PORT), "10", "4",
                                                               "20000", "0.05"]),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            client = subprocess.run(ours.exec_argv(ours.b, [*base, ours.addr_a, str(SAME_PORT), "6", "3", "300",
                                                            "0.05"]), capture_output=True, text=True, timeout=200)
            assert client.returncode == 0, client.stderr
            _, err = theirs.communicate(timeout=200)
            assert theirs.returncode == 0, err
            time.sleep(0.5)
            got, got_alone = keyed.read(), alone.read()
            truth = {"ours": ours.retrans_segs(ours.a) - before["ours"],
                     "other": other.retrans_segs(other.a) - before["other"]}
            lost, lost_alone = keyed.health().lost_events, alone.health().lost_events
            unread = keyed.health().detail.get("netns_unread", 0)
        finally:
            keyed.stop()
            alone.stop()
            for s in servers:
                s.kill()
                s.wait()
    mine, its = got[servers[0].pid], got[servers[1].pid]
    print(f"same port, two namespaces: truth {truth}; keyed ours {mine.retransmits} other {its.retransmits}; "
          f"unkeyed ours {got_alone[servers[0].pid].retransmits}; lost {lost}/{lost_alone}")
    # The other namespace did what the test needs of it: its server resent SYN-ACKs and replies on the same port.
    assert truth["other"] >= 20, truth
    assert unread == 0
    assert truth["ours"] - lost <= mine.retransmits <= truth["ours"], (mine, truth)
    assert truth["other"] - lost <= its.retransmits <= truth["other"], (its, truth)
    assert all(f.sport == SAME_PORT for f in mine.flows + its.flows)
    assert "TCP_SYN_RECV" in {f.state for f in its.flows}
    # Matched on address and port alone, ours is credited with the other's retransmits too (the bug).
    assert got_alone[servers[0].pid].retransmits >= truth["ours"] + truth["other"] - lost_alone, (got_alone, truth)

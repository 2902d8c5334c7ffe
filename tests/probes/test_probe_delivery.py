"""delivery probe: rendering, and real replies in namespaces against a client that timestamps each last byte."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from probes import delivery
from probes.btf import BtfError, NetnsOffsets
from probes.delivery import DEFAULT_BOUNDS, DeliveryConfig, DeliveryProbe, bucket_key, render
from tests.probes.netns_helper import NetnsPair, netns_pair_context
from workload.metrics import E2E_BUCKETS

# --- pure parts ------------------------------------------------------------------------------------


def test_default_bounds_are_the_workloads_latency_buckets():
    assert DEFAULT_BOUNDS == E2E_BUCKETS


def test_bucket_keys_match_the_latency_source():
    assert [bucket_key(b) for b in (0.01, 0.1, 1.0, 2.5, 10.0)] == ["0.01", "0.1", "1", "2.5", "10"]
    assert bucket_key(float("inf")) == "+Inf"


def test_render_places_each_bound_in_the_bucket_chain():
    text = render(DeliveryConfig(bounds=(0.005, 0.5), max_targets=4, max_flows=64), err_field=False)
    assert "if (ns <= 5000000ULL) return 0;" in text and "if (ns <= 500000000ULL) return 1;" in text
    assert "return 2;\n}" in text
    assert "#define N_FIELDS 19" in text and "#define HAVE_ERR_FIELD" not in text
    assert "#define FIRST_REQUEST 1" in text and "#define REQUEST_LATE_MIN_NS 200000000ULL" in text
    assert "#define FIRST_REQUEST" not in render(DeliveryConfig(first_request=False), err_field=False)
    assert "#define MAX_FLOWS 64" in text


def test_the_namespace_offsets_are_rendered_only_where_known():
    assert "#define NETNS_SK_NET" not in render(DeliveryConfig(), err_field=False)
    text = render(DeliveryConfig(), err_field=False, netns=NetnsOffsets(sk_net=48, net_inum=176))
    assert "#define NETNS_SK_NET 48" in text and "#define NETNS_NET_INUM 176" in text


@pytest.mark.parametrize(("config", "offsets", "said"), [
    (DeliveryConfig(err_field=False), BtfError("no struct 'net'"), "not read (no struct 'net')"),
    (DeliveryConfig(err_field=False), NetnsOffsets(48, 176), "keyed"),
    (DeliveryConfig(err_field=False, netns=False), NetnsOffsets(48, 176), "off (config)")])
def test_without_btf_offsets_ports_are_keyed_alone_and_health_says_so(monkeypatch, config, offsets, said):
    def found():
        if isinstance(offsets, Exception):
            raise offsets
        return offsets
    monkeypatch.setattr(delivery, "netns_offsets", found)
    probe = DeliveryProbe(config)
    text = probe._render()
    assert probe.health().detail["netns"].startswith(said)
    assert ("#define NETNS_SK_NET" in text) == (said == "keyed")


@pytest.mark.parametrize("bad", [(), (0.1, 0.1), (0.2, 0.1), (-1.0,), tuple(range(1, 50))])
def test_config_rejects_bad_bounds(bad):
    with pytest.raises(ValueError, match="bounds must be"):
        DeliveryConfig(bounds=bad)


def test_config_rejects_bad_sizes():
    with pytest.raises(ValueError, match="max_flows"):
        DeliveryConfig(max_flows=1)
    with pytest.raises(ValueError, match="max_targets"):
        DeliveryConfig(max_targets=0)


# --- real replies -----------------------------------------------------------------------------------

PORT = 18432
FINE_BOUNDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


@dataclass
class Run:
    truth: list[float]  # seconds from the server's write to the client holding the last byte, per reply
    readings: list     # DeliveryReading of the server, per read
    retrans_segs: int  # the server namespace's RetransSegs over the run, less SYN-ACKs (not a reply's)
    # Runs the kernel skipped (a program already running on that CPU: other tools on a shared host), each
    # of which may cost one reply or retransmit.
    lost: int


def _data_retransmits(pair: NetnsPair) -> int:
    return pair.retrans_segs(pair.a) - pair.netstat(pair.a)["TcpExt"]["TCPSynRetrans"]


def _run(pair: NetnsPair, reply_loss: bool, delayed_ack: bool = False, requests: int = 40, size: int = 20000) -> Run:
    server = subprocess.Popen(pair.exec_argv(pair.a, [sys.executable, "-m", "tests.probes.delivery_peers",
                                                      "server", str(PORT)]),
                              stdout=subprocess.PIPE, text=True)
    probe = DeliveryProbe(DeliveryConfig(bounds=FINE_BOUNDS, max_targets=4))
    try:
        assert server.stdout.readline().strip() == "ready"
        if reply_loss:
            pair.add_input_rules(pair.b, [f"tcp sport {PORT} numgen random mod 10 < 2 drop"])
        probe.start([server.pid])
        probe.read()
        before = _data_retransmits(pair)
        argv = [sys.executable, "-m", "tests.probes.delivery_peers", "client", pair.addr_a, str(PORT), "4",
                str(requests), str(size), "0.05"] + (["--delayed-ack"] if delayed_ack else [])
        client = subprocess.run(pair.exec_argv(pair.b, argv), capture_output=True, text=True, timeout=300)
        assert client.returncode == 0, client.stderr
        readings = [probe.read()[server.pid]]
        # The last reply of each connection is recorded when the client's FIN arrives: the client has
        # closed by now, so one more read collects it.
        time.sleep(0.5)
        readings.append(probe.read()[server.pid])
        retrans = _data_retransmits(pair) - before
        lost = probe.health().lost_events
    finally:
        probe.stop()
        server.kill()
        server.wait()
    writes = dict(line.split()[1:] for line in server.stdout.read().splitlines() if line.startswith("w "))
    received = dict(line.split()[1:] for line in client.stdout.splitlines() if line.startswith("r "))
    assert len(received) == 4 * requests
    truth = [(int(received[i]) - int(writes[i])) / 1e9 for i in received]
    return Run(truth=truth, readings=readings, retrans_segs=retrans, lost=lost)


def _quantile(values: list[float], q: float) -> float:
    """The value of rank ceil(q * n), the rank _kernel_quantile's bucket holds: at a step of the distribution (one
    RTO vs two) ranks one apart fall in different buckets."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def _kernel_quantile(buckets: list[float], q: float) -> int:
    total, rank = sum(buckets), 0.0
    for i, n in enumerate(buckets):
        rank += n
        if rank >= q * total:
            return i
    return len(buckets) - 1


def _merged(run: Run) -> tuple[int, list[float], float, int, int]:
    keys = [bucket_key(b) for b in FINE_BOUNDS] + ["+Inf"]
    buckets = [sum(r.buckets[k] for r in run.readings) for k in keys]
    return (sum(r.replies for r in run.readings), buckets, sum(r.delivery_seconds for r in run.readings),
            sum(r.retransmitted for r in run.readings), sum(r.retransmits for r in run.readings))


# Agreement bound, per reply: the kernel's figure ends when the client's ACK reaches the server; the client's
# own timestamp when its thread has read the last byte, after its kernel sent that ACK. So the kernel is ahead
# of the client by the client's wake-up (scheduling on this loaded 2-core host: up to a few ms on average)
# plus one veth hop. Both user-space timestamps also wait for their thread to run after the syscall returns,
# so single replies differ by a few ms either way, and the client's by tens of ms when the host is loaded (load
# average 15-20 on 2 cores here: one p99 of 160 replies came 10.5 ms after the kernel's bucket). Bounds: the
# mean within [-1 ms, +10 ms]; each of p50/p95/p99 in the kernel's bucket widened by 5 ms below and 50 ms above.
MEAN_BOUND_S = 0.010
QUANTILE_SLACK_S = 0.005
CLIENT_WAKEUP_SLACK_S = 0.050


@pytest.mark.bpf
@pytest.mark.netns
@pytest.mark.usefixtures("require_bpf")
@pytest.mark.parametrize(("reply_loss", "size", "delayed_ack"),
                         [(False, 20000, False), (True, 20000, False), (True, 300, True)],
                         ids=["clean", "reply-loss", "small-replies-delayed-ack"])
def test_delivery_matches_client_timestamps(reply_loss, size, delayed_ack):
    with netns_pair_context(tag="isdlv") as pair:
        run = _run(pair, reply_loss, delayed_ack=delayed_ack, size=size)
    replies, buckets, total, retransmitted, retransmits = _merged(run)
    assert len(run.truth) - run.lost <= replies <= len(run.truth)
    gap = sum(run.truth) / len(run.truth) - total / replies
    assert -0.001 <= gap <= MEAN_BOUND_S, (gap, total / replies, sum(run.truth) / len(run.truth))
    for q in (0.5, 0.95, 0.99):
        k = _kernel_quantile(buckets, q)
        # Runs the kernel skipped can shift the kernel's ranks: then the neighbouring buckets count too.
        spread = 1 if run.lost else 0
        lo = FINE_BOUNDS[k - 1 - spread] if k - spread > 0 else 0.0
        hi = FINE_BOUNDS[k + spread] if k + spread < len(FINE_BOUNDS) else float("inf")
        assert lo - QUANTILE_SLACK_S <= _quantile(run.truth, q) <= hi + CLIENT_WAKEUP_SLACK_S, (q, k, buckets)
    # The retransmit tracepoint misses a few in ten thousand under contention (docs/tcpretrans.md): 1 % + 2 slack.
    assert run.retrans_segs - run.lost - 2 - run.retrans_segs // 100 <= retransmits <= run.retrans_segs
    if reply_loss:
        # 20 % of the reply packets dropped: 20 kB replies (14 segments) nearly all lose one, 300 B ones a fifth.
        assert retransmitted >= replies // (2 if size > 1000 else 10)
        assert _quantile(run.truth, 0.99) > 0.1
    else:
        # No loss made here; a loaded host still retransmits now and then (a timer firing before a delayed ACK was
        # processed): each retransmitted reply had one, and the kernel counted them (checked above).
        assert retransmitted <= retransmits <= 2 + run.retrans_segs // 100 + run.retrans_segs


def _peer(pair: NetnsPair, *argv: str) -> subprocess.Popen:
    return subprocess.Popen(pair.exec_argv(pair.b, [sys.executable, "-m", "tests.probes.delivery_peers", *argv]),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _flows(probe: DeliveryProbe) -> int:
    return len(probe._bpf[b"flows"].items())


def _wait(cond, deadline_s: float = 30.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


@pytest.mark.bpf
@pytest.mark.netns
@pytest.mark.usefixtures("require_bpf")
def test_idle_keepalive_and_zero_window_clients_give_no_slow_delivery_and_leave_nothing():
    """1,000 keep-alive connections that go idle after one reply, and a client that never reads a 4 MB reply
    (its window closes): the map stays within max_flows, no reply is reported slow, and every entry goes when
    the connections close."""
    with netns_pair_context(tag="isdlv") as pair:
        server = subprocess.Popen(pair.exec_argv(pair.a, [sys.executable, "-m", "tests.probes.delivery_peers",
                                                          "server", str(PORT)]), stdout=subprocess.PIPE, text=True)
        probe = DeliveryProbe(DeliveryConfig(bounds=FINE_BOUNDS, max_targets=4, max_flows=256))
        try:
            assert server.stdout.readline().strip() == "ready"
            probe.start([server.pid])
            stalled = _peer(pair, "stall", pair.addr_a, str(PORT), str(4 << 20))
            assert stalled.stdout.readline().strip() == "stalled"
            idle = _peer(pair, "idle", pair.addr_a, str(PORT), "1000")
            assert idle.stdout.readline().strip() == "idle"
            time.sleep(3)  # idle: nothing on the wire but the stalled flow's zero-window probes
            idle_reading = probe.read()[server.pid]
            assert _flows(probe) <= 256
            idle.stdin.close()
            idle.wait(timeout=60)
            stalled.stdin.close()
            stalled.wait(timeout=60)
            assert _wait(lambda: _flows(probe) == 0), _flows(probe)
            closed_reading = probe.read()[server.pid]
        finally:
            probe.stop()
            server.kill()
            server.wait()
    keys = [bucket_key(b) for b in FINE_BOUNDS] + ["+Inf"]
    for reading in (idle_reading, closed_reading):
        slow = sum(reading.buckets[k] for k in keys[keys.index("0.05"):])
        assert slow == 0, reading
        # A flooded accept queue and the stalled flow may retransmit for real; a stall is never longer than the run.
        assert reading.rto_stall_seconds < 60
    # Idle flows hold their last reply until their next segment (here, the client's FIN): recorded then, at the
    # ACK's time, for the flows the LRU kept (it evicts in per-CPU batches, so fewer than max_flows); never the
    # stalled client's reply, which was not acknowledged.
    assert idle_reading.replies + closed_reading.replies <= 1000
    assert closed_reading.replies >= 50


# --- connection setup --------------------------------------------------------------------------------

SYNACK = "tcp flags & (syn|ack) == syn|ack"


@pytest.mark.bpf
@pytest.mark.netns
@pytest.mark.usefixtures("require_bpf")
@pytest.mark.parametrize("drop_first_synack", [False, True])
@pytest.mark.flaky(reruns=1, reason="once in CI's full suite the probe counted 9 SYN-ACK resends where TCPSynRetrans "
                   "said 12, no run skipped (exact 5 of 5 here): docs/delivery.md, docs/tcpretrans.md")
def test_synack_retransmits_and_connect_wait_match_the_kernel_and_the_clients(drop_first_synack):
    """The client's namespace drops the first SYN-ACK of every connection (a dynamic nft set remembers the client
    ports already hit): each of the 6 connections waits for a retransmitted SYN-ACK. The probe's SYN-ACK retransmits
    equal the server namespace's TCPSynRetrans exactly; every connection is counted, each as slow; and the time the
    probe says they waited is within [-50 ms, +250 ms] of the connect time each client measured (the first SYN-ACK's
    timeout is assumed to be Linux's 1 s; the probe's end is the client's ACK, one RTT after the client's)."""
    conns = 6
    with netns_pair_context(tag="issyn") as pair:
        server = subprocess.Popen(pair.exec_argv(pair.a, [sys.executable, "-m", "tests.probes.delivery_peers",
                                                          "server", str(PORT)]), stdout=subprocess.PIPE, text=True)
        probe = DeliveryProbe(DeliveryConfig(bounds=FINE_BOUNDS, max_targets=4))
        try:
            assert server.stdout.readline().strip() == "ready"
            if drop_first_synack:
                script = (f"table inet issyn {{\n  set hit {{ type inet_service; flags dynamic; }}\n"
                          f"  chain input {{ type filter hook input priority 0; policy accept;\n"
                          f"    tcp sport {PORT} {SYNACK} tcp dport @hit accept\n"
                          f"    tcp sport {PORT} {SYNACK} add @hit {{ tcp dport }} drop\n  }}\n}}\n")
                proc = subprocess.run(pair.exec_argv(pair.b, ["nft", "-f", "-"]), input=script, text=True,
                                      capture_output=True)
                assert proc.returncode == 0, proc.stderr
            probe.start([server.pid])
            probe.read()
            before = pair.netstat(pair.a)
            argv = [sys.executable, "-m", "tests.probes.delivery_peers", "client", pair.addr_a, str(PORT), str(conns),
                    "3", "300", "0.05"]
            client = subprocess.run(pair.exec_argv(pair.b, argv), capture_output=True, text=True, timeout=300)
            assert client.returncode == 0, client.stderr
            time.sleep(0.5)
            reading = probe.read()[server.pid]
            after = pair.netstat(pair.a)
            synretrans = after["TcpExt"]["TCPSynRetrans"] - before["TcpExt"]["TCPSynRetrans"]
            lost = probe.health().lost_events
            # What to read when the counts disagree (a miss seen only in full suites, never alone): every server
            # namespace counter that moved, and each client's connect time (1 s per SYN-ACK it waited for).
            moved = {f"{group}.{k}": v - before.get(group, {}).get(k, 0) for group in after
                     for k, v in after[group].items() if v != before.get(group, {}).get(k, 0)}
        finally:
            probe.stop()
            server.kill()
            server.wait()
    waits = [int(line.split()[2]) / 1e9 for line in client.stdout.splitlines() if line.startswith("c ")]
    assert len(waits) == conns
    assert reading.connects == conns - lost or reading.connects == conns, reading
    assert abs(reading.synack_retransmits - synretrans) <= lost, (reading, synretrans, lost, waits, moved)
    if not drop_first_synack:
        assert synretrans == 0 and reading.slow_connects == 0 and reading.connect_wait_seconds == 0, reading
        assert max(waits) < 0.5, waits
        return
    assert synretrans >= conns
    assert all(w >= 0.9 for w in waits), waits
    assert reading.slow_connects == conns - lost or reading.slow_connects == conns, reading
    truth = sum(waits)
    assert truth - 0.05 * conns <= reading.connect_wait_seconds <= truth + 0.25 * conns, (reading, waits)


# --- the first request's wait ------------------------------------------------------------------------------

# The client's request ("ID SIZE\n"): data, not a SYN or FIN (its pure ACKs are 52 bytes with timestamps).
FIRST_DATA = "tcp dport {port} tcp flags & (syn|fin|rst) == 0 ip length > 52"


def _first_request_run(pair: NetnsPair, client_argv: list[str], drop_first_request: bool):
    server = subprocess.Popen(pair.exec_argv(pair.a, [sys.executable, "-m", "tests.probes.delivery_peers",
                                                      "server", str(PORT)]), stdout=subprocess.PIPE, text=True)
    probe = DeliveryProbe(DeliveryConfig(bounds=FINE_BOUNDS, max_targets=4))
    try:
        assert server.stdout.readline().strip() == "ready"
        if drop_first_request:
            # The server's namespace drops the first data segment of every connection on arrival, before TCP sees
            # it (a dynamic set remembers the client ports already hit): each first request is resent after the
            # client's RTO, a loss on the wire as far as both kernels know.
            match = FIRST_DATA.format(port=PORT)
            script = (f"table inet isfrq {{\n  set hit {{ type inet_service; flags dynamic; }}\n"
                      f"  chain input {{ type filter hook input priority 0; policy accept;\n"
                      f"    {match} tcp sport @hit accept\n"
                      f"    {match} add @hit {{ tcp sport }} drop\n  }}\n}}\n")
            proc = subprocess.run(pair.exec_argv(pair.a, ["nft", "-f", "-"]), input=script, text=True,
                                  capture_output=True)
            assert proc.returncode == 0, proc.stderr
        probe.start([server.pid])
        probe.read()
        argv = [sys.executable, "-m", "tests.probes.delivery_peers", *client_argv]
        client = subprocess.run(pair.exec_argv(pair.b, argv), capture_output=True, text=True, timeout=300)
        assert client.returncode == 0, client.stderr
        time.sleep(0.5)
        reading = probe.read()[server.pid]
        lost = probe.health().lost_events
    finally:
        probe.stop()
        server.kill()
        server.wait()
    sent = dict(line.split()[1:] for line in client.stdout.splitlines() if line.startswith("s "))
    # Where the client says when its connect returned, the wait counts from there (a client thread slow to send
    # after its connect is, to the server's kernel, a late first request too).
    sent.update({f: end for f, _, end in (line.split()[1:] for line in client.stdout.splitlines()
                                             if line.startswith("c "))})
    written = dict(line.split()[1:] for line in server.stdout.read().splitlines() if line.startswith("w "))
    # Ground truth per connection: its connect returned (or its first request left) -> the server wrote the reply.
    truth = [(int(written[i]) - int(sent[i])) / 1e9 for i in sent]
    return reading, truth, lost


@pytest.mark.bpf
@pytest.mark.netns
@pytest.mark.usefixtures("require_bpf")
@pytest.mark.parametrize("drop_first_request", [False, True], ids=["clean", "first-request-lost"])
def test_a_lost_first_request_is_timed_from_the_handshake_as_the_clients_saw_it(drop_first_request):
    """6 connections, 3 requests each. With each connection's first request dropped once in the server's namespace,
    every connection is counted late, and the summed wait is within [-50 ms, +50 ms] per connection of what the
    clients and the server measured (the client's connect returned -> the server wrote its reply; the probe's start
    is the handshake's ACK arriving, its end the resent request arriving). Clean: every first request prompt, none late."""
    conns = 6
    with netns_pair_context(tag="isfrq") as pair:
        reading, truth, lost = _first_request_run(
            pair, ["client", pair.addr_a, str(PORT), str(conns), "3", "300", "0.05"], drop_first_request)
    assert len(truth) == conns
    assert reading.first_requests in (conns, conns - lost), reading
    assert reading.idle_connects == 0, reading
    if not drop_first_request:
        # Nothing lost; on a loaded host a client thread may still send its first request late after its connect
        # (the probe cannot tell that from a resend): the count follows the clients' own figures.
        slow = sum(0.2 <= t <= 3.5 for t in truth)
        assert slow - lost <= reading.late_requests <= slow, (reading, truth)
        return
    assert all(0.2 <= t <= 3.5 for t in truth), truth  # each resent after the client's RTO
    assert reading.late_requests in (conns, conns - lost), reading
    assert sum(truth) - 0.05 * conns <= reading.request_wait_seconds <= sum(truth) + 0.05 * conns, (reading, truth)


@pytest.mark.bpf
@pytest.mark.netns
@pytest.mark.usefixtures("require_bpf")
@pytest.mark.parametrize(("delay", "late"), [(0.0, False), (4.0, False), (1.0, True)],
                         ids=["prompt", "pool-idle-4s", "pool-1s-ahead"])
def test_a_pool_that_connects_ahead_of_use_is_not_a_lost_request_unless_it_waits_like_one(delay, late):
    """20 connections opened at once, each sending its first request DELAY s after its handshake, nothing lost: a
    pool idle for longer than the band (4 s) counts as connections opened ahead of use, never as late requests; one
    that waits 1 s reads exactly as a resent request would (the probe cannot tell them apart: the detector's baseline
    and its two-window rule are the guard, tests/analysis/test_request_wait.py)."""
    conns = 20
    with netns_pair_context(tag="isfrq") as pair:
        reading, truth, lost = _first_request_run(pair, ["early", pair.addr_a, str(PORT), str(conns), str(delay)],
                                                  drop_first_request=False)
    assert len(truth) == conns
    counted = conns - lost <= reading.first_requests <= conns
    assert counted, reading
    if delay > 3.5:
        assert reading.late_requests == 0 and reading.request_wait_seconds == 0, reading
        assert conns - lost <= reading.idle_connects <= conns, reading
    elif late:
        assert conns - lost <= reading.late_requests <= conns, reading
        assert reading.idle_connects == 0
    else:
        assert reading.late_requests == 0 and reading.idle_connects == 0, reading


# --- the target's network namespace ---------------------------------------------------------------------------

def _netns_script(port: int) -> str:
    """The other client's namespace: the first SYN-ACK of every connection dropped (a resent SYN-ACK, a slow
    connect), and a fifth of the server's other segments (retransmitted replies)."""
    return (f"table inet isns {{\n  set hit {{ type inet_service; flags dynamic; }}\n"
            f"  chain input {{ type filter hook input priority 0; policy accept;\n"
            f"    tcp sport {port} {SYNACK} tcp dport @hit accept\n"
            f"    tcp sport {port} {SYNACK} add @hit {{ tcp dport }} drop\n"
            f"    tcp sport {port} numgen random mod 10 < 2 drop\n  }}\n}}\n")


def _truth(pair: NetnsPair) -> tuple[int, int]:
    """(SYN-ACKs resent, data segments resent) by the server namespace of `pair` so far."""
    synack = pair.netstat(pair.a)["TcpExt"]["TCPSynRetrans"]
    return synack, pair.retrans_segs(pair.a) - synack


@pytest.mark.bpf
@pytest.mark.netns
@pytest.mark.usefixtures("require_bpf")
@pytest.mark.parametrize("other_is_target", [False, True], ids=["other-not-a-target", "both-targets"])
def test_a_server_on_the_same_port_in_another_namespace_is_not_the_targets(other_is_target):
    """Two servers on the same port, each in its own network namespace with its own clients, at the same time. Ours:
    6 clean connections. The other's: 10 connections whose first SYN-ACK is dropped and a fifth of whose replies'
    segments are lost. The target's reading counts its own connections, SYN-ACK resends, first requests and
    retransmits only (its namespace's counters are the truth), never the other's; where the other server is a target
    too, it gets its own, its namespace's counters again the truth. A probe keyed by port alone counted the other
    server's connections as ours (16 for 6), or, both being targets, all of them as the first one's."""
    conns, other_conns = 6, 10
    with netns_pair_context(tag="isns") as ours, netns_pair_context(tag="isns") as other:
        servers = [subprocess.Popen(p.exec_argv(p.a, [sys.executable, "-m", "tests.probes.delivery_peers", "server",
                                                      str(PORT)]), stdout=subprocess.PIPE, text=True)
                   for p in (ours, other)]
        probe = DeliveryProbe(DeliveryConfig(bounds=FINE_BOUNDS, max_targets=4))
        try:
            assert all(s.stdout.readline().strip() == "ready" for s in servers)
            proc = subprocess.run(other.exec_argv(other.b, ["nft", "-f", "-"]), input=_netns_script(PORT), text=True,
                                  capture_output=True)
            assert proc.returncode == 0, proc.stderr
            probe.start([servers[0].pid] + ([servers[1].pid] if other_is_target else []))
            probe.read()
            assert probe.health().detail["netns"] == "keyed"
            before = {"ours": _truth(ours), "other": _truth(other)}
            base = [sys.executable, "-m", "tests.probes.delivery_peers", "client"]
            theirs = subprocess.Popen(other.exec_argv(other.b, [*base, other.addr_a, str(PORT), str(other_conns), "4",
                                                               "20000", "0.05"]),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            client = subprocess.run(ours.exec_argv(ours.b, [*base, ours.addr_a, str(PORT), str(conns), "3", "300",
                                                            "0.05"]), capture_output=True, text=True, timeout=300)
            assert client.returncode == 0, client.stderr
            _, err = theirs.communicate(timeout=300)
            assert theirs.returncode == 0, err
            time.sleep(0.5)
            readings = probe.read()
            after = {"ours": _truth(ours), "other": _truth(other)}
            lost = probe.health().lost_events
        finally:
            probe.stop()
            for s in servers:
                s.kill()
                s.wait()
    synacks = {k: after[k][0] - before[k][0] for k in after}
    data = {k: after[k][1] - before[k][1] for k in after}
    # The other namespace did what the test needs of it: resent SYN-ACKs and reply segments on the same port.
    assert synacks["other"] >= other_conns and data["other"] > 0, (synacks, data)
    mine = readings[servers[0].pid]
    assert conns - lost <= mine.connects <= conns, mine
    assert conns - lost <= mine.first_requests <= conns, mine
    assert abs(mine.synack_retransmits - synacks["ours"]) <= lost, (mine, synacks)
    assert mine.slow_connects <= synacks["ours"], (mine, synacks)
    assert mine.retransmits <= data["ours"], (mine, data)
    assert mine.replies <= conns * 3, mine
    if other_is_target:
        theirs_reading = readings[servers[1].pid]
        assert other_conns - lost <= theirs_reading.connects <= other_conns, theirs_reading
        assert abs(theirs_reading.synack_retransmits - synacks["other"]) <= lost, (theirs_reading, synacks)
        assert other_conns - lost <= theirs_reading.slow_connects <= other_conns, theirs_reading
        assert 0 < theirs_reading.retransmits <= data["other"], (theirs_reading, data)

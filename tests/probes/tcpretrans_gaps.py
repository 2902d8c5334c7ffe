"""Where tcpretrans and RetransSegs disagree: retransmits the kernel counts with no tracepoint event.

Run as root from the repository root (needs BCC and `bpftool`; not collected by pytest):

    .venv/bin/python tests/probes/tcpretrans_gaps.py --runs 10 --hogs 3

Each run moves 2 MB across a veth between two network namespaces with 20% random loss each
way (the same set-up as tests/probes/test_probe_tcpretrans.py), with the real TcpRetransProbe
reading every second and, beside it, a diagnostic program on the same tracepoint that
emits one perf event per retransmit with the socket's own `tcp_sock.total_retrans` and the
packet's segment count and length, read at that moment. A raw-tracepoint program counts every
event as a third witness. Per run it prints RetransSegs, the probe's count, the diagnostic's
events, and every point where the socket's total_retrans moved by more than the event that
saw it: retransmits for which no program ran.

The diagnostic dereferences kernel structs (sk_buff, tcp_sock) at offsets it takes from this
kernel's BTF through bpftool. The probe itself never does (docs/kernel.md's rules); this
script is an instrument for checking it, not a part of it.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from probes.base import load_bpf, prog_recursion_misses  # noqa: E402
from probes.tcpretrans import TcpRetransProbe  # noqa: E402
from tests.probes.netns_helper import netns_pair_context  # noqa: E402
from tests.probes.test_probe_tcpretrans import Peer, _between, _wait_quiet  # noqa: E402

WATCH_C = r"""
struct event_t { u64 ts; u64 sk; u32 err; u32 segs; u32 total_retrans; u32 len; u16 sport; u16 dport; };
BPF_PERF_OUTPUT(events);
BPF_ARRAY(counts, u64, 2);   // [0] classic tracepoint runs, [1] raw tracepoint runs

RAW_TRACEPOINT_PROBE(tcp_retransmit_skb)
{
    int k = 1;
    u64 *n = counts.lookup(&k);
    if (n)
        __sync_fetch_and_add(n, 1);
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
    int k = 0;
    u64 *n = counts.lookup(&k);
    if (n)
        __sync_fetch_and_add(n, 1);
    struct event_t e = {.ts = bpf_ktime_get_ns(), .sk = (u64)args->skaddr, .err = args->err, .sport = args->sport, .dport = args->dport};
    u16 segs = 0;
    bpf_probe_read_kernel(&segs, sizeof(segs), (void *)args->skbaddr + SKB_CB + 8);  // tcp_skb_cb.tcp_gso_segs
    e.segs = segs;
    bpf_probe_read_kernel(&e.len, sizeof(e.len), (void *)args->skbaddr + SKB_LEN);
    bpf_probe_read_kernel(&e.total_retrans, sizeof(e.total_retrans), (void *)args->skaddr + TP_TOTAL_RETRANS);
    events.perf_submit(args, &e, sizeof(e));
    return 0;
}
"""


class Event(ctypes.Structure):
    _fields_ = [("ts", ctypes.c_uint64), ("sk", ctypes.c_uint64), ("err", ctypes.c_int32), ("segs", ctypes.c_uint32),
                ("total_retrans", ctypes.c_uint32), ("len", ctypes.c_uint32), ("sport", ctypes.c_uint16),
                ("dport", ctypes.c_uint16)]


def btf_offset(struct: str, member: str) -> int:
    """Byte offset of `struct`.`member` in this kernel's BTF, through `bpftool btf dump ... format raw`."""
    try:
        raw = subprocess.run(["bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "raw"],
                             capture_output=True, text=True, check=True).stdout
    except FileNotFoundError:
        sys.exit("tcpretrans_gaps: needs bpftool (apt-get install bpftool)")
    start = raw.index(f"STRUCT '{struct}' ")
    block = raw[start:raw.index("\n[", start)]
    found = re.search(rf"'{member}' type_id=\d+ bits_offset=(\d+)", block)
    if not found:
        sys.exit(f"tcpretrans_gaps: no member {member} in struct {struct} in this kernel's BTF")
    return int(found.group(1)) // 8


def gaps(events: list[Event]) -> list[tuple[int, str]]:
    """Per socket, each event after which total_retrans moved by more than that event's segments.

    Returns (segments no event accounts for, description) pairs.
    """
    found, last = [], {}
    # Each CPU has its own perf buffer, so events arrive grouped by CPU: put them in time order.
    for e in sorted(events, key=lambda e: e.ts):
        counted = e.segs if e.err == 0 else 0
        moved = e.total_retrans - last.get(e.sk, e.total_retrans - counted)
        if moved != counted:
            found.append((moved - counted, f"port {e.sport}->{e.dport}: total_retrans {e.total_retrans - moved} -> "
                                           f"{e.total_retrans} at one event (err {e.err}, {e.segs} segment(s), {e.len} bytes)"))
        last[e.sk] = e.total_retrans
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hogs", type=int, default=0, help="busy getppid loops competing for the CPUs")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root")
    defines = {"SKB_CB": btf_offset("sk_buff", "cb"), "SKB_LEN": btf_offset("sk_buff", "len"),
               "TP_TOTAL_RETRANS": btf_offset("tcp_sock", "total_retrans")}
    text = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + WATCH_C
    watch = load_bpf(text)
    events: list[Event] = []
    watch[b"events"].open_perf_buffer(lambda cpu, data, size: events.append(
        Event.from_buffer_copy(ctypes.string_at(data, ctypes.sizeof(Event)))), page_cnt=256)
    probe = TcpRetransProbe()
    probe.start([])
    hogs = [subprocess.Popen([sys.executable, "-c", "import os\nwhile True: os.getppid()"]) for _ in range(args.hogs)]
    totals = {"retranssegs": 0, "probe": 0, "gap_segments": 0}
    try:
        for run in range(1, args.runs + 1):
            with netns_pair_context("isgap", rto_min_ms=10, rto_max_ms=1000) as pair:
                port = random.randrange(20000, 30000)
                pair.add_random_drop(pair.b, port)
                pair.add_random_drop(pair.a, port)
                probe.read()
                watch.perf_buffer_poll(timeout=10)
                events.clear()
                before = pair.retrans_segs(pair.a) + pair.retrans_segs(pair.b)
                counted = 0
                server = Peer(pair, pair.b, "server", pair.addr_b, port, 2_000_000)
                client = None
                try:
                    server.line(10)
                    client = Peer(pair, pair.a, "client", pair.addr_b, port, 2_000_000)
                    client.line(30)
                    while client.line(1.0) is None:
                        watch.perf_buffer_poll(timeout=10)
                        probe.read()
                        counted += sum(f.retransmits for f in _between(pair, probe.last_host.flows))
                    server.line(10)
                    after = _wait_quiet(pair, [client, server])
                finally:
                    server.close()
                    if client is not None:
                        client.close()
                watch.perf_buffer_poll(timeout=100)
                probe.read()
                counted += sum(f.retransmits for f in _between(pair, probe.last_host.flows))
                mine = [e for e in events if port in (e.sport, e.dport)]
                found = gaps(mine)
                expected = after - before
                seen = sum(e.segs for e in mine if e.err == 0)
                totals["retranssegs"] += expected
                totals["probe"] += counted
                totals["gap_segments"] += sum(missing for missing, _ in found)
                print(f"run {run}: RetransSegs {expected}, probe {counted}, diagnostic events {len(mine)} "
                      f"({seen} segments sent), gaps {len(found)}", flush=True)
                for _, line in found:
                    print(f"    {line}", flush=True)
        counts = [watch[b"counts"][k].value for k in range(2)]
        misses = {f.name.decode(): prog_recursion_misses(f.fd, f.name.decode()) for f in watch.funcs.values()}
        print(f"total: RetransSegs {totals['retranssegs']}, probe {totals['probe']}, segments in gaps "
              f"{totals['gap_segments']}; tracepoint runs classic {counts[0]} raw {counts[1]}, skipped runs {misses}, "
              f"probe's skipped runs {probe.missed_runs()}")
    finally:
        for hog in hogs:
            hog.kill()
        probe.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

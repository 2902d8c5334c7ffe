"""What the server's kernel sees of packet loss on the way to it (docs/detector.md "Loss on the way to the server").

A plain HTTP server on loopback, a client opening one connection per request at 4/s timing each request, and from
`--before` seconds on, PERCENT % of the packets *to* the server's port dropped by nftables for `--fault` seconds
(tests/scenarios/nftdrop.py). Beside it, a BPF program on tracepoints only (the delivery probe's hooks) times, per
connection on that port, the handshake's completion (`inet_sock_set_state` SYN_RECV -> ESTABLISHED) to the first
segment carrying data (`tcp_probe`, data_len > 0: the request), and counts SYN-ACK and data retransmits. Prints the
clients' slow requests and what the kernel saw, before and during the fault. Root; one run takes about
before + fault + 10 seconds.

    .venv/bin/python -m benchmarks.request_loss_seen [--percent 15] [--before 30] [--fault 60]
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import http.server
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import free_port

NFTDROP = Path(__file__).resolve().parents[1] / "tests" / "scenarios" / "nftdrop.py"

BPF_TEXT = r"""
struct ev_t { u64 ts; u32 kind; u32 pad; u64 delta; };
BPF_TABLE("lru_hash", u64, u64, est, 65536);
BPF_PERF_OUTPUT(events);

TRACEPOINT_PROBE(sock, inet_sock_set_state) {
    if (args->protocol != 6 || args->sport != PORT)
        return 0;
    u64 sk = (u64)args->skaddr;
    if (args->oldstate == 3 && args->newstate == 1) {
        u64 now = bpf_ktime_get_ns();
        est.update(&sk, &now);
        struct ev_t e = {now, 0, 0, 0};
        events.perf_submit(args, &e, sizeof(e));
    }
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_probe) {
    if (args->sport != PORT)
        return 0;
    u64 sk = (u64)args->skaddr;
    u64 *t = est.lookup(&sk);
    if (!t)
        return 0;
    /* The first segment after the handshake, whatever it carries, ends the wait for the request. */
    u64 now = bpf_ktime_get_ns();
    struct ev_t e = {now, args->data_len ? 1 : 4, 0, now - *t};
    est.delete(&sk);
    events.perf_submit(args, &e, sizeof(e));
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_synack) {
    if (args->sport != PORT)
        return 0;
    struct ev_t e = {bpf_ktime_get_ns(), 2, 0, 0};
    events.perf_submit(args, &e, sizeof(e));
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
    if (args->sport != PORT)
        return 0;
    struct ev_t e = {bpf_ktime_get_ns(), 3, 0, 0};
    events.perf_submit(args, &e, sizeof(e));
    return 0;
}
"""


class _Event(ctypes.Structure):
    _fields_ = [("ts", ctypes.c_uint64), ("kind", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("delta", ctypes.c_uint64)]


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)  # each request's, at the client
    gaps: list[float] = field(default_factory=list)  # handshake to the request's first byte, at the server
    synack_retransmits: int = 0
    retransmits: int = 0

    def line(self, name: str) -> str:
        lat, gaps = sorted(self.latencies), sorted(self.gaps)
        slow = [x for x in lat if x >= 0.2]
        seen = [g for g in gaps if g >= 0.1]
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        return (f"{name}: {len(lat)} requests, p99 {p99:.3f} s, {len(slow)} took >= 0.2 s ({sum(slow):.1f} s in all, "
                f"{sum(x >= 1.0 for x in lat)} >= 1 s) | server: {len(gaps)} requests timed after the handshake, "
                f"median {1000 * gaps[len(gaps) // 2] if gaps else float('nan'):.2f} ms, {len(seen)} >= 100 ms "
                f"({sum(seen):.1f} s in all: {', '.join(f'{g:.2f}' for g in seen)}); SYN-ACKs resent "
                f"{self.synack_retransmits}, segments resent {self.retransmits}")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--percent", type=int, default=15)
    ap.add_argument("--before", type=float, default=30.0)
    ap.add_argument("--fault", type=float, default=60.0)
    args = ap.parse_args(argv)
    from bcc import BPF  # root, BPF: imported only when run

    port = free_port()
    bpf = BPF(text=BPF_TEXT.replace("PORT", str(port)))
    offset = time.time() - time.monotonic()  # bpf_ktime_get_ns is CLOCK_MONOTONIC
    events: list[tuple[float, int, float]] = []

    def handle(_cpu: int, data: int, _size: int) -> None:
        e = ctypes.cast(data, ctypes.POINTER(_Event)).contents
        events.append((e.ts / 1e9 + offset, e.kind, e.delta / 1e9))

    bpf["events"].open_perf_buffer(handle, page_cnt=64)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    fault_at = time.time() + args.before
    end = fault_at + args.fault + 5.0
    requests: list[tuple[float, float]] = []
    drop = None
    try:
        while time.time() < end:
            t = time.time()
            if drop is None and t >= fault_at:
                drop = subprocess.Popen([sys.executable, str(NFTDROP), str(port), str(args.fault), str(args.percent),
                                         "drop", "to"])
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request("GET", "/")
                conn.getresponse().read()
                requests.append((t, time.time() - t))
            except OSError as exc:
                print(f"request at {t:.1f}: {type(exc).__name__}", file=sys.stderr)
            finally:
                conn.close()
            bpf.perf_buffer_poll(timeout=0)
            time.sleep(max(0.0, 0.25 - (time.time() - t)))
    finally:
        if drop is not None:
            drop.wait(timeout=args.fault + 30)
        server.shutdown()
    bpf.perf_buffer_poll(timeout=500)
    fault_end = fault_at + args.fault
    phases = {"before": Phase(), "fault": Phase()}

    def phase_of(t: float) -> Phase | None:
        return phases["before"] if t < fault_at else phases["fault"] if t < fault_end + 5.0 else None

    for t, latency in requests:
        if (p := phase_of(t)) is not None:
            p.latencies.append(latency)
    for t, kind, delta in events:
        if (p := phase_of(t)) is None:
            continue
        if kind == 1:
            p.gaps.append(delta)
        elif kind == 2:
            p.synack_retransmits += 1
        elif kind == 3:
            p.retransmits += 1
    print(f"{args.percent} % of the packets to port {port} dropped for {args.fault:.0f} s after {args.before:.0f} s")
    for name, p in phases.items():
        print(p.line(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())

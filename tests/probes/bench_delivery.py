"""What the delivery probe costs per TCP segment, next to the tcpretrans probe and bcc's tcpretrans-bpfcc.

Run as root from the repository root (a few minutes; see docs/BENCHMARKS.md, "Delivery probe overhead"):

    .venv/bin/python tests/probes/bench_delivery.py --rounds 10 --json /tmp/bench_delivery.json

Workload: a one-byte ping-pong over a loopback TCP connection between two processes pinned to one CPU (a
client, timed, and a server holding its listener). Each round trip is 2 segments received (the byte each
way, its ACK riding on the answer), 2 sends and 2 receives. ns per round trip is the p10 of 100-round-trip
chunks of a run; a block is `--runs` runs; each round runs, per condition in a shuffled order, a pair of
blocks (no probe / the condition attached, in a random order), and the cost is the per-pair difference.

Conditions: the delivery probe with the server as its target (every segment of the flow is followed:
a reply opens at each send and is delivered at the next segment), with another process as its target
(the host's cost for flows that are not a target's: one hash miss per segment, the target filter per
send/receive), the tcpretrans probe, and bcc's `tcpretrans-bpfcc` (launched, waited for until attached).
No segment is lost here: the two retransmit tools pay only for being attached. And the delivery probe without
the first request's wait (`DeliveryConfig(first_request=False)`), the same probe as before that was added.

`--connections`: a connection per op instead (connect, a byte each way, close; the server's child accepts in a
loop): ns per connection, where the first request's wait adds its work (a `flows` entry made at the handshake, a
branch at the first segment). `--only TEXT` (repeatable) keeps the conditions whose name contains TEXT:

    .venv/bin/python tests/probes/bench_delivery.py --connections --round-trips 2000 --rounds 6 \
        --only "ours delivery (target" --only "without the first"

Not collected by pytest (the name does not start with test_).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from probes.delivery import DeliveryConfig, DeliveryProbe
from probes.tcpretrans import TcpRetransProbe

WORKLOAD_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

// argv: round-trips-per-run cpu per-chunk percentile. Prints "ready CLIENT SERVER", then per 'g' on stdin
// the percentile of the run's per-chunk ns per round trip.
int main(int argc, char **argv)
{
    long n = atol(argv[1]), chunk = atol(argv[3]), pct = atol(argv[4]), chunks = n / chunk;
    int conn_mode = argc > 5 && argv[5][0] == 'c';
    double *per_op = calloc(chunks, sizeof *per_op);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(atoi(argv[2]), &set);
    if (sched_setaffinity(0, sizeof set, &set))
        return 3;
    int one = 1, lst = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    if (bind(lst, (struct sockaddr *)&addr, sizeof addr) || listen(lst, 128) ||
        getsockname(lst, (struct sockaddr *)&addr, &len))
        return 4;
    pid_t child = fork();
    char c = 'x';
    if (child == 0 && conn_mode) {
        for (;;) {
            int t = accept(lst, NULL, NULL);
            if (t < 0)
                _exit(5);
            setsockopt(t, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (read(t, &c, 1) == 1 && write(t, &c, 1) != 1)
                _exit(5);
            close(t);
        }
    }
    if (child == 0) {
        int s = accept(lst, NULL, NULL);  // the listener stays open: the server's port is a listening port
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        while (read(s, &c, 1) == 1)
            if (write(s, &c, 1) != 1)
                _exit(5);
        _exit(0);
    }
    int s = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(s, (struct sockaddr *)&addr, sizeof addr))
        return 6;
    printf("ready %d %d\n", getpid(), (int)child);
    fflush(stdout);
    if (conn_mode) {
        // A connection per op: connect, one byte each way, close (the server side closes after its answer).
        close(s);
        while (read(0, &c, 1) == 1 && c == 'g') {
            for (long k = 0; k < chunks; k++) {
                long t0 = now_ns();
                for (long i = 0; i < chunk; i++) {
                    int t = socket(AF_INET, SOCK_STREAM, 0);
                    setsockopt(t, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    if (connect(t, (struct sockaddr *)&addr, sizeof addr) || write(t, &c, 1) != 1 ||
                        read(t, &c, 1) != 1)
                        return 8;
                    close(t);
                }
                per_op[k] = (double)(now_ns() - t0) / chunk;
            }
            qsort(per_op, chunks, sizeof *per_op, cmp_double);
            printf("%.3f\n", per_op[chunks * pct / 100]);
            fflush(stdout);
        }
        kill(child, SIGTERM);
        waitpid(child, NULL, 0);
        return 0;
    }
    while (read(0, &c, 1) == 1 && c == 'g') {
        for (long k = 0; k < chunks; k++) {
            long t0 = now_ns();
            for (long i = 0; i < chunk; i++)
                if (write(s, &c, 1) != 1 || read(s, &c, 1) != 1)
                    return 7;
            per_op[k] = (double)(now_ns() - t0) / chunk;
        }
        qsort(per_op, chunks, sizeof *per_op, cmp_double);
        printf("%.3f\n", per_op[chunks * pct / 100]);
        fflush(stdout);
    }
    close(s);
    waitpid(child, NULL, 0);
    return 0;
}
"""

SEGMENTS_PER_OP = 2


class Workload:
    def __init__(self, binary: Path, args: argparse.Namespace) -> None:
        mode = ["conn"] if args.connections else []
        self.proc = subprocess.Popen([str(binary), str(args.round_trips), str(args.cpu), "100", "10", *mode],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        _, client, server = self._line(30).split()
        self.client, self.server = int(client), int(server)

    def _line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError("workload did not answer")
        return self.proc.stdout.readline().strip()

    def go(self) -> float:
        self.proc.stdin.write("g")
        self.proc.stdin.flush()
        return float(self._line(120))

    def kill(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _probe(factory: Callable[[], object], target: Callable[[Workload], list[int]]):
    def attach(w: Workload) -> Callable[[], None]:
        probe = factory()
        probe.start(target(w))
        return probe.stop
    return attach


def _bcc_tcpretrans(w: Workload) -> Callable[[], None]:
    proc = subprocess.Popen(["tcpretrans-bpfcc"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    # It prints "Tracing retransmits ..." once its programs are attached.
    if not ready or "Tracing" not in proc.stdout.readline():
        proc.kill()
        raise RuntimeError("tcpretrans-bpfcc did not start")

    def detach() -> None:
        proc.terminate()
        proc.wait(timeout=30)
    return detach


CONDITIONS: dict[str, Callable[[Workload], Callable[[], None]]] = {
    "ours delivery (target: the server)": _probe(DeliveryProbe, lambda w: [w.server]),
    "ours delivery without the first request's wait (target: the server)":
        _probe(lambda: DeliveryProbe(DeliveryConfig(first_request=False)), lambda w: [w.server]),
    "ours delivery (non-target)": _probe(DeliveryProbe, lambda w: [os.getpid()]),
    "ours tcpretrans (host-wide)": _probe(TcpRetransProbe, lambda w: [w.server]),
    "tcpretrans-bpfcc": _bcc_tcpretrans,
}


def block(w: Workload, runs: int) -> float:
    return statistics.median(w.go() for _ in range(runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--round-trips", type=int, default=20000)
    parser.add_argument("--cpu", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--connections", action="store_true",
                        help="a connection per op (connect, a byte each way, close) instead of a ping-pong on one")
    parser.add_argument("--only", action="append", help="run only the conditions whose name contains this")
    args = parser.parse_args(argv)
    conditions = {k: v for k, v in CONDITIONS.items() if not args.only or any(o in k for o in args.only)}
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        src, binary = Path(tmp) / "w.c", Path(tmp) / "w"
        src.write_text(WORKLOAD_C)
        subprocess.run(["cc", "-O2", "-o", str(binary), str(src)], check=True)
        w = Workload(binary, args)
        diffs: dict[str, list[float]] = {name: [] for name in conditions}
        base: dict[str, list[float]] = {name: [] for name in conditions}
        cpu0 = time.process_time()
        try:
            block(w, 1)  # warm up
            for _ in range(args.rounds):
                for name in rng.sample(list(conditions), len(conditions)):
                    order = rng.random() < 0.5
                    none = block(w, args.runs) if order else None
                    detach = conditions[name](w)
                    try:
                        with_probe = block(w, args.runs)
                    finally:
                        detach()
                    if none is None:
                        none = block(w, args.runs)
                    diffs[name].append(with_probe - none)
                    base[name].append(none)
        finally:
            w.kill()
    unit = "connection" if args.connections else "round trip"
    print(f"| condition | ns per {unit}: median [p25..p75] | ns per segment received | "
          f"{unit} without ({SEGMENTS_PER_OP if not args.connections else 'SYN, ACK, data, FIN: ~5'} segments) |")
    print("|---|---|---|---|")
    out = {}
    for name, ds in diffs.items():
        q = statistics.quantiles(ds, n=4) if len(ds) > 1 else [ds[0]] * 3
        med = statistics.median(ds)
        out[name] = {"diff_ns": ds, "none_ns": base[name]}
        print(f"| {name} | {med:.0f} [{q[0]:.0f}..{q[2]:.0f}] | {med / SEGMENTS_PER_OP:.0f} | "
              f"{statistics.median(base[name]):.0f} ns |")
    print(f"(benchmark's own CPU: {time.process_time() - cpu0:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

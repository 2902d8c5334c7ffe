"""What the probes' reads of a process's TCP endpoints cost per window, before and after one read per namespace
(issue 33, issue 31; not collected by pytest).

The agent resolves the local endpoints of each target's sockets twice per window: the retransmit probe to attribute
flows, the delivery probe for the listening ports; a family asks once per member. Each `/proc/PID/net/tcp{,6}` read
walks the kernel's whole TCP hash table (probes/sockets.py). This times, in CPU seconds of this process, one
window's calls (2 probes x N members of this process's namespace) with the code before (every call reads both
tables), one /proc read per namespace and table (none for a family with no socket in use), and now (the same, through
sock_diag in the agent's own namespace), interleaved.

    .venv/bin/python -m tests.probes.bench_proc_sockets [--members 1 4] [--windows 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

from probes.sockets import ProcSockets, parse_proc_net_tcp


class EveryCallReads(ProcSockets):
    """The code before: both tables read by every call."""

    def endpoints(self, pid: int):  # type: ignore[no-untyped-def]
        inodes = self.socket_inodes(pid)
        found = set()
        for table in ("tcp", "tcp6"):
            try:
                text = (self.proc_root / str(pid) / "net" / table).read_text()
            except FileNotFoundError:
                continue
            found.update(parse_proc_net_tcp(text, only=inodes).values())
        return found


def window_cpu(sockets: ProcSockets, pids: list[int]) -> float:
    t0 = time.process_time()
    for _ in range(2):  # the retransmit probe and the delivery probe
        for pid in pids:
            sockets.endpoints(pid)
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--windows", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    sockstat = Path("/proc/net/sockstat").read_text().splitlines()[1]
    out = {"sockstat": sockstat, "sockstat6": Path("/proc/net/sockstat6").read_text().splitlines()[0],
           "load_average": os.getloadavg(), "results": []}
    # before: every call reads both tables; proc: one /proc read per namespace and table; now: sock_diag.
    makers = {"before": EveryCallReads, "proc": lambda: ProcSockets(sock_diag=False), "now": ProcSockets}
    for n in args.members:
        pids = [os.getpid()] * n  # members of one namespace; this process holds a listening socket
        costs: dict[str, list[float]] = {name: [] for name in makers}
        for w in range(args.windows):
            # A fresh cache per window, as the next window's reads come after the cache aged (0.5 s < 5 s).
            order = list(makers) if w % 2 else list(makers)[::-1]
            for name in order:
                costs[name].append(window_cpu(makers[name](), pids))
        row: dict = {"members": n}
        for name, values in costs.items():
            row[f"{name}_ms"] = 1e3 * statistics.median(values)
            row[f"{name}_p90_ms"] = 1e3 * statistics.quantiles(values, n=10)[-1]
            row[f"{name}_percent_of_core_at_5s"] = row[f"{name}_ms"] / 5000 * 100
        out["results"].append(row)
    listener.close()
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['sockstat']} | {out['sockstat6']} | load {out['load_average'][0]:.2f}")
        print("| members | every call reads, ms/window (p90) | one /proc read per namespace | sock_diag | "
              "% of a core at 5 s: every call / /proc / sock_diag |")
        print("|---|---|---|---|---|")
        for r in out["results"]:
            cells = " | ".join(f"{r[f'{k}_ms']:.2f} ({r[f'{k}_p90_ms']:.2f})" for k in ("before", "proc", "now"))
            share = " / ".join(f"{r[f'{k}_percent_of_core_at_5s']:.3f}" for k in ("before", "proc", "now"))
            print(f"| {r['members']} | {cells} | {share} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

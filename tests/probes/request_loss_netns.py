"""What loss on the way to a server leaves in its kernel: counts, against the clients' own figures.

Run as root from the repository root (about 15 s; docs/detector.md "Why nothing general opens it earlier"):

    .venv/bin/python -m tests.probes.request_loss_netns [--percent 15] [--connections 200]

A server (tests/probes/delivery_peers.py) in one namespace, a client in another opening a connection per request
(CONNECTIONS over 10 s, one 100-byte reply each); the server's namespace drops PERCENT % of the TCP packets arriving
for its port (its input hook, as the `request_loss` scenario's nftdrop.py does). Prints the delivery probe's reading
(connections, first requests, late ones, resends), the clients' slow connects (>= 0.9 s: a lost SYN) and slow
requests (>= 0.2 s), and the server namespace's TCP counters. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from probes.delivery import DeliveryConfig, DeliveryProbe
from tests.probes.netns_helper import netns_pair_context

PORT = 18555
COUNTERS = ("TCPSynRetrans", "TCPLossProbes", "TCPDSACKRecv", "TCPTimeouts", "TCPSpuriousRTOs", "TCPOFOQueue")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--percent", type=int, default=15)
    parser.add_argument("--connections", type=int, default=200)
    args = parser.parse_args(argv)
    with netns_pair_context(tag="isrl") as pair:
        server = subprocess.Popen(pair.exec_argv(pair.a, [sys.executable, "-m", "tests.probes.delivery_peers",
                                                          "server", str(PORT)]), stdout=subprocess.PIPE, text=True)
        probe = DeliveryProbe(DeliveryConfig(max_targets=4))
        try:
            if server.stdout.readline().strip() != "ready":
                raise SystemExit("the server did not start")
            pair.add_input_rules(pair.a, [f"tcp dport {PORT} numgen random mod 100 < {args.percent} drop"])
            probe.start([server.pid])
            probe.read()
            before, segs = pair.netstat(pair.a)["TcpExt"], pair.retrans_segs(pair.a)
            client = subprocess.run(pair.exec_argv(pair.b, [
                sys.executable, "-m", "tests.probes.delivery_peers", "client", pair.addr_a, str(PORT),
                str(args.connections), "1", "100", "10"]), capture_output=True, text=True, timeout=300)
            if client.returncode != 0:
                raise SystemExit(client.stderr)
            time.sleep(1)
            r = probe.read()[server.pid]
            after, segs = pair.netstat(pair.a)["TcpExt"], pair.retrans_segs(pair.a) - segs
        finally:
            probe.stop()
            server.kill()
            server.wait()
    lines = [line.split() for line in client.stdout.splitlines()]
    connect = [int(f[2]) / 1e9 for f in lines if f[0] == "c"]
    sent = {f[1]: int(f[2]) for f in lines if f[0] == "s"}
    got = {f[1]: int(f[2]) for f in lines if f[0] == "r"}
    request = [(got[i] - sent[i]) / 1e9 for i in sent if i in got]
    print(f"probe: connects {r.connects}, first requests {r.first_requests} (the rest: handshakes completed by the "
          f"request, their ACK lost), late {r.late_requests} ({r.request_wait_seconds:.2f} s), resends "
          f"{r.retransmits}, replies {r.replies}")
    print(f"clients: {len(connect)} connections, {sum(c >= 0.9 for c in connect)} connected in >= 0.9 s (a lost SYN), "
          f"{sum(x >= 0.2 for x in request)} of {len(request)} requests answered in >= 0.2 s")
    print("server namespace: RetransSegs " + str(segs) + ", "
          + ", ".join(f"{k} {after.get(k, 0) - before.get(k, 0)}" for k in COUNTERS))
    return 0


if __name__ == "__main__":
    sys.exit(main())

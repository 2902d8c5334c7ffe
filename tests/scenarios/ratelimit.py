"""A congested link from outside the server: loopback shaped to RATE by a token bucket (tc tbf) for SECONDS (root).

Packets that would wait longer than LATENCY in the bucket's queue are dropped, as on a saturated uplink: TCP sees
both delay and loss. Every loopback user is shaped, the server's clients and the agent's scrapes alike. Refuses to
run when loopback already has a root qdisc of its own (it would be lost); the shaping is removed at exit.
"""

import signal
import subprocess
import sys
import time

DEVICE = "lo"


def tc(*args: str) -> str:
    done = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        raise SystemExit(f"tc {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def main(seconds: float, rate: str = "256kbit", latency: str = "100ms") -> int:
    current = tc("qdisc", "show", "dev", DEVICE, "root")
    if current.strip() and not current.startswith("qdisc noqueue"):
        raise SystemExit(f"{DEVICE} already has a root qdisc, not replacing it: {current.strip()}")
    # burst: one full-size loopback packet (64 KiB) must fit the bucket, or TSO segments never pass.
    tc("qdisc", "add", "dev", DEVICE, "root", "tbf", "rate", rate, "burst", "65536", "latency", latency)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        time.sleep(seconds)
    finally:
        tc("qdisc", "del", "dev", DEVICE, "root")
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]), *sys.argv[2:4]))

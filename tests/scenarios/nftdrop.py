"""Packet loss from outside the server: an nftables table dropping PERCENT% of TCP to and from PORT (root).

ACTION `drop` (the default) loses the packets silently; `reset` answers the ones sent to PORT with a TCP reset, as a
firewall that rejects does: clients see refused and reset connections at once instead of timeouts.

DIRECTION `both` (the default) samples every packet to and from PORT in the input and output hooks (a loopback
packet crosses both, so it is dropped about twice as often as PERCENT says). `to` drops PERCENT% of the packets
arriving for PORT (requests and the clients' acks), `from` PERCENT% of those PORT sends (responses): each in one
hook, as a single `iptables -A INPUT --dport` or `-A OUTPUT --sport` rule would.

    nftdrop.py PORT SECONDS [PERCENT [ACTION [DIRECTION]]]
"""

import signal
import subprocess
import sys
import time


def nft(args: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        raise SystemExit(f"nft {' '.join(args)}: {done.stderr.strip()}")


ACTIONS = {"drop": "drop", "reset": "reject with tcp reset"}
DIRECTIONS = ("both", "to", "from")


def chain(hook: str, rules: list[str]) -> str:
    return (f"  chain {hook} {{\n    type filter hook {hook} priority -150; policy accept;\n"
            + "".join(f"    {rule}\n" for rule in rules) + "  }\n")


def main(port: int, seconds: float, percent: int = 10, action: str = "drop", direction: str = "both") -> int:
    if not 0 < percent <= 100:
        raise SystemExit(f"percent must be within 1..100, got {percent}")
    if action not in ACTIONS:
        raise SystemExit(f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
    if direction not in DIRECTIONS:
        raise SystemExit(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    if action == "reset" and direction == "from":
        raise SystemExit("a reset answers packets sent to the port: use direction to or both with reset")
    table = f"infersight_eval_drop_{port}"
    # numgen's range is 0..99, so "< 100" does not parse: every packet is simply dropped.
    sample = "" if percent == 100 else f"numgen random mod 100 < {percent} "
    to_port = f"tcp dport {port} {sample}counter {ACTIONS[action]}"
    from_port = f"tcp sport {port} {sample}counter drop"
    if direction == "to":
        rules = chain("input", [to_port])
    elif direction == "from":
        rules = chain("output", [from_port])
    else:
        # Input and output hooks: loopback traffic passes both, so the server's own port is covered. A reset goes
        # to the sender, so only packets *to* the port are rejected: the client is the one told.
        rules = "".join(chain(hook, [to_port] + ([from_port] if action == "drop" else []))
                        for hook in ("input", "output"))
    nft(["-f", "-"], f"table inet {table} {{\n{rules}}}\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        time.sleep(seconds)
    finally:
        nft(["delete", "table", "inet", table])
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), *(int(a) for a in sys.argv[3:4]), *sys.argv[4:6]))

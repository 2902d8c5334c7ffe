"""Packet loss on one TCP port with nftables: a table of our own, dropped whole to undo."""

import subprocess
from collections.abc import Callable, Sequence

Runner = Callable[[Sequence[str], str | None], subprocess.CompletedProcess]


class NetlossError(RuntimeError):
    """nft refused or is missing; the message carries nft's own words."""


def run_nft(args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True, timeout=10, check=False)
    except FileNotFoundError as exc:
        raise NetlossError("nft is not installed (Debian package 'nftables')") from exc


def table_name(port: int) -> str:
    return f"workload_netloss_{port}"


def ruleset(port: int, percent: int) -> str:
    """Drops `percent`% of packets to and from `port`, both hooks, counted per rule."""
    if not 0 < percent < 100:
        raise ValueError(f"loss percent must be in 1..99, got {percent!r}")
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port!r}")
    rules = []
    for hook in ("input", "output"):
        rules.append(
            f"  chain {hook} {{\n"
            f"    type filter hook {hook} priority -150; policy accept;\n"
            f"    tcp dport {port} numgen random mod 100 < {percent} counter drop\n"
            f"    tcp sport {port} numgen random mod 100 < {percent} counter drop\n"
            f"  }}\n")
    return f"table inet {table_name(port)} {{\n{''.join(rules)}}}\n"


class Netloss:
    """Install or remove the loss table for one port."""

    def __init__(self, port: int, percent: int = 10, runner: Runner = run_nft) -> None:
        ruleset(port, percent)  # validates both now, not at the first switch-on
        self.port = port
        self.percent = percent
        self.runner = runner

    def on(self) -> None:
        self.off()
        result = self.runner(["-f", "-"], ruleset(self.port, self.percent))
        if result.returncode != 0:
            raise NetlossError(f"nft could not add table {table_name(self.port)!r}: {result.stderr.strip()}")

    def off(self) -> None:
        listed = self.runner(["list", "table", "inet", table_name(self.port)], None)
        if listed.returncode != 0:
            return  # no table: already off
        result = self.runner(["delete", "table", "inet", table_name(self.port)], None)
        if result.returncode != 0:
            raise NetlossError(f"nft could not delete table {table_name(self.port)!r}: {result.stderr.strip()}")

    def dropped_packets(self) -> int:
        """Sum of the drop counters; 0 when the table is absent."""
        listed = self.runner(["list", "table", "inet", table_name(self.port)], None)
        if listed.returncode != 0:
            return 0
        total = 0
        for line in listed.stdout.splitlines():
            words = line.split()
            if "packets" in words:
                total += int(words[words.index("packets") + 1])
        return total

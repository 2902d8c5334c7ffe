"""Two network namespaces joined by a veth pair, with nftables random loss, for tests that need real TCP."""

from __future__ import annotations

import os
import random
import secrets
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

Runner = Callable[..., subprocess.CompletedProcess]

LOSS_TABLE = "infersight_loss"


def _run(runner: Runner, argv: Sequence[str], stdin: str | None = None) -> str:
    proc = runner(list(argv), input=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)!r} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def parse_snmp(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/snmp as {"Tcp": {"RetransSegs": n, ...}, ...}: a header line, then a value line per protocol."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    table: dict[str, dict[str, int]] = {}
    for names, values in zip(lines[::2], lines[1::2]):
        if names[0] != values[0]:
            raise ValueError(f"/proc/net/snmp lines out of step: {names[0]!r} then {values[0]!r}")
        table[names[0].rstrip(":")] = {k: int(v) for k, v in zip(names[1:], values[1:])}
    return table


@dataclass
class NetnsPair:
    """Namespaces `a` and `b`; `addr_a` on `a`'s veth, `addr_b` on `b`'s, one /30 between them."""

    a: str
    b: str
    addr_a: str
    addr_b: str
    runner: Runner = field(default=subprocess.run, repr=False)

    def exec_argv(self, ns: str, argv: Sequence[str]) -> list[str]:
        """argv that runs `argv` inside namespace `ns` (ip netns exec execs it: same pid)."""
        return ["ip", "netns", "exec", ns, *argv]

    def snmp(self, ns: str) -> dict[str, dict[str, int]]:
        return parse_snmp(_run(self.runner, self.exec_argv(ns, ["cat", "/proc/net/snmp"])))

    def netstat(self, ns: str) -> dict[str, dict[str, int]]:
        """/proc/net/netstat of `ns` (TcpExt: TCPRetransFail, TCPSynRetrans, ...), same layout as snmp."""
        return parse_snmp(_run(self.runner, self.exec_argv(ns, ["cat", "/proc/net/netstat"])))

    def retrans_segs(self, ns: str) -> int:
        return self.snmp(ns)["Tcp"]["RetransSegs"]

    def add_random_drop(self, ns: str, port: int, numerator: int = 2, denominator: int = 10) -> None:
        """Drop numerator/denominator of the TCP packets to or from `port` that arrive in `ns`."""
        if not 0 < numerator < denominator:
            raise ValueError(f"drop ratio must be within (0, 1), got {numerator!r}/{denominator!r}")
        rule = f"numgen random mod {denominator} < {numerator} drop"
        self.add_input_rules(ns, [f"tcp dport {port} {rule}", f"tcp sport {port} {rule}"])

    def add_input_rules(self, ns: str, rules: Sequence[str]) -> None:
        """Append nftables rules to an input-hook chain of `ns` (created on first use)."""
        script = [f"table inet {LOSS_TABLE} {{",
                  "  chain input { type filter hook input priority 0; policy accept; }", "}"]
        script += [f"add rule inet {LOSS_TABLE} input {rule}" for rule in rules]
        _run(self.runner, self.exec_argv(ns, ["nft", "-f", "-"]), stdin="\n".join(script) + "\n")

    def destroy(self) -> None:
        """Delete both namespaces (the veth pair goes with them); absent ones are fine."""
        errors = []
        for ns in (self.a, self.b):
            proc = self.runner(["ip", "netns", "del", ns], capture_output=True, text=True)
            if proc.returncode != 0 and "No such file" not in proc.stderr:
                errors.append(f"{ns}: {proc.stderr.strip()}")
        if errors:
            raise RuntimeError(f"could not delete network namespaces: {'; '.join(errors)}")


def create_pair(tag: str = "isnet", gso_max_segs: int | None = 1, rto_min_ms: int | None = None,
                rto_max_ms: int | None = None, sysctls: dict[str, str] | None = None,
                runner: Runner = subprocess.run) -> NetnsPair:
    """Build two namespaces with a veth between them; names and a 10.x.y.z/30 chosen to not collide.

    `gso_max_segs=1` keeps every TCP packet at one MSS: RetransSegs counts segments, while the
    retransmit tracepoint fires once per packet, so the two agree only without GSO/TSO batching.
    `rto_min_ms` lowers TCP's minimum retransmit timeout on the link's route (default 200 ms):
    under heavy loss, backed-off timeouts otherwise stall a transfer for tens of seconds.
    `rto_max_ms` caps the backed-off timeout (sysctl net.ipv4.tcp_rto_max_ms, Linux 6.15+) for
    the same reason: RTT samples inflated by a busy host push the timeout to tens of seconds.
    """
    suffix = f"{os.getpid()}-{secrets.token_hex(3)}"
    base = random.Random(secrets.randbits(64))
    net = f"10.{base.randrange(64, 250)}.{base.randrange(0, 256)}.{base.randrange(0, 64) * 4}"
    prefix = net.rsplit(".", 1)[0]
    last = int(net.rsplit(".", 1)[1])
    pair = NetnsPair(a=f"{tag}-a-{suffix}", b=f"{tag}-b-{suffix}", addr_a=f"{prefix}.{last + 1}",
                     addr_b=f"{prefix}.{last + 2}", runner=runner)
    try:
        _run(runner, ["ip", "netns", "add", pair.a])
        _run(runner, ["ip", "netns", "add", pair.b])
        _run(runner, ["ip", "link", "add", "veth0", "netns", pair.a, "type", "veth", "peer", "name", "veth0",
                      "netns", pair.b])
        for ns, addr in ((pair.a, pair.addr_a), (pair.b, pair.addr_b)):
            _run(runner, ["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(runner, ["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", "veth0"])
            if gso_max_segs is not None:
                _run(runner, ["ip", "-n", ns, "link", "set", "veth0", "gso_max_segs", str(gso_max_segs)])
            _run(runner, ["ip", "-n", ns, "link", "set", "veth0", "up"])
            settings = dict(sysctls or {})
            if rto_max_ms is not None:
                settings["net.ipv4.tcp_rto_max_ms"] = str(rto_max_ms)
            for key, value in settings.items():
                _run(runner, pair.exec_argv(ns, ["sysctl", "-qw", f"{key}={value}"]))
            if rto_min_ms is not None:
                _run(runner, ["ip", "-n", ns, "route", "replace", f"{prefix}.{last}/30", "dev", "veth0",
                              "proto", "kernel", "scope", "link", "src", addr, "rto_min", f"{rto_min_ms}ms"])
    except BaseException:
        pair.destroy()
        raise
    return pair


@contextmanager
def netns_pair_context(tag: str = "isnet", gso_max_segs: int | None = 1, rto_min_ms: int | None = None,
                       rto_max_ms: int | None = None, sysctls: dict[str, str] | None = None) -> Iterator[NetnsPair]:
    """A fresh namespace pair, deleted on leaving whatever happened inside."""
    pair = create_pair(tag, gso_max_segs, rto_min_ms, rto_max_ms, sysctls)
    try:
        yield pair
    finally:
        pair.destroy()


@pytest.fixture
def netns_pair(require_root) -> Iterator[NetnsPair]:
    """For test modules that import it: a fresh namespace pair, deleted after the test."""
    with netns_pair_context() as pair:
        yield pair

"""TCP retransmits per window, by flow (addresses, ports, TCP state), host-wide and per target.

Traces: tracepoints ``tcp:tcp_retransmit_skb`` (data, SYN and FIN retransmits, tail-loss
probes) and ``tcp:tcp_retransmit_synack`` (a listener's SYN-ACK retransmits). The tracepoints'
own fields are read, plus one fact no tracepoint carries: the socket's network namespace
(``skaddr->__sk_common.skc_net.net->ns.inum``, two ``bpf_probe_read_kernel`` at the running
kernel's offsets from its BTF, probes/btf.py; the exception docs/kernel.md states, shared with
probes/delivery.py). Without BTF the namespace is not read (0), and health says so.

How: each event increments ``flows[(parity, netns, family, saddr, daddr, sport, dport, state)]`` and a
per-CPU ``totals`` counter. ``parity`` is the window's, flipped by ``read()``. A read (1) takes
the parity that closed at the previous read, which no program has written for a whole
interval, credits what arrived there after that read (a program that loaded the old parity
just before the flip), and deletes its entries; (2) flips to that now empty parity; (3) reads
the closing parity's entries without deleting them. Nothing is deleted while a program may
still hold a pointer to it: a read-and-delete of a live entry loses, silently, the
increments that land between the copy and the delete. ``totals`` is never zeroed; reads take
its difference.

Attribution happens in user space at read time: a flow
belongs to a target when it happened in the target's network namespace (its /proc/PID/ns/net
inode) and its local address and port are those of one of the target's TCP
sockets (``/proc/PID/fd`` socket inodes matched in ``/proc/PID/net/tcp{,6}``, which is the
target's own network namespace view), or of a socket seen there at the previous read, so a
connection closed within a window still counts for its owner.

Why the namespace is read in BPF, not matched in user space: a flow key without it cannot be
told apart afterwards. Two namespaces' servers on 0.0.0.0:8000 with clients on the same
addresses (each namespace's own 10.0.0.2, or loopback) give the same 4-tuples; a table lookup
per namespace at read time could only ask "does this 4-tuple exist here now", which fails for a
connection closed within the window and is ambiguous for a 4-tuple that exists in both. The
read costs two ``bpf_probe_read_kernel`` per retransmit, only on retransmits (docs/BENCHMARKS.md
"tcpretrans keyed by network namespace").

Why no in-kernel tgid filter: retransmits run in softirq and timer context, where the
current task is whoever was interrupted; the tgid there says nothing about the socket's
owner. ``set_targets()`` therefore changes only user-space state and never reloads.

What a count means: one per retransmitted packet, which is what ``/proc/net/snmp``
``Tcp: RetransSegs`` counts as long as the packet is one MSS-sized segment. With TSO/GSO a
retransmitted packet can carry several segments that RetransSegs counts one by one; the
tracepoint carries no length, so on such devices this count is a lower bound (the tests
cap ``gso_max_segs`` to 1 and then match RetransSegs exactly). Since Linux 6.13 the
tracepoint also fires for attempts that were given up before transmitting (``err``
-EBUSY: the original still in a host queue; -ENOMEM, -EAGAIN, -EHOSTUNREACH, -EINVAL),
which RetransSegs does not count: those go to ``not_sent`` instead. An attempt that
reached the IP layer but failed there (e.g. -EPERM from a netfilter drop on output) is a
retransmit for RetransSegs and here, and is also counted in ``send_failed``.

Overhead: nothing on the fast path; per retransmit sent, two `bpf_probe_read_kernel` (its namespace) and one hash
update (docs/BENCHMARKS.md "tcpretrans keyed by network namespace").

Caveats: on 6.18 under CPU contention a few retransmits in ten thousand are counted by the
kernel without the tracepoint firing (no program runs for them; docs/tcpretrans.md,
tests/probes/tcpretrans_gaps.py). -EHOSTUNREACH is taken as "not sent", which is wrong when
the route vanished between the route check and the IP layer (seen at namespace teardown).
Flows are host-wide, across network namespaces (``last_host`` sums a flow's counts over
namespaces). Where the namespace is not read (no BTF, ``TcpRetransConfig.netns`` off, or a read
that failed: ``netns_unread`` in health's detail) a flow is matched on local address and port
alone, so a flow in another namespace with the same local address and port as a target's socket
is attributed to the target, as before the namespace was keyed.
When ``flows`` is full, new flows are counted in the totals and in ``lost`` (health's
``lost_events``) but not listed.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.errors import AccessDenied, ProbeUnavailable, TargetGone, TracepointMissing
from analysis.health import Health
from analysis.window import TcpFlow, TcpReading
from probes.base import load_bpf, recursion_misses, require_tracepoints, tracefs_root
from probes.btf import BtfError, NetnsOffsets, netns_offsets
from probes.sockets import Endpoint, ProcSockets, normalize_ip, owns, shared

TRACEPOINT_SKB = "tcp:tcp_retransmit_skb"
TRACEPOINT_SYNACK = "tcp:tcp_retransmit_synack"
# Every hook it may use (synack only with TcpRetransConfig.count_synack, on by default).
TRACEPOINTS = (TRACEPOINT_SKB, TRACEPOINT_SYNACK)
AF_INET = 2
AF_INET6 = 10

# Index of each counter in the per-CPU `totals` array (the C text uses the same numbers).
TOTAL_RETRANSMITS, TOTAL_NOT_SENT, TOTAL_SEND_FAILED, TOTAL_LOST = range(4)

TCP_STATES = {
    1: "TCP_ESTABLISHED", 2: "TCP_SYN_SENT", 3: "TCP_SYN_RECV", 4: "TCP_FIN_WAIT1",
    5: "TCP_FIN_WAIT2", 6: "TCP_TIME_WAIT", 7: "TCP_CLOSE", 8: "TCP_CLOSE_WAIT",
    9: "TCP_LAST_ACK", 10: "TCP_LISTEN", 11: "TCP_CLOSING", 12: "TCP_NEW_SYN_RECV",
}

BPF_TEXT = r"""
#define AF_INET_ 2
#define TCP_SYN_RECV_ 3
#define TOTAL_RETRANSMITS 0
#define TOTAL_NOT_SENT 1
#define TOTAL_SEND_FAILED 2
#define TOTAL_LOST 3
#define N_TOTALS 4
#define EAGAIN_ 11
#define ENOMEM_ 12
#define EBUSY_ 16
#define EINVAL_ 22
#define EHOSTUNREACH_ 113

struct flow_t {
    u32 parity;
    u32 netns;     /* the socket's network namespace inode; 0: not read (no offsets, or the read failed) */
    u8 saddr[16];
    u8 daddr[16];
    u16 sport;
    u16 dport;
    u16 family;
    u16 state;
};

BPF_HASH(flows, struct flow_t, u64, MAX_FLOWS);
BPF_PERCPU_ARRAY(totals, u64, N_TOTALS);
BPF_HASH(errors, int, u64, 64);
BPF_ARRAY(window, u32, 1);

static inline u32 window_parity(void)
{
    int zero = 0;
    u32 *parity = window.lookup(&zero);
    return parity ? (*parity & 1) : 0;
}

static inline void count_total(u32 idx)
{
    u64 *n = totals.lookup(&idx);
    if (n)
        (*n)++;
}

/* The inode of socket `sk`'s network namespace, sk->__sk_common.skc_net.net->ns.inum, at the running kernel's
   offsets (its BTF, probes/btf.py; the same read as probes/delivery.py). 0 where it cannot be read, or where the
   offsets are unknown (then every flow is matched on address and port alone). */
static inline u32 netns_of(const void *sk)
{
#ifdef NETNS_SK_NET
    u64 net = 0;
    u32 inum = 0;
    if (bpf_probe_read_kernel(&net, sizeof(net), (void *)((u64)sk + NETNS_SK_NET)) || !net)
        return 0;
    if (bpf_probe_read_kernel(&inum, sizeof(inum), (void *)(net + NETNS_NET_INUM)))
        return 0;
    return inum;
#else
    return 0;
#endif
}

static inline void count_flow(struct flow_t *key)
{
    u64 zero = 0;
    u64 *n = flows.lookup_or_try_init(key, &zero);
    if (!n) {
        count_total(TOTAL_LOST);
        return;
    }
    __sync_fetch_and_add(n, 1);
}

// The address arrays are copied whole: the tracepoint fills both the v4 and v6 fields.
#define FILL_ADDRS(key, args)                                                   \
    do {                                                                        \
        if ((key).family == AF_INET_) {                                         \
            __builtin_memcpy((key).saddr, (args)->saddr, 4);                    \
            __builtin_memcpy((key).daddr, (args)->daddr, 4);                    \
        } else {                                                                \
            __builtin_memcpy((key).saddr, (args)->saddr_v6, 16);                \
            __builtin_memcpy((key).daddr, (args)->daddr_v6, 16);                \
        }                                                                       \
    } while (0)

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
#ifdef HAVE_ERR_FIELD
    int err = args->err;
    if (err)
        errors.increment(err);
    // Given up before the packet was built (RetransSegs is not incremented for these).
    if (err == -EBUSY_ || err == -ENOMEM_ || err == -EAGAIN_ || err == -EHOSTUNREACH_ || err == -EINVAL_) {
        count_total(TOTAL_NOT_SENT);
        return 0;
    }
    if (err)
        count_total(TOTAL_SEND_FAILED);
#endif
    struct flow_t key = {};
    key.parity = window_parity();
    key.family = args->family;
    key.sport = args->sport;
    key.dport = args->dport;
    key.state = args->state;
    key.netns = netns_of(args->skaddr);
    FILL_ADDRS(key, args);
    count_total(TOTAL_RETRANSMITS);
    count_flow(&key);
    return 0;
}

#ifdef COUNT_SYNACK
TRACEPOINT_PROBE(tcp, tcp_retransmit_synack)
{
    struct flow_t key = {};
    key.parity = window_parity();
    key.family = args->family;
    key.sport = args->sport;
    key.dport = args->dport;
    key.state = TCP_SYN_RECV_;
    key.netns = netns_of(args->skaddr);  /* the listener's: its requests live in its namespace */
    FILL_ADDRS(key, args);
    count_total(TOTAL_RETRANSMITS);
    count_flow(&key);
    return 0;
}
#endif
"""


@dataclass(frozen=True)
class TcpRetransConfig:
    max_flows: int = 4096
    count_synack: bool = True
    # None: look at the tracepoint's format in tracefs at start().
    err_field: bool | None = None
    tracefs: Path | None = None
    # Read each retransmit's network namespace (BTF offsets): a flow is a target's only in its namespace.
    netns: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.max_flows <= 1 << 20:
            raise ValueError(f"max_flows must be within [1, 1048576], got {self.max_flows!r}")


def render(config: TcpRetransConfig, netns: NetnsOffsets | None = None) -> str:
    """The C text for `config`: #defines first, then the program. `err_field` None renders as absent; `netns` None
    renders no namespace read (every flow's netns 0)."""
    defines = [f"#define MAX_FLOWS {config.max_flows}"]
    if netns is not None:
        defines += [f"#define NETNS_SK_NET {netns.sk_net}", f"#define NETNS_NET_INUM {netns.net_inum}"]
    if config.err_field:
        defines.append("#define HAVE_ERR_FIELD 1")
    if config.count_synack:
        defines.append("#define COUNT_SYNACK 1")
    return "\n".join(defines) + "\n" + BPF_TEXT


def tracepoint_has_field(name: str, field_name: str, root: Path | None = None) -> bool:
    """Whether tracefs' format of `category:event` declares `field_name` (e.g. tcp_retransmit_skb's `err`, 6.13+)."""
    root = root or tracefs_root()
    if root is None:
        raise TracepointMissing("tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)")
    category, event = name.split(":", 1)
    path = root / "events" / category / event / "format"
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise TracepointMissing(f"tracepoint {name} has no format file at {path}") from exc
    for line in text.splitlines():
        decl = line.strip().partition(";")[0]
        if decl.startswith("field:") and decl.split()[-1].split("[")[0] == field_name:
            return True
    return False


def state_name(state: int) -> str:
    return TCP_STATES.get(state, f"TCP_STATE_{state}")


def flow_from_key(family: int, saddr: bytes, daddr: bytes, sport: int, dport: int, state: int,
                  count: int) -> TcpFlow:
    """A TcpFlow from the kernel key's fields (addresses as the 16-byte arrays of `struct flow_t`)."""
    if family == AF_INET:
        saddr, daddr = saddr[:4], daddr[:4]
    elif family == AF_INET6:
        saddr, daddr = saddr[:16], daddr[:16]
    else:
        raise ValueError(f"address family must be AF_INET (2) or AF_INET6 (10), got {family!r}")
    return TcpFlow(saddr=normalize_ip(saddr), sport=sport, daddr=normalize_ip(daddr), dport=dport,
                   state=state_name(state), retransmits=count)


def _flow_ident(key: Any) -> tuple:
    """The fields of a kernel `struct flow_t` key without its parity: its netns, then flow_from_key's order."""
    return (int(key.netns), int(key.family), bytes(key.saddr), bytes(key.daddr), int(key.sport), int(key.dport),
            int(key.state))


@dataclass
class _Counters:
    retransmits: int = 0
    not_sent: int = 0
    send_failed: int = 0
    lost: int = 0


class TcpRetransProbe:
    """TCP retransmits by flow, host-wide, attributed to targets by their sockets' local endpoints."""

    name = "tcp"

    def __init__(self, config: TcpRetransConfig | None = None, sockets: ProcSockets | None = None) -> None:
        self.config = config or TcpRetransConfig()
        self.sockets = sockets or shared()
        # Host-wide total and every flow of the last window; None before the first read.
        self.last_host: TcpReading | None = None
        # Attempts of the last window given up before sending / failed in the IP layer (see the docstring).
        self.last_not_sent = 0
        self.last_send_failed = 0
        # errno name (e.g. "EBUSY") -> retransmit attempts of the last window that ended with it.
        self.last_errors: dict[str, int] = {}
        self._bpf: Any = None
        # The parity programs write now, and what read() reported of each flow of the other one.
        self._parity = 0
        self._reported: dict[tuple, int] = {}
        self._errors_seen: dict[int, int] = {}
        self._targets: set[int] = set()
        self._seen: dict[int, set[Endpoint]] = {}
        self._previous = _Counters()
        self._netns: NetnsOffsets | None = None  # offsets a socket's namespace is read at; None: not read
        self._netns_unread = 0  # flows whose namespace read failed though keyed, since start
        self._health = Health(name=self.name)

    def start(self, targets: Iterable[int]) -> None:
        if self._bpf is not None:
            raise ProbeUnavailable("tcpretrans probe is already started; use set_targets() to change targets")
        try:
            config = self._resolved_config()
            self._bpf = load_bpf(render(config, self._resolve_netns(config)))
        except ProbeUnavailable as exc:
            self._health.state, self._health.reason = "failed", str(exc)
            raise
        self.config = config
        self._parity, self._reported, self._errors_seen, self._netns_unread = 0, {}, {}, 0
        self._previous = self._read_totals()
        self._health.state, self._health.reason = "running", None
        self.set_targets(targets)

    def set_targets(self, targets: Iterable[int]) -> None:
        if self._bpf is None:
            raise ProbeUnavailable("tcpretrans probe is not started")
        wanted = set(targets)
        for tgid in self._targets - wanted:
            self._seen.pop(tgid, None)
            self._health.unsupported.pop(tgid, None)
        for tgid in wanted - self._targets:
            # Seed the endpoints now, so that a connection closed before the first read is still attributed.
            try:
                self._seen[tgid] = self.sockets.endpoints(tgid)
            except (TargetGone, AccessDenied):
                self._seen[tgid] = set()  # read() decides: a gone target is dropped there
        self._targets = wanted
        self._health.targets = len(self._targets)

    def read(self) -> dict[int, TcpReading]:
        if self._bpf is None:
            raise ProbeUnavailable("tcpretrans probe is not started")
        by_netns = self._drain_flows()
        totals = self._read_totals()
        previous, self._previous = self._previous, totals
        self.last_host = TcpReading(retransmits=totals.retransmits - previous.retransmits, flows=_merged(by_netns))
        self.last_not_sent = totals.not_sent - previous.not_sent
        self.last_send_failed = totals.send_failed - previous.send_failed
        self.last_errors = self._read_errors()
        self._health.lost_events = totals.lost + self.missed_runs()
        return self._attribute(by_netns)

    def host(self) -> TcpReading | None:
        return self.last_host

    def stop(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
        self._targets, self._seen = set(), {}
        self._health.state, self._health.targets = "stopped", 0

    def health(self) -> Health:
        return self._health.copy()

    def missed_runs(self) -> int:
        """Retransmits the kernel did not run our programs for (probes.base.prog_recursion_misses), since start."""
        if self._bpf is None:
            return 0
        return recursion_misses(self._bpf)

    def _resolved_config(self) -> TcpRetransConfig:
        root = self.config.tracefs or tracefs_root()
        if root is None:
            raise TracepointMissing("tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)")
        require_tracepoints([TRACEPOINT_SKB], root)
        count_synack = self.config.count_synack
        if count_synack:
            require_tracepoints([TRACEPOINT_SYNACK], root)
        err_field = self.config.err_field
        if err_field is None:
            err_field = tracepoint_has_field(TRACEPOINT_SKB, "err", root)
        return TcpRetransConfig(max_flows=self.config.max_flows, count_synack=count_synack,
                                err_field=err_field, tracefs=root, netns=self.config.netns)

    def _resolve_netns(self, config: TcpRetransConfig) -> NetnsOffsets | None:
        """The offsets the namespace is read at, and health's word on it; None: flows matched on address and port
        alone (the behaviour before the namespace was keyed)."""
        self._netns = None
        detail = "off (config): flows matched on local address and port alone, across namespaces"
        if config.netns:
            try:
                self._netns = netns_offsets()
                detail = "keyed"
            except BtfError as exc:
                detail = f"not read ({exc}): flows matched on local address and port alone, across namespaces"
        self._health.detail["netns"] = detail
        return self._netns

    def _attribute(self, flows: list[tuple[int, TcpFlow]]) -> dict[int, TcpReading]:
        """Each target's flows: in its namespace (where read; see the module docstring), from its endpoints."""
        readings: dict[int, TcpReading] = {}
        if self._netns is not None:
            self._netns_unread += sum(1 for ns, _ in flows if ns == 0)
            if self._netns_unread:
                self._health.detail["netns_unread"] = self._netns_unread
        for tgid in sorted(self._targets):
            try:
                current = self.sockets.endpoints(tgid)
            except TargetGone:
                self._targets.discard(tgid)
                self._seen.pop(tgid, None)
                continue
            except AccessDenied as exc:
                # Its sockets cannot be read, so its flows cannot be told apart: no reading, with the reason.
                self._health.unsupported[tgid] = str(exc)
                continue
            self._health.unsupported.pop(tgid, None)
            known = current | self._seen.get(tgid, set())
            self._seen[tgid] = current
            # Its namespace; None (not keyed, or /proc does not show it): any namespace, as an unread flow's 0 is.
            own_ns = self.sockets.netns(tgid) if self._netns is not None else None
            mine = [f for ns, f in flows if (own_ns is None or ns in (0, own_ns)) and owns(known, f)]
            readings[tgid] = TcpReading(retransmits=sum(f.retransmits for f in mine), flows=mine)
        self._health.targets = len(self._targets)
        if self.sockets.sock_diag_off is not None:  # /proc's tables instead: correct, ~5 ms a read dearer
            self._health.detail["tcp_tables"] = self.sockets.sock_diag_off
        return readings

    def _drain_flows(self) -> list[tuple[int, TcpFlow]]:
        """The window's flows, each with its namespace's inode (0: not read): the parity closing now, plus late
        arrivals in the one closed before."""
        table = self._bpf[b"flows"]
        counts: dict[tuple, int] = {}
        # (1) Quiet for a whole interval: nothing writes it any more, so its entries can go.
        quiet = self._parity ^ 1
        for key, value in table.items_lookup_batch():
            if key.parity != quiet:
                continue
            ident = _flow_ident(key)
            late = int(value) - self._reported.pop(ident, 0)
            if late:
                counts[ident] = counts.get(ident, 0) + late
            del table[key]
        self._reported = {}
        # (2) Programs move to the emptied parity; (3) the closing one is read, not cleared.
        closing, self._parity = self._parity, quiet
        window = self._bpf[b"window"]
        window[window.Key(0)] = window.Leaf(self._parity)
        for key, value in table.items_lookup_batch():
            if key.parity != closing:
                continue
            ident = _flow_ident(key)
            self._reported[ident] = int(value)
            counts[ident] = counts.get(ident, 0) + int(value)
        flows = [(ident[0], flow_from_key(*ident[1:], count)) for ident, count in counts.items()]
        flows.sort(key=lambda nf: (-nf[1].retransmits, nf[1].saddr, nf[1].sport, nf[1].daddr, nf[1].dport,
                                   nf[1].state, nf[0]))
        return flows

    def _read_errors(self) -> dict[str, int]:
        """errno name -> attempts of this window that ended with it (a cumulative map, diffed)."""
        errors = {}
        for key, value in self._bpf[b"errors"].items_lookup_batch():
            err, total = int(key), int(value)
            delta = total - self._errors_seen.get(err, 0)
            self._errors_seen[err] = total
            if delta:
                errors[errno.errorcode.get(-err, str(err))] = delta
        return errors

    def _read_totals(self) -> _Counters:
        values = [0] * 4
        for key, per_cpu in self._bpf[b"totals"].items_lookup_batch():
            values[int(key)] = int(sum(per_cpu))
        return _Counters(retransmits=values[TOTAL_RETRANSMITS], not_sent=values[TOTAL_NOT_SENT],
                         send_failed=values[TOTAL_SEND_FAILED], lost=values[TOTAL_LOST])


def _merged(flows: list[tuple[int, TcpFlow]]) -> list[TcpFlow]:
    """The host-wide flows: one per (addresses, ports, state), its counts summed over namespaces, most first."""
    merged: dict[tuple, TcpFlow] = {}
    for _, f in flows:
        key = (f.saddr, f.sport, f.daddr, f.dport, f.state)
        kept = merged.get(key)
        merged[key] = f if kept is None else TcpFlow(saddr=f.saddr, sport=f.sport, daddr=f.daddr, dport=f.dport,
                                                     state=f.state, retransmits=kept.retransmits + f.retransmits)
    return sorted(merged.values(), key=lambda f: (-f.retransmits, f.saddr, f.sport, f.daddr, f.dport, f.state))

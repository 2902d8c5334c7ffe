"""Reply delivery time per target: from the server writing a reply until the client has acknowledged all of it.

Traces: tracepoints ``sock:sock_send_length`` (the target writes), ``sock:sock_recv_length`` (it reads: the
flow becomes known), ``tcp:tcp_probe`` (every segment an
established socket receives, with ``snd_una``/``snd_nxt``/``snd_wnd``/``srtt`` as fields),
``inet_sock_set_state`` (our FIN acknowledged), ``tcp:tcp_retransmit_skb``, ``tcp:tcp_cong_state_set``
(an RTO puts the flow in ``TCP_CA_Loss``), ``tcp:tcp_destroy_sock`` and ``task:task_newtask`` (families).
Tracepoint fields are read, and one thing more: a socket's network namespace inode, only for events on a port a
target listens on, with ``bpf_probe_read_kernel`` at the running kernel's own offsets (its BTF, probes/btf.py; no
BTF: ports keyed alone, host-wide). The socket's address is otherwise an opaque key.

How: a write of a target on a TCP socket (``sock_send_length``, process context, filtered by the target
table first) opens or extends the flow's *pending reply*: ``flows[sk]`` records the time of the last write.
``tcp_probe`` runs at the top of ``tcp_rcv_established``, before the segment is processed, so the
``snd_una`` it shows is what the *previous* inbound segment acknowledged. When it shows everything sent
acknowledged (``snd_una == snd_nxt``, peer window open) and that previous segment came after the last
write, that segment was the ACK that completed the reply: delivery = its time - the last write. The
figure is therefore exact to the ACK's arrival, but recorded at the flow's next inbound segment (or when
our FIN is acknowledged, ``FIN_WAIT1 -> FIN_WAIT2/TIME_WAIT``, which covers every byte before it). An idle
keep-alive flow only delays the recording, never lengthens the figure.

Per window and target (the slot of the process that wrote), cumulative per-CPU counters diffed at read:
a histogram of delivery time on the latency source's bucket bounds, replies, replies with a retransmit or
an RTO while pending, the sum of delivery times and of the flow's smoothed RTT at completion, retransmits,
and RTO stall time (at each RTO: time since the flow last progressed). Only flows whose local port is a
listening port of a target in the target's network namespace (user space writes (namespace inode, port) into
``server_ports`` at each read) count: its server sockets; a server on the same port in another namespace is not.

The first request's wait (``first_request``, on by default; docs/delivery.md "The first request"): a handshake
completing on a target's listening port makes the new socket's flow entry, stamped; its first inbound segment
after that (``tcp_probe``), if it carries data, is the request: counted, and its wait summed when it arrived
0.2-3.5 s after the handshake (a request lost and resent after the client's RTO), or counted as opened ahead of
use when later. The target writing first (a server that speaks first) ends the wait uncounted.

Overhead: every inbound segment on the host's established sockets pays one hash lookup (``flows``);
a target's writes pay the target filter and a hash update; each completed reply ~12 per-CPU increments.

Caveats: a "reply" is the data written since the flow was last fully acknowledged (two writes before the
client's ACK are one reply; each acknowledged chunk of a stream is one). A client's delayed ACK adds up
to its delayed-ACK timer (Linux: 40 ms minimum) to the figure. Data held by ``TCP_CORK`` would close a
reply early. Replies of connections the target wrote before the probe started count from their next write.
A client that never acknowledges (zero window, gone) produces no figure; its entry stays until the socket
is destroyed or evicted (``flows`` is an LRU hash of ``max_flows`` entries).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from analysis.errors import AccessDenied, TargetGone
from analysis.window import DeliveryReading
from probes import c_helpers, target_filter
from probes.btf import BtfError, NetnsOffsets, netns_offsets
from probes.map_read import percpu_array_sums
from probes.slotted import SlottedProbe
from probes.sockets import ProcSockets, shared

TRACEPOINTS = ("sock:sock_send_length", "sock:sock_recv_length", "tcp:tcp_probe", "sock:inet_sock_set_state", "tcp:tcp_retransmit_skb",
               "tcp:tcp_cong_state_set", "tcp:tcp_destroy_sock", "task:task_newtask", "tcp:tcp_retransmit_synack")

# The SYN-ACK's first retransmission timeout (Linux TCP_TIMEOUT_INIT): a connection whose SYN-ACK was retransmitted
# is taken to have waited this long before the first retransmit (docs/delivery.md "Connection setup").
SYNACK_RTO_INIT_S = 1.0
# Longer than a handshake can last (Linux's default 5 SYN-ACK retries back off to 63 s): an entry this old is of a
# handshake the client abandoned, not the one completing on the same addresses and ports now.
HANDSHAKE_MAX_S = 120.0

# The bundled workload's end-to-end latency buckets (workload/metrics.py E2E_BUCKETS): the agent passes the
# latency source's own bounds when it has them.
DEFAULT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
                  15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
MAX_BOUNDS = 40

# Counters after the histogram's len(bounds) + 1 buckets, per target slot; the C text uses the same order.
COUNTERS = ("replies", "retransmitted", "rto", "delivery_ns", "srtt_us", "retransmits", "stall_ns",
            "unserved", "synack_retransmits", "connects", "slow_connects", "connect_wait_ns",
            "first_requests", "late_requests", "request_wait_ns", "idle_connects")

# A fresh connection's first request is *late* when it arrives this long after the handshake completed: the client
# sent it with (or just after) its handshake ACK, and a lost request is the client's to resend after its RTO
# (Linux: 200 ms at least, then doubling: 0.2, 0.6, 1.4, 3.0 s; 1 s, 3 s after a handshake that needed a
# retransmit). Earlier is a prompt request; later, a connection opened ahead of use (a pool, a preconnect) and not
# counted as a wait (docs/delivery.md "The first request").
REQUEST_LATE_MIN_S = 0.2
REQUEST_LATE_MAX_S = 3.5

BPF_TEXT = r"""
#define IPPROTO_TCP_ 6
#define TCP_CA_LOSS_ 4
#define TCP_ESTABLISHED_ 1
#define TCP_SYN_RECV_ 3
#define TCP_FIN_WAIT1_ 4
#define TCP_FIN_WAIT2_ 5
#define TCP_TIME_WAIT_ 6
#define TCP_CLOSE_WAIT_ 8
#define TCP_CLOSING_ 11

struct flow_t {
    u64 t_write;   /* last write of the pending reply, ns; 0: nothing pending */
    u64 t_in;      /* the flow's last inbound segment */
    u64 t_mark;    /* last progress (a write opening a reply, an ACK moving snd_una, an RTO) */
    u64 t_est;     /* the handshake completed, nothing received or written since; 0 otherwise */
    u32 slot;
    u32 una;       /* snd_una at the last inbound segment */
    u32 netns;     /* the socket's network namespace inode, once read; 0: not yet */
    u16 lport;
    u8 retrans;    /* the pending reply was retransmitted */
    u8 rto;        /* an RTO fired while it was pending */
};

/* A handshake whose SYN-ACK was retransmitted, by the client's address and port and our port (the request
   socket is not the child socket the handshake ends in, so the 4-tuple joins them). */
struct hs_key_t {
    u8 daddr[16];
    u32 netns;
    u16 sport;
    u16 dport;
};
/* A listening port of a target, in the target's network namespace: another namespace's server on the same port is
   not the target's. */
struct port_key_t {
    u32 netns;
    u16 port;
    u16 pad;
};
struct hs_t {
    u64 t_first;   /* the first SYN-ACK retransmit */
};

BPF_TABLE("lru_hash", u64, struct flow_t, flows, MAX_FLOWS);
BPF_TABLE("lru_hash", struct hs_key_t, struct hs_t, handshakes, MAX_HANDSHAKES);
BPF_HASH(server_ports, struct port_key_t, u32, 1024);  /* a target's (netns, listening port) -> its slot */
BPF_ARRAY(listen_ports, u8, 65536);  /* port -> a target listens on it in some namespace: the cheap test first */
BPF_PERCPU_ARRAY(counts, u64, MAX_TARGETS * N_FIELDS);

static inline void add(u32 slot, u32 field, u64 n)
{
    u32 idx = slot * N_FIELDS + field;
    u64 *c = counts.lookup(&idx);
    if (c)
        *c += n;
}

/* The inode of socket `sk`'s network namespace, read at the running kernel's offsets (from its BTF, probes/btf.py):
   sk->__sk_common.skc_net.net->ns.inum. 0 where it cannot be read, or where the offsets are unknown (then user
   space keys every port with namespace 0 too: port alone, host-wide). */
static inline u32 netns_of(u64 sk)
{
#ifdef NETNS_SK_NET
    u64 net = 0;
    u32 inum = 0;
    if (bpf_probe_read_kernel(&net, sizeof(net), (void *)(sk + NETNS_SK_NET)) || !net)
        return 0;
    if (bpf_probe_read_kernel(&inum, sizeof(inum), (void *)(net + NETNS_NET_INUM)))
        return 0;
    return inum;
#else
    return 0;
#endif
}

/* The slot of the target listening on `port` in the namespace `*netns` (read from `sk` when 0 and cached there),
   NULL when none: the port test costs an array load, the namespace's read only ports a target listens on. */
static inline u32 *server_slot(u64 sk, u16 port, u32 *netns)
{
    u32 idx = port;
    u8 *any = listen_ports.lookup(&idx);
    if (!any || !*any)
        return 0;
    if (!*netns)
        *netns = netns_of(sk);
    struct port_key_t key = {};
    key.netns = *netns;
    key.port = port;
    return server_ports.lookup(&key);
}

static inline void deliver(struct flow_t *f, u64 sk, u64 when, u32 srtt_us)
{
    if (!server_slot(sk, f->lport, &f->netns)) {
        add(f->slot, F_UNSERVED, 1);  /* a client socket of the target, or a port not listening */
    } else {
        u64 d = when - f->t_write;
        add(f->slot, bucket_of(d), 1);
        add(f->slot, F_REPLIES, 1);
        add(f->slot, F_DELIVERY_NS, d);
        add(f->slot, F_SRTT_US, srtt_us);
        if (f->retrans)
            add(f->slot, F_RETRANSMITTED, 1);
        if (f->rto)
            add(f->slot, F_RTO, 1);
    }
    f->t_write = 0;
    f->retrans = 0;
    f->rto = 0;
}

TRACEPOINT_PROBE(sock, sock_send_length)
{
    if (args->protocol != IPPROTO_TCP_ || args->ret <= 0)
        return 0;
    u32 *slot = target_slot(bpf_get_current_pid_tgid() >> 32);
    if (!slot)
        return 0;
    u64 sk = (u64)args->sk;
    u64 now = bpf_ktime_get_ns();
    struct flow_t *f = flows.lookup(&sk);
    if (!f) {
        struct flow_t fresh = {};
        fresh.slot = *slot;
        fresh.t_write = now;
        fresh.t_mark = now;
        if (flows.update(&sk, &fresh))
            count_lost();
        return 0;
    }
    if (!f->t_write)
        f->t_mark = now;
    f->t_write = now;
    f->t_est = 0;  /* the server spoke first: what the client sends next answers it, it is no late request */
    f->slot = *slot;
    return 0;
}

/* The target reading a request: its flow is known from here on, so the reply's retransmits made while the
   write is still in the syscall count too. */
TRACEPOINT_PROBE(sock, sock_recv_length)
{
    if (args->protocol != IPPROTO_TCP_ || args->ret <= 0)
        return 0;
    u32 *slot = target_slot(bpf_get_current_pid_tgid() >> 32);
    if (!slot)
        return 0;
    u64 sk = (u64)args->sk;
    if (flows.lookup(&sk))
        return 0;
    struct flow_t fresh = {};
    fresh.slot = *slot;
    fresh.t_mark = bpf_ktime_get_ns();
    if (flows.update(&sk, &fresh))
        count_lost();
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_probe)
{
    u64 sk = (u64)args->skaddr;
    struct flow_t *f = flows.lookup(&sk);
    if (!f)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u32 una = args->snd_una;
    f->lport = args->sport;
#ifdef FIRST_REQUEST
    if (f->t_est) {
        /* The first segment since the handshake. With data it is the request (a pure ACK first: not timed). */
        u64 waited = now - f->t_est;
        f->t_est = 0;
        if (args->data_len) {
            add(f->slot, F_FIRST_REQUESTS, 1);
            if (waited > REQUEST_LATE_MAX_NS) {
                add(f->slot, F_IDLE_CONNECTS, 1);
            } else if (waited >= REQUEST_LATE_MIN_NS) {
                add(f->slot, F_LATE_REQUESTS, 1);
                add(f->slot, F_REQUEST_WAIT_NS, waited);
            }
        }
    }
#endif
    if (una != f->una && f->t_in)
        f->t_mark = f->t_in;  /* the previous segment moved snd_una */
    /* An ACK processed while the write still held the socket (t_in before t_write) completed it at once. */
    if (f->t_write && una == args->snd_nxt && args->snd_wnd)
        deliver(f, sk, f->t_in > f->t_write ? f->t_in : f->t_write, args->srtt);  /* srtt: already us */
    f->una = una;
    f->t_in = now;
    return 0;
}

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    if (args->protocol != IPPROTO_TCP_)
        return 0;
    int from = args->oldstate, to = args->newstate;
    /* Our FIN acknowledged: so is every byte before it. The client's FIN: it acknowledges what the client
       received, all of the reply unless the client gave up on it (then it usually resets, see the docs). */
    int fin_acked = (from == TCP_FIN_WAIT1_ && (to == TCP_FIN_WAIT2_ || to == TCP_TIME_WAIT_))
                    || (from == TCP_CLOSING_ && to == TCP_TIME_WAIT_);
    int peer_fin = from == TCP_ESTABLISHED_ && to == TCP_CLOSE_WAIT_;
    if (from == TCP_SYN_RECV_ && to == TCP_ESTABLISHED_) {
        /* A handshake on a target's listening port completed (the client's ACK, or its first data, arrived). */
        u16 port = args->sport;
        u64 sk = (u64)args->skaddr;
        u32 netns = 0;
        u32 *slot = server_slot(sk, port, &netns);
        if (!slot)
            return 0;
        add(*slot, F_CONNECTS, 1);
#ifdef FIRST_REQUEST
        {
            /* The wait for the first request starts: a flow entry for the new server socket. */
            struct flow_t fresh = {};
            fresh.slot = *slot;
            fresh.t_est = bpf_ktime_get_ns();
            fresh.t_mark = fresh.t_est;
            fresh.lport = port;
            fresh.netns = netns;
            if (flows.update(&sk, &fresh))
                count_lost();
        }
#endif
        struct hs_key_t key = {};
        __builtin_memcpy(key.daddr, args->daddr_v6, 16);
        key.netns = netns;
        key.sport = args->sport;
        key.dport = args->dport;
        struct hs_t *h = handshakes.lookup(&key);
        if (h) {
            u64 waited = bpf_ktime_get_ns() - h->t_first;
            if (waited < HANDSHAKE_MAX_NS) {  /* older: a handshake the client gave up, its port used again */
                add(*slot, F_SLOW_CONNECTS, 1);
                add(*slot, F_CONNECT_WAIT_NS, waited + SYNACK_RTO_INIT_NS);
            }
            handshakes.delete(&key);
        }
        return 0;
    }
    if (!fin_acked && !peer_fin)
        return 0;
    u64 sk = (u64)args->skaddr;
    struct flow_t *f = flows.lookup(&sk);
    if (!f)
        return 0;
    f->lport = args->sport;
    if (f->t_write)
        deliver(f, sk, bpf_ktime_get_ns(), 0);
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
    u64 sk = (u64)args->skaddr;
    struct flow_t *f = flows.lookup(&sk);
    if (!f)
        return 0;
#ifdef HAVE_ERR_FIELD
    if (args->err)
        return 0;  /* not sent (6.13+: given up before transmitting, or dropped on output) */
#endif
    f->lport = args->sport;
    if (!server_slot(sk, f->lport, &f->netns))
        return 0;
    add(f->slot, F_RETRANSMITS, 1);
    f->retrans = 1;  /* everything before the last delivery was acknowledged: this is the next reply's data */
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_cong_state_set)
{
    if (args->cong_state != TCP_CA_LOSS_)
        return 0;
    u64 sk = (u64)args->skaddr;
    struct flow_t *f = flows.lookup(&sk);
    if (!f)
        return 0;
    u64 now = bpf_ktime_get_ns();
    if (server_slot(sk, args->sport, &f->netns)) {
        f->rto = 1;
        if (now > f->t_mark)
            add(f->slot, F_STALL_NS, now - f->t_mark);
    }
    f->t_mark = now;
    return 0;
}

/* The kernel resent a SYN-ACK (its timer, or the client's SYN came again): the client is still connecting. */
TRACEPOINT_PROBE(tcp, tcp_retransmit_synack)
{
    u32 netns = 0;
    u32 *slot = server_slot((u64)args->skaddr, args->sport, &netns);  /* skaddr: the listener */
    if (!slot)
        return 0;
    add(*slot, F_SYNACK_RETRANSMITS, 1);
    struct hs_key_t key = {};
    __builtin_memcpy(key.daddr, args->daddr_v6, 16);
    key.netns = netns;
    key.sport = args->sport;
    key.dport = args->dport;
    u64 now = bpf_ktime_get_ns();
    struct hs_t *h = handshakes.lookup(&key);
    if (h && now - h->t_first < HANDSHAKE_MAX_NS)
        return 0;  /* a later retransmit of the same handshake */
    struct hs_t fresh = {};
    fresh.t_first = now;
    if (handshakes.update(&key, &fresh))
        count_lost();
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_destroy_sock)
{
    u64 sk = (u64)args->skaddr;
    flows.delete(&sk);
    return 0;
}
"""


@dataclass(frozen=True)
class DeliveryConfig:
    max_targets: int = 64  # processes: each member of a family target takes a slot
    max_flows: int = 16384  # sockets a target wrote to, LRU: the least recently used goes first when full
    max_handshakes: int = 4096  # handshakes whose SYN-ACK was retransmitted and not yet completed, LRU
    # Time each fresh connection's first request after its handshake (its flow entry is made at the handshake).
    first_request: bool = True
    bounds: tuple[float, ...] = field(default=DEFAULT_BOUNDS)  # histogram upper bounds, seconds
    # None: look at tcp_retransmit_skb's format in tracefs at start() (its `err` field is 6.13+).
    err_field: bool | None = None
    # Key the targets' listening ports by their network namespace (the socket's, read at the running kernel's BTF
    # offsets): another namespace's server on the same port is not the target's. False, or no BTF: by port alone,
    # host-wide (the probe's health says which).
    netns: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.max_targets <= 1024:
            raise ValueError(f"max_targets must be within [1, 1024], got {self.max_targets!r}")
        if not 16 <= self.max_flows <= 1 << 20:
            raise ValueError(f"max_flows must be within [16, 1048576], got {self.max_flows!r}")
        if not 16 <= self.max_handshakes <= 1 << 20:
            raise ValueError(f"max_handshakes must be within [16, 1048576], got {self.max_handshakes!r}")
        bounds = tuple(self.bounds)
        if not 1 <= len(bounds) <= MAX_BOUNDS or any(b <= 0 for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"bounds must be 1 to {MAX_BOUNDS} increasing positive seconds, got {self.bounds!r}")


def n_fields(bounds: tuple[float, ...]) -> int:
    return len(bounds) + 1 + len(COUNTERS)


def bucket_key(bound: float) -> str:
    """A bucket's upper bound as Prometheus writes `le` (and the latency source's buckets are keyed)."""
    return "+Inf" if bound == float("inf") else repr(float(bound)).removesuffix(".0")


def render(config: DeliveryConfig, err_field: bool = True, netns: NetnsOffsets | None = None) -> str:
    """The C text for `config`: #defines, the target filter, then the program."""
    bounds = tuple(config.bounds)
    nb = len(bounds)
    chain = "".join(f"    if (ns <= {round(b * 1e9)}ULL) return {i};\n" for i, b in enumerate(bounds))
    bucket_fn = f"static inline u32 bucket_of(u64 ns)\n{{\n{chain}    return {nb};\n}}\n"
    defines = [f"#define MAX_TARGETS {config.max_targets}", f"#define MAX_FLOWS {config.max_flows}",
               f"#define MAX_HANDSHAKES {config.max_handshakes}",
               f"#define SYNACK_RTO_INIT_NS {round(SYNACK_RTO_INIT_S * 1e9)}ULL",
               f"#define HANDSHAKE_MAX_NS {round(HANDSHAKE_MAX_S * 1e9)}ULL",
               f"#define N_FIELDS {n_fields(bounds)}"]
    defines += [f"#define F_{name.upper()} {nb + 1 + i}" for i, name in enumerate(COUNTERS)]
    if err_field:
        defines.append("#define HAVE_ERR_FIELD 1")
    if netns is not None:
        defines += [f"#define NETNS_SK_NET {netns.sk_net}", f"#define NETNS_NET_INUM {netns.net_inum}"]
    if config.first_request:
        defines += ["#define FIRST_REQUEST 1", f"#define REQUEST_LATE_MIN_NS {round(REQUEST_LATE_MIN_S * 1e9)}ULL",
                    f"#define REQUEST_LATE_MAX_NS {round(REQUEST_LATE_MAX_S * 1e9)}ULL"]
    return ("\n".join(defines) + "\n" + target_filter.c_text(config.max_targets) + c_helpers.lost()
            + bucket_fn + BPF_TEXT)


def listening_ports(endpoints: Iterable) -> set[int]:
    return {ep.port for ep in endpoints if ep.listening}


class DeliveryProbe(SlottedProbe):
    """Delivery time of target servers' replies, from their last write to the client's acknowledgement."""

    name = "delivery"
    tracepoints = TRACEPOINTS

    def __init__(self, config: DeliveryConfig | None = None, proc_root: Path = Path("/proc"),
                 sockets: ProcSockets | None = None) -> None:
        super().__init__(config or DeliveryConfig(), proc_root)
        self._fields = n_fields(tuple(self.config.bounds))
        self._seen = [0] * (self.config.max_targets * self._fields)
        self._sockets = sockets or shared(proc_root)
        self._ports: set[tuple[int, int]] = set()
        self._port_slots: dict[tuple[int, int], int] = {}
        self._netns: NetnsOffsets | None = None  # offsets a socket's namespace is read at; None: ports alone

    def _render(self) -> str:
        from probes.tcpretrans import tracepoint_has_field  # noqa: PLC0415 - shares tracefs parsing

        err_field = self.config.err_field
        if err_field is None:
            err_field = tracepoint_has_field("tcp:tcp_retransmit_skb", "err")
        self._netns = None
        self._health.detail["netns"] = "off (config): ports keyed alone, host-wide"
        if self.config.netns:
            try:
                self._netns = netns_offsets()
                self._health.detail["netns"] = "keyed"
            except BtfError as exc:
                self._health.detail["netns"] = f"not read ({exc}): ports keyed alone, host-wide"
        return render(self.config, err_field, self._netns)

    def set_targets(self, targets: Iterable[int]) -> None:
        super().set_targets(targets)
        self._sync_ports()

    def _take_baseline(self, added: list[tuple[int, int]]) -> None:
        counts = self._read_counts()
        for _, slot in added:
            lo, hi = slot * self._fields, (slot + 1) * self._fields
            self._seen[lo:hi] = counts[lo:hi]

    def _read_slots(self) -> dict[int, DeliveryReading]:
        self._sync_ports()
        counts = self._read_counts()
        nb = len(self.config.bounds)
        keys = [bucket_key(b) for b in self.config.bounds] + ["+Inf"]
        readings: dict[int, DeliveryReading] = {}
        for tgid, slot in self._slots.items():
            base = slot * self._fields
            delta = [counts[base + i] - self._seen[base + i] for i in range(self._fields)]
            c = dict(zip(COUNTERS, delta[nb + 1:], strict=True))
            readings[tgid] = DeliveryReading(
                replies=c["replies"], retransmitted=c["retransmitted"], rto_replies=c["rto"],
                buckets={k: float(n) for k, n in zip(keys, delta[:nb + 1], strict=True)},
                delivery_seconds=c["delivery_ns"] / 1e9,
                srtt_mean_seconds=(c["srtt_us"] / 1e6 / c["replies"]) if c["replies"] else None,
                retransmits=c["retransmits"], rto_stall_seconds=c["stall_ns"] / 1e9,
                not_server=c["unserved"], synack_retransmits=c["synack_retransmits"], connects=c["connects"],
                slow_connects=c["slow_connects"], connect_wait_seconds=c["connect_wait_ns"] / 1e9,
                first_requests=c["first_requests"] if self.config.first_request else None,
                late_requests=c["late_requests"],
                request_wait_seconds=c["request_wait_ns"] / 1e9, idle_connects=c["idle_connects"])
        self._seen = counts
        self._health.detail["server_ports"] = sorted({port for _, port in self._ports})
        return readings

    def _sync_ports(self) -> None:
        """The listening ports of the targets into `server_ports`, keyed by the target's network namespace (its
        /proc/PID/ns/net inode, the kernel's `net->ns.inum`; 0 when not keyed by namespace), each with the slot of
        the first target (in slot order) that listens on it there: their sockets there are server sockets, and its
        handshakes that target's. `listen_ports` marks the ports alone, the programs' first test."""
        ports: dict[tuple[int, int], int] = {}
        for tgid, slot in sorted(self._slots.items(), key=lambda kv: kv[1]):
            netns = 0
            if self._netns is not None:
                found = self._sockets.netns(tgid)
                if found is None:
                    continue  # gone, or its namespace unreadable: its replies count as not served
                netns = found
            try:
                for port in listening_ports(self._sockets.endpoints(tgid)):
                    ports.setdefault((netns, port), slot)
            except (TargetGone, AccessDenied):
                continue  # gone: dropped at read; unreadable: its replies count as not served
        table, marks = self._bpf[b"server_ports"], self._bpf[b"listen_ports"]
        for netns, port in set(self._port_slots) - set(ports):
            try:
                del table[table.Key(netns, port)]
            except KeyError:
                pass
        for (netns, port), slot in ports.items():
            if self._port_slots.get((netns, port)) != slot:
                table[table.Key(netns, port)] = table.Leaf(slot)
        for port in {p for _, p in self._port_slots} - {p for _, p in ports}:
            marks[marks.Key(port)] = marks.Leaf(0)
        for port in {p for _, p in ports} - {p for _, p in self._port_slots}:
            marks[marks.Key(port)] = marks.Leaf(1)
        self._port_slots = ports
        self._ports = set(ports)

    def _read_counts(self) -> list[int]:
        return percpu_array_sums(self._bpf[b"counts"])

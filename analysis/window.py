"""The Window: one target's readings of every source over one interval, as plain data."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import msgspec

N = TypeVar("N", int, float)


def measured_sum(values: Iterable[N | None]) -> N | None:
    """The sum of what was measured; None (not measured) only when nothing was. A reading that is None adds nothing,
    never a zero."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


@dataclass
class Log2Histogram:
    """Counts in power-of-two buckets: counts[i] covers [2**i, 2**(i+1)) of `unit` (slot 0 also holds 0)."""

    unit: str = "ns"
    counts: list[int] = field(default_factory=list)

    def total(self) -> int:
        return sum(self.counts)

    def add(self, other: Log2Histogram) -> None:
        if other.unit != self.unit:
            raise ValueError(f"cannot add a histogram in {other.unit!r} to one in {self.unit!r}")
        if len(other.counts) > len(self.counts):
            self.counts.extend([0] * (len(other.counts) - len(self.counts)))
        for i, c in enumerate(other.counts):
            self.counts[i] += c

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding quantile q (0..1); 0.0 when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q!r}")
        total = self.total()
        if total == 0:
            return 0.0
        rank = q * total
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                return float(2 ** (i + 1))
        return float(2 ** len(self.counts))

    @classmethod
    def from_slots(cls, slots: dict[int, int], unit: str = "ns") -> Log2Histogram:
        if not slots:
            return cls(unit=unit, counts=[])
        counts = [0] * (max(slots) + 1)
        for slot, c in slots.items():
            counts[slot] += c
        return cls(unit=unit, counts=counts)


@dataclass
class SyscallReading:
    counts: dict[str, int] = field(default_factory=dict)
    latency: dict[str, Log2Histogram] = field(default_factory=dict)


@dataclass
class OffCpuReading:
    seconds: float = 0.0
    by_thread: dict[int, float] = field(default_factory=dict)
    histogram: Log2Histogram = field(default_factory=lambda: Log2Histogram(unit="us"))
    # Folded kernel stacks ("frame;frame;frame") -> off-CPU microseconds.
    stacks: dict[str, int] = field(default_factory=dict)


@dataclass
class GcReading:
    collections: int = 0
    pause_seconds: float = 0.0
    max_pause_seconds: float = 0.0
    histogram: Log2Histogram = field(default_factory=lambda: Log2Histogram(unit="us"))


@dataclass
class TcpFlow:
    saddr: str
    sport: int
    daddr: str
    dport: int
    state: str
    retransmits: int


@dataclass
class TcpReading:
    retransmits: int = 0
    flows: list[TcpFlow] = field(default_factory=list)


@dataclass
class Culprit:
    """A process that ran on a CPU while a target thread waited on that CPU's run queue (probes/runqlat.py)."""

    pid: int
    comm: str  # as the kernel named it while it ran (kept when the process has exited since)
    seconds: float  # of the target's run-queue wait, this window
    cmdline: str | None = None
    user: str | None = None
    cgroup: str | None = None
    # None with a reason when the process could not be read at the window's end (it exited, or its pid now
    # belongs to another program); its pid, comm and seconds are still the kernel's.
    reason: str | None = None
    # "idle" (no task ran: the wait was the wakeup's own latency), "self" (the target's own threads),
    # "agent" (infersight itself or its py-spy), else "" (a neighbour).
    kind: str = ""


@dataclass
class RunQueueReading:
    histogram: Log2Histogram = field(default_factory=lambda: Log2Histogram(unit="us"))
    total_seconds: float = 0.0
    # Who ran while the target waited: the top culprits by seconds of its wait, largest first. Empty in windows
    # recorded before they were kept; `charged_seconds` None there (not measured), else the part of
    # total_seconds charged to any task (the rest spanned more switches than the probe keeps per CPU).
    culprits: list[Culprit] = field(default_factory=list)
    charged_seconds: float | None = None


@dataclass
class ProcessReading:
    cpu_seconds: float = 0.0
    rss_bytes: int = 0
    threads: int = 0
    voluntary_ctx_switches: int = 0
    involuntary_ctx_switches: int = 0
    fds: int = 0
    # Threads in state T/t (stopped by a signal or a tracer), or all of them while the process's cgroup is frozen
    # (docker pause), and D (uninterruptible, mostly disk) at the read, an instant at the window's end. None in
    # windows recorded before they were read: not measured, not zero.
    stopped_threads: int | None = None
    disk_wait_threads: int | None = None


@dataclass
class StackReading:
    """Folded Python stacks from py-spy: 'thread;file:func;...' -> samples."""

    active: dict[str, int] = field(default_factory=dict)
    idle: dict[str, int] = field(default_factory=dict)
    rate_hz: float = 0.0
    # Sampling ticks merged into this window; below rate_hz * duration when py-spy lagged or gapped.
    samples: int = 0


@dataclass
class LatencyReading:
    p50_seconds: float | None = None
    p95_seconds: float | None = None
    p99_seconds: float | None = None
    mean_seconds: float | None = None
    requests: float = 0.0
    request_rate: float = 0.0
    # The latency histogram's delta over the window: bucket upper bound ("0.1", "+Inf") -> requests
    # that finished in it (not cumulative). Empty for a counter-only source.
    buckets: dict[str, float] = field(default_factory=dict)
    # Server-side load and per-phase means, where the server exports them (vLLM / TGI names); None
    # when it does not.
    tokens_per_second: float | None = None
    waiting: float | None = None
    running: float | None = None
    ttft_mean_seconds: float | None = None
    tpot_mean_seconds: float | None = None
    queue_mean_seconds: float | None = None
    prefill_mean_seconds: float | None = None
    decode_mean_seconds: float | None = None


@dataclass
class DeliveryReading:
    """Replies of a target's server sockets acknowledged by their clients in the window (probes/delivery.py)."""

    replies: int = 0
    # Replies that were retransmitted / hit an RTO before the client acknowledged them.
    retransmitted: int = 0
    rto_replies: int = 0
    # Delivery time (last write -> client's ACK) per bucket: upper bound as the latency source keys it -> replies.
    buckets: dict[str, float] = field(default_factory=dict)
    delivery_seconds: float = 0.0  # sum over the replies
    srtt_mean_seconds: float | None = None  # the flows' smoothed RTT at each reply's completion, mean
    retransmits: int = 0  # packets of its server sockets
    rto_stall_seconds: float = 0.0  # time its flows waited for an RTO to fire
    not_server: int = 0  # acknowledged writes on sockets that are not server sockets (not in the figures)
    # Connection setup on its listening ports: SYN-ACKs resent, handshakes completed, those of them that needed a
    # SYN-ACK retransmit, and the time those waited from the first SYN-ACK (docs/delivery.md "Connection setup").
    synack_retransmits: int = 0
    connects: int = 0
    slow_connects: int = 0
    connect_wait_seconds: float = 0.0
    # Fresh connections' first requests (docs/delivery.md "The first request"): those that arrived, those that came
    # 0.2-3.5 s after the handshake (a lost request the client resent) and their waits summed, and those that came
    # later still (a connection opened ahead of use: a pool, a preconnect; no wait counted). first_requests None:
    # not measured (a recording or probe without it), and the other three are then 0 unread, not zero.
    first_requests: int | None = None
    late_requests: int = 0
    request_wait_seconds: float = 0.0
    idle_connects: int = 0


@dataclass
class GpuReading:
    available: bool = False
    reason: str | None = None
    utilization: float | None = None
    memory_used_bytes: int | None = None
    power_watts: float | None = None


@dataclass
class MemoryGrower:
    """A process whose resident memory grew over the last minute or so (agent/sources/memory_growers.py), read in a
    window where memory stalled: `grew_bytes` over `seconds`; `member` when it is one of the target's own."""

    pid: int
    comm: str
    grew_bytes: int
    rss_bytes: int
    seconds: float
    member: bool = False
    cmdline: str | None = None
    user: str | None = None


@dataclass
class DiskWriter:
    """A process that wrote to the disks (agent/sources/disk_writers.py), read in a window where the target's I/O
    stalled: `written_bytes` sent to the storage layer over `seconds`; `member` when it is one of the target's own."""

    pid: int
    comm: str
    written_bytes: int
    seconds: float
    member: bool = False
    cmdline: str | None = None
    user: str | None = None


@dataclass
class PressureReading:
    """Pressure stall information over the window (agent/sources/pressure.py): seconds in which some (or all,
    `full`) of the tasks stalled on a resource, as deltas of the kernel's totals, host-wide and for the target's
    cgroup; and the target's own major page faults and the host's page reclaim. None where not measured, with the
    reason in `reasons` (a kernel without PSI, a cgroup v1-only host), never zero."""

    # resource ("cpu", "memory", "io") -> {"some": seconds, "full": seconds} (cpu's `full` is 0 at the host level)
    host: dict[str, dict[str, float]] | None = None
    cgroup: dict[str, dict[str, float]] | None = None
    cgroup_path: str | None = None
    major_faults: int | None = None  # of the target's processes (a family's members summed)
    reclaimed_pages: int | None = None  # host-wide, kswapd and direct reclaim (/proc/vmstat pgsteal_*)
    # The processes that grew most, read only in a window where memory stalled or was reclaimed (else None, with
    # the reason under "growers"); [] when it was read and nothing grew.
    growers: list[MemoryGrower] | None = None
    # The processes that wrote most, read only in a window where I/O stalled (else None, with the reason under
    # "writers"); [] when it was read and nobody wrote 1 MiB. None in windows recorded before it was kept.
    writers: list[DiskWriter] | None = None
    reasons: dict[str, str] = field(default_factory=dict)  # "host", "cgroup", "major_faults", "reclaimed_pages"


@dataclass
class MemberReading:
    """One process of a family target in one window (analysis.family): its own share of the family's readings.
    None is "not measured" (the reason is in `errors`), never zero."""

    pid: int
    role: str  # its process title (`VLLM::EngineCore`), else comm
    cpu_seconds: float | None = None
    rss_bytes: int | None = None
    syscalls: dict[str, int] | None = None  # syscall name -> calls
    offcpu_seconds: float | None = None
    offcpu_by_kind: dict[str, float] | None = None  # wait kind (analysis.waits) -> seconds, kinds seen only
    gc_collections: int | None = None
    gc_pause_seconds: float | None = None
    runqueue_seconds: float | None = None
    retransmits: int | None = None
    stack_samples: int | None = None
    # Threads waiting inside their own code, on average per py-spy tick of this member (analysis.features).
    app_wait_threads: float | None = None
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class Window:
    target: str
    pid: int
    start: float
    end: float
    syscalls: SyscallReading | None = None
    offcpu: OffCpuReading | None = None
    gc: GcReading | None = None
    tcp: TcpReading | None = None
    runqueue: RunQueueReading | None = None
    process: ProcessReading | None = None
    stacks: StackReading | None = None
    latency: LatencyReading | None = None
    gpu: GpuReading | None = None
    # Source name -> why it has no reading this window: reasons, unlike Health.error_count and
    # Snapshot.agent_errors (counts).
    errors: dict[str, str] = field(default_factory=dict)
    # Of `errors`, the sources whose target did not answer at all (a timeout, a refused or reset connection): a
    # stopped or cut-off server, not a wrong answer. Empty in windows recorded before it was kept.
    unanswered: list[str] = field(default_factory=list)
    # Of `unanswered`, those that could not even connect (refused, timed out, no route): nothing reached the port,
    # for the kernel completes a handshake even for a stopped process. The others connected and got no reply.
    unreachable: list[str] = field(default_factory=list)
    # Of `unreachable`, those whose loopback port had no listening socket at all: the server closed its port (or has
    # not opened it yet). A firewall's reset or drop leaves the listener there. Empty in windows recorded before.
    closed: list[str] = field(default_factory=list)
    # A family target's processes, each with its own figures (the reading fields above are the family's totals);
    # empty for a single-process target and in windows recorded before families.
    members: list[MemberReading] = field(default_factory=list)
    # Replies of its server sockets as the clients' acknowledgements tell (probes/delivery.py); null in windows
    # recorded before it was kept or with the probe off.
    delivery: DeliveryReading | None = None
    # Pressure stall information and memory faults (PressureReading); null in windows recorded before it was kept.
    pressure: PressureReading | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Window:
        """The inverse of to_dict (JSON's string keys become the int keys they were); ValueError naming the bad field."""
        try:
            # Not strict: JSON turned by_thread's int keys into strings, which converting turns back.
            return msgspec.convert(data, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ValueError(f"not a Window: {exc}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> Window:
        try:
            return msgspec.json.decode(text, type=cls)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise ValueError(f"not a Window: {exc}") from None


# The fields a collector fills, each named after its collector (the config key and the metric label too). Written
# out, not derived: `unanswered` and `unreachable` are lists about a reading, not readings (a test checks that
# every Optional reading field of Window is here).
READINGS: tuple[str, ...] = ("syscalls", "offcpu", "gc", "tcp", "runqueue", "process", "stacks", "latency", "gpu",
                             "delivery", "pressure")

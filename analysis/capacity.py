"""Capacity analysis of a stepped load test: per-step figures, the SLO, the knee and the bottleneck at it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

# A resource counts as saturated when its level reaches its threshold (score >= 1). Each value is
# documented in docs/loadtest.md with why it was chosen.
THREAD_CPU_SATURATED = 0.85  # cores used by the busiest thread: one Python thread cannot use more than 1
PROCESS_CPU_SATURATED = 0.85  # share of the host's cores the whole process uses
GC_PAUSE_SATURATED = 0.05  # share of wall time the interpreter spent in GC pauses
# Seconds the server's threads sat runnable but not running, per second they ran: at 1 they wait
# for a CPU as long as they use one (a host whose other work takes half of every core reads ~0.5).
RUNQ_WAIT_PER_CPU_SATURATED = 1.0
SYSCALLS_PER_REQUEST_SATURATED = 5000.0  # a streamed completion needs tens to hundreds, not thousands
RETRANSMITS_PER_REQUEST_SATURATED = 0.05  # one retransmit in twenty requests stalls p95 by an RTO (200 ms+)
# ...and at least this many in the step: a short step of 20-40 requests turns one or two stray
# retransmits (seen on loopback, where nothing is lost) into a rate above the line.
MIN_RETRANSMITS = 5
BLOCKED_OFFCPU_SATURATED = 0.40  # hottest thread off-CPU this share of wall while requests queued
QUEUE_WAITING_BLOCKED = 1.0  # mean waiting requests that says work was there for the hottest thread
# Below this many collections a second, a high pause share means each pause was long; the uprobes time
# wall clock, so on a contended host that is mostly the pause being preempted, and it is discounted.
GC_FREQUENT_PER_S = 1.0
QUEUE_BOUND_SATURATED = 0.01  # share of requests refused with 429: the queue bound was hit
# Mean sequences per engine iteration as a share of the server's batch limit: at 0.9 nearly every
# iteration is full, so with requests waiting, more load only lengthens the queue.
BATCH_FULL_SATURATED = 0.90


@dataclass(frozen=True)
class Slo:
    """The service level a step must meet: client p95 latency and error rate."""

    p95_s: float
    max_error_rate: float = 0.01

    def __post_init__(self) -> None:
        if not self.p95_s > 0:
            raise ValueError(f"SLO p95 must be > 0 seconds, got {self.p95_s!r}")
        if not 0 <= self.max_error_rate < 1:
            raise ValueError(f"max error rate must be within [0, 1), got {self.max_error_rate!r}")


@dataclass
class StepFigures:
    """What one load step measured, from the client and from the server; None = not measured (see `unmeasured`)."""

    index: int
    offered_rps: float
    planned_s: float
    duration_s: float
    sent: int
    ok: int
    achieved_rps: float
    tokens_per_s: float
    # "429", "5xx", "4xx", "timeout", "connection", "dropped": requests that did not complete.
    errors: dict[str, int] = field(default_factory=dict)
    stopped_early: bool = False
    repeat_of: int | None = None  # index of the step this one repeats, to measure run-to-run noise
    client_p50_s: float | None = None
    client_p95_s: float | None = None
    client_p99_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    server_p50_s: float | None = None
    server_p95_s: float | None = None
    server_p99_s: float | None = None
    queue_waiting_mean: float | None = None
    queue_waiting_max: float | None = None
    running_mean: float | None = None
    batch_mean: float | None = None
    max_batch: int | None = None  # the server's batch limit, when the run was told it (--server-max-batch, a sweep)
    cpu_cores: float | None = None
    busiest_thread_cores: float | None = None
    busiest_thread_offcpu_share: float | None = None
    # Wait kind -> seconds per second, summed over the threads that ran in the step: a pool thread that
    # slept through it (torch's, an idle HTTP worker) waits all the time whatever the load, and is
    # counted apart in idle_offcpu_by_kind instead.
    offcpu_by_kind: dict[str, float] = field(default_factory=dict)
    idle_threads: int | None = None  # threads that slept through the whole step
    idle_offcpu_by_kind: dict[str, float] = field(default_factory=dict)
    gc_pause_share: float | None = None
    gc_collections_per_s: float | None = None
    runq_p99_us: float | None = None
    runq_wait_per_s: float | None = None
    syscalls_per_request: float | None = None
    ctx_switches_per_s: float | None = None
    involuntary_ctx_switches_per_s: float | None = None
    retransmits: int | None = None
    host_cpus: int | None = None
    unmeasured: dict[str, str] = field(default_factory=dict)  # figure -> why it is None

    @property
    def error_rate(self) -> float:
        return sum(self.errors.values()) / self.sent if self.sent else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["error_rate"] = self.error_rate
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepFigures:
        """The inverse of to_dict (its derived error_rate is not read); a ValueError names a field that does not fit."""
        return msgspec.convert(data, cls)


def verdict(step: StepFigures, slo: Slo) -> str | None:
    """None when the step meets the SLO, else the one-line reason it does not."""
    if step.ok == 0:
        return f"no request completed ({step.sent} sent)"
    if step.error_rate > slo.max_error_rate:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(step.errors.items()))
        return f"error rate {step.error_rate:.1%} > {slo.max_error_rate:.1%} ({kinds})"
    if step.client_p95_s is not None and step.client_p95_s > slo.p95_s:
        return f"p95 {step.client_p95_s * 1000:.0f} ms > SLO {slo.p95_s * 1000:.0f} ms"
    return None


@dataclass
class Knee:
    """The highest step meeting the SLO before the first that breaks it (indexes into the run's steps)."""

    last_good: int | None
    first_bad: int | None
    reason: str  # why first_bad fails, or why there is no knee

    @property
    def found(self) -> bool:
        return self.last_good is not None and self.first_bad is not None


def find_knee(steps: list[StepFigures], slo: Slo) -> Knee:
    """Walk the schedule steps (repeats excluded) in offered order; the knee sits before the first failure."""
    ordered = sorted((s for s in steps if s.repeat_of is None), key=lambda s: (s.offered_rps, s.index))
    last_good: int | None = None
    for step in ordered:
        why = verdict(step, slo)
        if why is not None:
            if last_good is None:
                return Knee(None, step.index, f"the lowest step ({step.offered_rps:g} req/s) already fails: {why}")
            return Knee(last_good, step.index, why)
        last_good = step.index
    top = ordered[-1].offered_rps if ordered else 0.0
    return Knee(last_good, None, f"every step met the SLO, up to {top:g} req/s: raise the schedule to find the knee")


@dataclass
class Evidence:
    """One figure at the last good step and the first failing one, against the level that means saturated."""

    figure: str
    good: float | None
    bad: float | None
    threshold: float | None  # None: context for the reader, not a saturation test
    unit: str

    def text(self) -> str:
        def fmt(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.3g}"

        limit = "" if self.threshold is None else f" (saturated at {self.threshold:g})"
        return f"{self.figure} {fmt(self.good)} -> {fmt(self.bad)} {self.unit}{limit}"


@dataclass
class Candidate:
    """One resource that can be the bottleneck, scored at the first failing step (>= 1: saturated)."""

    resource: str
    signal: str  # the name of the figure that shows it, as the report and the fault docs use it
    score: float
    evidence: list[Evidence]
    explanation: str
    score_good: float | None = None  # the same score at the last good step (None: no step was good)

    @property
    def rise(self) -> float | None:
        """What the score gained across the knee; None without a last good step to gain from."""
        return None if self.score_good is None else self.score - self.score_good


@dataclass
class Bottleneck:
    resource: str | None
    summary: str
    candidates: list[Candidate] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _score(value: float | None, threshold: float) -> float:
    return 0.0 if value is None else value / threshold


def _gc_share(step: StepFigures) -> float | None:
    """GC pause share of wall time; for rare collections, only the part not explained by run-queue wait."""
    share = step.gc_pause_share
    if share is None or (step.gc_collections_per_s or 0.0) >= GC_FREQUENT_PER_S:
        return share
    waiting = _runq_per_cpu(step) or 0.0
    return share / (1.0 + waiting)


def _blocked_share(step: StepFigures) -> float | None:
    """Share of wall time the busiest thread slept (not runnable): off-CPU time counts preemption too,
    so the process's run-queue wait (an upper bound of that thread's) is taken off."""
    if step.busiest_thread_offcpu_share is None:
        return None
    return max(0.0, step.busiest_thread_offcpu_share - (step.runq_wait_per_s or 0.0))


def _runq_per_cpu(step: StepFigures) -> float | None:
    if step.runq_wait_per_s is None or step.cpu_cores is None:
        return None
    return step.runq_wait_per_s / max(step.cpu_cores, 0.05)  # an idle server's tiny CPU must not inflate it


def _batch_fill(step: StepFigures) -> float | None:
    if step.batch_mean is None or not step.max_batch:
        return None
    return step.batch_mean / step.max_batch


def _per_request(total: float | None, step: StepFigures) -> float | None:
    return None if total is None or not step.ok else total / step.ok


def candidates(good: StepFigures | None, bad: StepFigures) -> list[Candidate]:
    """Every resource's saturation score at the failing step, highest first, with before/after evidence."""
    g = good or StepFigures(index=-1, offered_rps=0.0, planned_s=0.0, duration_s=0.0, sent=0, ok=0,
                            achieved_rps=0.0, tokens_per_s=0.0)
    out: list[Candidate] = []
    refused = bad.errors.get("429", 0) / bad.sent if bad.sent else 0.0
    refused_before = g.errors.get("429", 0) / g.sent if g.sent else 0.0
    out.append(Candidate(
        "queue bound", "429 share", _score(refused, QUEUE_BOUND_SATURATED),
        [Evidence("requests refused with 429", refused_before, refused, QUEUE_BOUND_SATURATED, "share"),
         Evidence("queue waiting max", g.queue_waiting_max, bad.queue_waiting_max, None, "requests")],
        "the server's waiting queue reached its bound and it refused requests (429)"))
    out.append(Candidate(
        "GC", "gc pause share", _score(_gc_share(bad), GC_PAUSE_SATURATED),
        [Evidence("GC pause share of wall time", _gc_share(g), _gc_share(bad), GC_PAUSE_SATURATED, "share"),
         Evidence("GC collections", g.gc_collections_per_s, bad.gc_collections_per_s, None, "/s")],
        "the interpreter spent its time in garbage-collection pauses"))
    out.append(Candidate(
        "syscalls", "syscalls per request", _score(bad.syscalls_per_request, SYSCALLS_PER_REQUEST_SATURATED),
        [Evidence("syscalls per request", g.syscalls_per_request, bad.syscalls_per_request,
                  SYSCALLS_PER_REQUEST_SATURATED, "")],
        "each request made thousands of system calls"))
    retrans_bad = _per_request(None if bad.retransmits is None else float(bad.retransmits), bad)
    retrans_good = _per_request(None if g.retransmits is None else float(g.retransmits), g)
    # Both the rate and the count must reach their lines: the score is the lower of the two.
    retrans_score = min(_score(retrans_bad, RETRANSMITS_PER_REQUEST_SATURATED),
                        _score(None if bad.retransmits is None else float(bad.retransmits), MIN_RETRANSMITS))
    out.append(Candidate(
        "network (retransmits)", "retransmits per request", retrans_score,
        [Evidence("TCP retransmits per request", retrans_good, retrans_bad, RETRANSMITS_PER_REQUEST_SATURATED, ""),
         Evidence("TCP retransmits in the step", None if g.retransmits is None else float(g.retransmits),
                  None if bad.retransmits is None else float(bad.retransmits), MIN_RETRANSMITS, "segments")],
        "lost segments made responses wait for retransmission timeouts"))
    out.append(Candidate(
        "CPU contention (run queue)", "run-queue wait per CPU second",
        _score(_runq_per_cpu(bad), RUNQ_WAIT_PER_CPU_SATURATED),
        [Evidence("run-queue wait per CPU second", _runq_per_cpu(g), _runq_per_cpu(bad), RUNQ_WAIT_PER_CPU_SATURATED,
                  "s/s"),
         Evidence("run-queue wait", g.runq_wait_per_s, bad.runq_wait_per_s, None, "s/s"),
         Evidence("run-queue p99", g.runq_p99_us, bad.runq_p99_us, None, "us")],
        "the server's threads were runnable but waited for a CPU (other work on the host, or too many threads)"))
    blocked = (_blocked_share(bad)
               if bad.queue_waiting_mean is not None and bad.queue_waiting_mean >= QUEUE_WAITING_BLOCKED else None)
    lock_ev = [Evidence("busiest thread blocked share (off-CPU less run-queue wait)", _blocked_share(g),
                        _blocked_share(bad), BLOCKED_OFFCPU_SATURATED, "share"),
               Evidence("queue waiting mean", g.queue_waiting_mean, bad.queue_waiting_mean, QUEUE_WAITING_BLOCKED,
                        "requests")]
    lock_ev += [Evidence(f"off-CPU in {k}", g.offcpu_by_kind.get(k), v, None, "s/s")
                for k, v in sorted(bad.offcpu_by_kind.items(), key=lambda kv: -kv[1])[:2]]
    out.append(Candidate(
        "lock / blocking wait", "busiest thread off-CPU while requests queue", _score(blocked, BLOCKED_OFFCPU_SATURATED),
        lock_ev, "requests queued while the thread that serves them was blocked off-CPU (a lock or a slow wait)"))
    full = (_batch_fill(bad)
            if bad.queue_waiting_mean is not None and bad.queue_waiting_mean >= QUEUE_WAITING_BLOCKED else None)
    out.append(Candidate(
        "batch size", "mean batch at the server's limit while requests queue", _score(full, BATCH_FULL_SATURATED),
        [Evidence("mean batch / max batch", _batch_fill(g), _batch_fill(bad), BATCH_FULL_SATURATED, "share"),
         Evidence("queue waiting mean", g.queue_waiting_mean, bad.queue_waiting_mean, QUEUE_WAITING_BLOCKED,
                  "requests"),
         Evidence("batch size mean", g.batch_mean, bad.batch_mean, None, "sequences")],
        "every engine iteration decoded a full batch while requests waited: the batch limit caps throughput"))
    out.append(Candidate(
        "CPU of the busiest thread", "busiest thread CPU", _score(bad.busiest_thread_cores, THREAD_CPU_SATURATED),
        [Evidence("busiest thread CPU", g.busiest_thread_cores, bad.busiest_thread_cores, THREAD_CPU_SATURATED,
                  "cores"),
         Evidence("queue waiting mean", g.queue_waiting_mean, bad.queue_waiting_mean, None, "requests"),
         Evidence("batch size mean", g.batch_mean, bad.batch_mean, None, "sequences"),
         Evidence("run-queue p99", g.runq_p99_us, bad.runq_p99_us, None, "us")],
        "one thread (the decode loop) used a whole core: the server is CPU-bound on it"))
    share = None if bad.cpu_cores is None or not bad.host_cpus else bad.cpu_cores / bad.host_cpus
    share_good = None if g.cpu_cores is None or not g.host_cpus else g.cpu_cores / g.host_cpus
    out.append(Candidate(
        "CPU of the host", "process CPU share", _score(share, PROCESS_CPU_SATURATED),
        [Evidence("process CPU share of the host", share_good, share, PROCESS_CPU_SATURATED, "share")],
        "the server used nearly every core of the host"))
    return sorted(out, key=lambda c: -c.score)


def name_bottleneck(good: StepFigures | None, bad: StepFigures | None) -> Bottleneck:
    """Of the resources saturated at the first failing step, the one whose score rose most across the knee.

    A resource already saturated at the last good step that did not get worse (a busy host's steady
    run-queue wait) is background the server was meeting its SLO with; what broke it is what changed.
    When even the lowest step failed there is no good step to rise from, so the one furthest beyond
    its own threshold (the highest score) is named, and the summary says which rule named it.
    """
    if bad is None:
        return Bottleneck(None, "no step failed the SLO, so nothing saturated yet")
    ranked = candidates(good, bad)
    if good is not None:
        before = {c.resource: c.score for c in candidates(None, good)}
        for c in ranked:
            c.score_good = before.get(c.resource, 0.0)
        saturated = sorted((c for c in ranked if c.score >= 1.0), key=lambda c: (-(c.rise or 0.0), -c.score))
    else:
        saturated = [c for c in ranked if c.score >= 1.0]  # `ranked` is highest score first
    if not saturated:
        near = ", ".join(f"{c.resource} {c.score:.0%}" for c in ranked[:3])
        return Bottleneck(None, "no measured resource saturated at the first failing step (nearest: "
                                f"{near}); the limit lies in something not measured here", ranked)
    top = saturated[0]
    shown = "; ".join(e.text() for e in top.evidence[:2])
    rule = "" if good is not None else (" [no step met the SLO, so none to compare with: named the resource "
                                        f"furthest beyond its threshold, score {top.score:.2f}]")

    def score(c: Candidate) -> str:
        return f"score {c.score:.2f}" if c.score_good is None else f"score {c.score_good:.2f} -> {c.score:.2f}"

    also = ("; also saturated: " + ", ".join(f"{c.resource} ({score(c)})" for c in saturated[1:])
            if len(saturated) > 1 else "")
    return Bottleneck(top.resource, f"{top.resource}: {top.explanation} ({shown}){rule}{also}", ranked)

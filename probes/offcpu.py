"""Off-CPU time per target thread, with blocked-interval histograms and symbolised kernel stacks.

Traces: `sched:sched_switch` only (a classic tracepoint; no kprobes, so it runs where bcc's own
`offcputime` cannot, which needs `finish_task_switch`).

How: at sched_switch the program runs in the context of the task switching *out* (prev). If prev
belongs to a target, it stores (switch-out time, kernel [and user] stack id, tgid) in `start`
keyed by tid. When a tid with a record switches *in* (next_pid), the record is claimed and the
delta is added to cumulative per-thread and per-stack counters and to a log2 histogram of the
whole blocked interval in microseconds. User space diffs the cumulative counters each window
(diffing, unlike read-then-delete, loses no increment that lands between the read and the delete).

Windows: off-CPU time belongs to the window in which it passes. Counters are keyed by the
window's parity. read() first has the kernel publish the boundary T with the new parity in one 8-byte
word (`boundary`, written by `flip_window`); from then on switch-ins count into the new window and split a record that predates
T at T. Then every still-open record is cut at T by a second BPF program (`cut_open`) that user
space runs once per record through BPF_PROG_TEST_RUN: it moves the record's `ts` to T with a
compare-and-swap and accounts [ts, T] to the closing window. The switch-in path claims with an
atomic exchange of `ts` to 0, so each nanosecond is owned by exactly one of the two. Finally
user space reads the closing parity's counters. The one residue: a switch-in that read the old
word and is still running on another vCPU while read() runs (a hypervisor stall) adds its
increment late; it is not lost, it shows two windows later.

Overhead: two hash lookups per context switch host-wide, plus a kernel stack walk per target
switch-out (OffCpuConfig(kernel_stacks=False) drops it; user stacks add a second walk, hence off
by default). Pipe ping-pong, 30 interleaved triples on a 2-vCPU VM at load 8: bare 5.8 us per
round trip, +0.9 us with the program attached and no target, +3.0 us with the ping-pong's parent
as target; the spread (2.8-13 us bare) hides the difference kernel_stacks=False makes.

Caveats: a thread already blocked when it becomes a target gets a record opened by user space
(stack "[blocked since before tracing]", see _seed_blocked). User stacks of CPython stop at libc (no frame pointers); Python-level "where" comes from
py-spy. Failed stack ids (-EEXIST on a stack-map hash collision, -EFAULT) are counted in health.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.errors import ProbeUnavailable
from analysis.health import Health
from analysis.window import Log2Histogram, OffCpuReading
from probes import c_helpers
from probes.base import Followed, RawTracepointRunner, load_bpf, prog_recursion_misses, require_tracepoints

TRACEPOINTS = ("sched:sched_switch", "task:task_newtask")

BPF_TEXT = r"""
#include <uapi/linux/ptrace.h>

/* prev_state as the tracepoint reports it: X (EXIT_DEAD) or Z (EXIT_ZOMBIE) means the task is
   leaving for good and never switches in again; recording it would leak a `start` entry. */
#define EXITING_STATE 0x30

struct start_t {
    u64 ts;      /* start of the part not yet accounted; 0 once the switch-in claimed it */
    u64 since;   /* switch-out time: the histogram measures the whole blocked interval */
    u32 tgid;
    int kstack;
    int ustack;
};

/* `parity` is the window's: user space flips it at each boundary (see `boundary`), so the
   window being closed can be read while the next one already counts. All-u32 keys: no padding. */
struct thread_key_t { u32 tgid; u32 tid; u32 parity; };
struct stack_key_t { u32 tgid; int kstack; int ustack; u32 parity; };
struct hist_key_t { u32 tgid; u32 slot; u32 parity; };

BPF_HASH(targets, u32, u8, MAX_TARGETS);
/* Families (probes/target_filter.py says why): a followed target's child processes are targets from birth. */
BPF_HASH(follow, u32, u8, MAX_TARGETS);
BPF_HASH(newborn, u32, u32, MAX_TARGETS);  /* child tgid -> parent tgid, until user space reads it */
BPF_ARRAY(follow_missed, u64, 1);
BPF_HASH(start, u32, struct start_t, MAX_THREADS);
BPF_HASH(thread_ns, struct thread_key_t, u64, MAX_THREADS);
BPF_HASH(stack_ns, struct stack_key_t, u64, MAX_STACK_KEYS);
BPF_HASH(hist, struct hist_key_t, u64, MAX_HIST_KEYS);
BPF_STACK_TRACE(stacks, STACK_SLOTS);
/* 0: kernel stack id failed, 1: user stack id failed, 2: start map full, 3: counter map full */
/* (the `failures` array of 4: probes/c_helpers.py) */
/* One word written by user space at each window boundary: the boundary time with the low bit
   replaced by the new window's parity (one aligned 8-byte store, so never read torn). */
BPF_ARRAY(boundary, u64, 1);

static inline void add_ns(u32 parity, u32 tgid, u32 tid, int kstack, int ustack, u64 delta) {
    u64 zero = 0;
    struct thread_key_t tk = {.tgid = tgid, .tid = tid, .parity = parity};
    u64 *t = thread_ns.lookup_or_try_init(&tk, &zero);
    if (t)
        __sync_fetch_and_add(t, delta);
    else
        count_failure(3);
    struct stack_key_t sk = {.tgid = tgid, .kstack = kstack, .ustack = ustack, .parity = parity};
    u64 *s = stack_ns.lookup_or_try_init(&sk, &zero);
    if (s)
        __sync_fetch_and_add(s, delta);
    else
        count_failure(3);
}

TRACEPOINT_PROBE(task, task_newtask) {
    if (args->clone_flags & 0x00010000)  /* CLONE_THREAD: a thread, counted in its process */
        return 0;
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!follow.lookup(&parent))
        return 0;
    u32 child = args->pid;
    u8 one = 1;
    if (targets.update(&child, &one) || newborn.update(&child, &parent)) {
        targets.delete(&child);
        u32 zero = 0;
        u64 *n = follow_missed.lookup(&zero);
        if (n)
            __sync_fetch_and_add(n, 1);
        return 0;
    }
    follow.update(&child, &one);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    /* Switch-out: we are still in prev's context, so the current tgid is prev's. */
    u32 prev_tgid = bpf_get_current_pid_tgid() >> 32;
    u32 prev_tid = args->prev_pid;
    if (prev_tid != 0 && targets.lookup(&prev_tgid)) {
        if (args->prev_state & EXITING_STATE) {
            start.delete(&prev_tid);
        } else {
            struct start_t rec = {.ts = now, .since = now, .tgid = prev_tgid};
#ifdef KERNEL_STACKS
            rec.kstack = stacks.get_stackid(args, 0);
            if (rec.kstack < 0)
                count_failure(0);
#else
            rec.kstack = NO_STACK;
#endif
#ifdef USER_STACKS
            rec.ustack = stacks.get_stackid(args, BPF_F_USER_STACK);
            if (rec.ustack < 0)
                count_failure(1);
#else
            rec.ustack = NO_STACK;
#endif
            if (start.update(&prev_tid, &rec))
                count_failure(2);
        }
    }

    /* Switch-in: only target threads have a record, so this lookup is the target filter. */
    u32 next_tid = args->next_pid;
    struct start_t *p = start.lookup(&next_tid);
    if (!p)
        return 0;
    /* The exchange is the claim: cut_open() moves ts forward only with a compare-and-swap
       against the value it read, so after this exchange it can no longer account any of it. */
    u64 ts = __sync_lock_test_and_set(&p->ts, 0);
    u64 since = p->since;
    u32 tgid = p->tgid;
    int kstack = p->kstack;
    int ustack = p->ustack;
    start.delete(&next_tid);
    if (!targets.lookup(&tgid))
        return 0;  /* untargeted while it was off-CPU */
    int zero_idx = 0;
    u64 *word = boundary.lookup(&zero_idx);
    u64 cut = word ? (*word & ~1ULL) : 0;
    u32 parity = word ? (*word & 1) : 0;
    if (ts != 0 && now > ts) {
        /* A record user space has not cut yet although the boundary passed (read() is still
           iterating): split it, so the closing window gets exactly its part. */
        if (ts < cut && cut < now) {
            add_ns(parity ^ 1, tgid, next_tid, kstack, ustack, cut - ts);
            add_ns(parity, tgid, next_tid, kstack, ustack, now - cut);
        } else {
            add_ns(parity, tgid, next_tid, kstack, ustack, now - ts);
        }
    }
    if (now > since) {
        u64 zero = 0;
        struct hist_key_t hk = {.tgid = tgid, .slot = log2_slot((now - since) / 1000), .parity = parity};
        u64 *h = hist.lookup_or_try_init(&hk, &zero);
        if (h)
            __sync_fetch_and_add(h, 1);
        else
            count_failure(3);
    }
    return 0;
}

/* Run from user space (BPF_PROG_TEST_RUN) to start a window: args = (its parity). Taking the
   time here, where nothing preempts us, rather than in user space keeps a descheduled reader from
   leaving a gap between the boundary time and the moment switch-ins see the new parity. */
int flip_window(struct bpf_raw_tracepoint_args *ctx) {
    int zero_idx = 0;
    u64 *word = boundary.lookup(&zero_idx);
    if (!word)
        return 1;
    __sync_lock_test_and_set(word, (bpf_ktime_get_ns() & ~1ULL) | (ctx->args[0] & 1));
    return 0;
}

/* Run from user space (BPF_PROG_TEST_RUN) once per open record at each window boundary, after
   `boundary` was flipped: args = (tid, boundary T in CLOCK_MONOTONIC ns, parity of the closing
   window). Accounts [ts, T] to the closing window and moves ts to T.
   Returns 0 when it accounted, 1 when there was nothing to cut. */
int cut_open(struct bpf_raw_tracepoint_args *ctx) {
    u32 tid = ctx->args[0];
    u64 cut = ctx->args[1];
    u32 parity = ctx->args[2];
    struct start_t *p = start.lookup(&tid);
    if (!p)
        return 1;
    u64 ts = p->ts;
    if (ts == 0 || ts >= cut)
        return 1;
    /* Fails when the thread switched in (ts became 0) or out again (a new ts) since the read. */
    if (__sync_val_compare_and_swap(&p->ts, ts, cut) != ts)
        return 1;
    add_ns(parity, p->tgid, tid, p->kstack, p->ustack, cut - ts);
    return 0;
}
"""

# A stack id no walk resolves: the value kept in records when user stacks are off.
NO_STACK = -1
# Kernel stack id of records opened by user space for threads blocked before they were targets.
SEEDED_STACK = -1000
# Distinct /proc stacks given ids below SEEDED_STACK; far from the small -errno values of failed walks.
MAX_SEEDED_STACKS = 999
BPF_NOEXIST = 1
# /proc/PID/task/TID/stat states of a thread that is not on a CPU nor runnable.
BLOCKED_STATES = frozenset("SDITt")


@dataclass(frozen=True)
class OffCpuConfig:
    max_targets: int = 64
    max_threads: int = 16384
    max_stack_keys: int = 16384
    stack_slots: int = 16384
    kernel_stacks: bool = True
    user_stacks: bool = False
    top_stacks: int = 20

    def __post_init__(self) -> None:
        for name in ("max_targets", "max_threads", "max_stack_keys", "stack_slots", "top_stacks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"OffCpuConfig.{name} must be a positive int, got {value!r}")


def render(config: OffCpuConfig) -> str:
    defines = [
        f"#define MAX_TARGETS {config.max_targets}",
        f"#define MAX_THREADS {config.max_threads}",
        f"#define MAX_STACK_KEYS {config.max_stack_keys}",
        f"#define MAX_HIST_KEYS {config.max_targets * 64}",
        f"#define STACK_SLOTS {config.stack_slots}",
        f"#define NO_STACK ({NO_STACK})",
    ]
    if config.kernel_stacks:
        defines.append("#define KERNEL_STACKS 1")
    if config.user_stacks:
        defines.append("#define USER_STACKS 1")
    return ("\n".join(defines) + "\n" + c_helpers.failures(4) + c_helpers.log2_slot() + BPF_TEXT)


class OffCpuProbe:
    name = "offcpu"

    def __init__(self, config: OffCpuConfig | None = None, proc_root: Path = Path("/proc"),
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.config = config or OffCpuConfig()
        self._proc = proc_root
        # Must be CLOCK_MONOTONIC: seeded records are compared with bpf_ktime_get_ns() in the kernel.
        self._clock = clock
        self._bpf: Any = None
        self._runner: RawTracepointRunner | None = None
        self._flipper: RawTracepointRunner | None = None
        # Boundaries of the window the last read() returned (CLOCK_MONOTONIC ns, set in the kernel).
        self.window_start_ns: int | None = None
        self.window_end_ns: int | None = None
        self._targets: set[int] = set()
        # Followed targets (a family's members), the children the kernel made targets (child -> parent), and the
        # exited ones whose last reading went out at the previous read.
        self._family = Followed()
        # Targets beyond max_targets, left out: pid -> reason (their windows say so instead of reading zero).
        self._unsupported: dict[int, str] = {}
        self._state = "stopped"
        self._reason: str | None = None
        # Cumulative counter values already handed out, per map key.
        self._parity = 0
        self._seen_threads: dict[tuple[int, int, int], int] = {}
        self._seen_stacks: dict[tuple[int, int, int, int], int] = {}
        self._seen_hist: dict[tuple[int, int, int], int] = {}
        self._folded: dict[tuple[int, int, int], str] = {}
        # Synthetic kernel stack ids (SEEDED_STACK - n) for threads already blocked when targeted, whose
        # stack the kernel never walked: /proc/TID/stack names it instead. Leaf first, like a stack walk.
        self._seeded_ids: dict[tuple[str, ...], int] = {}

    def start(self, targets: Iterable[int]) -> None:
        if self._bpf is not None:
            raise RuntimeError("offcpu probe already started; use set_targets() to change targets")
        try:
            require_tracepoints(TRACEPOINTS)
            self._bpf = load_bpf(render(self.config))
            bcc_mod = type(self._bpf)
            self._runner = RawTracepointRunner(self._bpf.load_func(b"cut_open", bcc_mod.RAW_TRACEPOINT).fd)
            self._flipper = RawTracepointRunner(self._bpf.load_func(b"flip_window", bcc_mod.RAW_TRACEPOINT).fd)
            self._runner.run(0, 0, 0)  # fail at start, not at the first read, where test runs are missing
            self._flipper.run(self._parity)
            self.window_end_ns = self._bpf[b"boundary"][0].value & ~1
        except ProbeUnavailable as exc:
            self._state, self._reason = "failed", str(exc)
            self.stop(keep_reason=True)
            raise
        self._state, self._reason = "running", None
        self._targets = set()  # targets given before start() are not in the kernel's map yet
        self.set_targets(targets)

    def set_targets(self, targets: Iterable[int]) -> None:
        wanted = _within_capacity({int(t) for t in targets}, self._targets, self.config.max_targets)
        self._unsupported = {t: f"offcpu traces at most {self.config.max_targets} targets (max_targets)"
                             for t in {int(t) for t in targets} - wanted}
        if self._bpf is None:
            self._targets = wanted
            return
        table = self._bpf[b"targets"]
        for tgid in self._targets - wanted:
            self._drop_target(tgid)
            self._family.parents.pop(tgid, None)
        for tgid in wanted - self._targets:
            table[table.Key(tgid)] = table.Leaf(1)
            self._seed_blocked(tgid)
        self._targets = wanted

    def read(self) -> dict[int, OffCpuReading]:
        if self._bpf is None or self._runner is None:
            raise RuntimeError("offcpu probe is not running; call start() first")
        closing, self._parity = self._parity, self._parity ^ 1
        self._flipper.run(self._parity)
        cut = self._bpf[b"boundary"][0].value & ~1
        self.window_start_ns, self.window_end_ns = self.window_end_ns, cut
        start = self._bpf[b"start"]
        for key in list(start.keys()):
            self._runner.run(key.value, cut, closing)
        self._adopt()
        gone = {t for t in self._targets if not (self._proc / str(t)).exists()}
        for tgid in self._family.to_drop(gone):
            self._drop_target(tgid)
            self._targets.discard(tgid)
            self._family.parents.pop(tgid, None)
        readings = {tgid: OffCpuReading() for tgid in self._targets}
        self._read_threads(readings, closing)
        self._read_hist(readings, closing)
        self._read_stacks(readings, closing)
        return readings

    def set_followed(self, tgids: Iterable[int]) -> None:
        """The targets whose new child processes the kernel makes targets the moment they are forked."""
        self._family.tgids = {int(t) for t in tgids}
        if self._bpf is not None:
            self._family.sync(self._bpf[b"follow"])

    def children(self) -> dict[int, int]:
        """Child tgid -> parent tgid of the followed children among the current targets."""
        return dict(self._family.parents)

    def _adopt(self) -> None:
        newborn = self._bpf[b"newborn"]
        for key, parent in list(newborn.items()):
            child = int(key.value)
            self._targets.add(child)
            self._family.parents[child] = int(parent.value)
            try:
                del newborn[key]
            except KeyError:
                pass
    def host(self) -> None:
        return None

    def stop(self, keep_reason: bool = False) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
        self._runner = self._flipper = None
        if not keep_reason:
            self._state, self._reason = "stopped", None

    def health(self) -> Health:
        failed = lost = 0
        if self._bpf is not None:
            counts = [v.value for v in self._bpf[b"failures"].values()]
            failed, lost = counts[0] + counts[1], counts[2] + counts[3]
            # Runs the kernel skipped because another tracing program was active on that CPU.
            lost += prog_recursion_misses(self._bpf.funcs[b"tracepoint__sched__sched_switch"].fd, "sched_switch")
        health = Health(name=self.name, state=self._state, reason=self._reason, targets=len(self._targets),
                        lost_events=lost, failed_stacks=failed, unsupported=dict(self._unsupported))
        if self._bpf is not None:
            health.detail["followed_children_missed"] = int(self._bpf[b"follow_missed"][0].value)
        return health

    def _read_threads(self, readings: dict[int, OffCpuReading], parity: int) -> None:
        table = self._bpf[b"thread_ns"]
        for key, value in table.items():
            if key.parity != parity:
                continue
            ident = (key.tgid, key.tid, key.parity)
            delta = value.value - self._seen_threads.get(ident, 0)
            self._seen_threads[ident] = value.value
            if key.tgid in readings and delta:
                reading = readings[key.tgid]
                reading.by_thread[key.tid] = reading.by_thread.get(key.tid, 0.0) + delta / 1e9
                reading.seconds += delta / 1e9
            # A thread that is gone gets no further increments, so its key can go once read.
            if key.tgid not in self._targets or not (self._proc / str(key.tgid) / "task" / str(key.tid)).exists():
                del table[key]
                self._seen_threads.pop(ident, None)
        stale = self._bpf[b"start"]
        for key, rec in list(stale.items()):
            if rec.tgid not in self._targets or not (self._proc / str(rec.tgid) / "task" / str(key.value)).exists():
                del stale[key]

    def _read_hist(self, readings: dict[int, OffCpuReading], parity: int) -> None:
        slots: dict[int, dict[int, int]] = {}
        for key, value in self._bpf[b"hist"].items():
            if key.parity != parity:
                continue
            ident = (key.tgid, key.slot, key.parity)
            delta = value.value - self._seen_hist.get(ident, 0)
            self._seen_hist[ident] = value.value
            if key.tgid in readings and delta:
                slots.setdefault(key.tgid, {})[key.slot] = delta
        for tgid, by_slot in slots.items():
            readings[tgid].histogram = Log2Histogram.from_slots(by_slot, unit="us")

    def _read_stacks(self, readings: dict[int, OffCpuReading], parity: int) -> None:
        per_target: dict[int, dict[str, int]] = {}
        for key, value in self._bpf[b"stack_ns"].items():
            if key.parity != parity:
                continue
            ident = (key.tgid, key.kstack, key.ustack, key.parity)
            delta = value.value - self._seen_stacks.get(ident, 0)
            self._seen_stacks[ident] = value.value
            if key.tgid not in readings or delta <= 0:
                continue
            folded = self._fold(key.tgid, key.kstack, key.ustack)
            stacks = per_target.setdefault(key.tgid, {})
            stacks[folded] = stacks.get(folded, 0) + delta
        for tgid, stacks in per_target.items():
            top = sorted(stacks.items(), key=lambda kv: kv[1], reverse=True)[: self.config.top_stacks]
            readings[tgid].stacks = {folded: ns // 1000 for folded, ns in top}

    def _fold(self, tgid: int, kstack: int, ustack: int) -> str:
        """'user;frames;-;kernel;frames', root first; ids are stable because `stacks` is never cleared."""
        ident = (tgid, kstack, ustack)
        if ident in self._folded:
            return self._folded[ident]
        table = self._bpf[b"stacks"]
        if kstack in self._seeded_by_id:
            kernel = [*self._seeded_by_id[kstack], "[blocked since before tracing]"]
        elif kstack == SEEDED_STACK:
            kernel = ["[blocked since before tracing]"]
        elif kstack == NO_STACK:
            kernel = ["[kernel stacks off]"]
        elif kstack < 0:
            kernel = [f"[kernel stack failed: {kstack}]"]
        else:
            kernel = [self._bpf.ksym(a).decode(errors="replace") for a in table.walk(kstack)]
        frames = list(reversed(kernel))
        if self.config.user_stacks:
            user = ([self._bpf.sym(a, tgid).decode(errors="replace") for a in table.walk(ustack)]
                    if ustack >= 0 else [f"[user stack failed: {ustack}]"])
            frames = list(reversed(user)) + ["-"] + frames
        folded = ";".join(frames)
        self._folded[ident] = folded
        return folded

    def _seed_blocked(self, tgid: int) -> None:
        """Open a record for each thread already blocked, else its time stays unseen until it runs.

        Race: a thread that wakes between the state read and the insert gets a record although it
        runs; its next switch-out overwrites it, so at most that stretch is miscounted, and only if
        a window boundary falls inside it. NOEXIST keeps a real record written meanwhile.
        """
        start = self._bpf[b"start"]
        task_dir = self._proc / str(tgid) / "task"
        # Read the (slow) /proc stacks first, then re-read the states and insert at once: the race
        # above must stay as short as one state read, or a thread that woke meanwhile and spins keeps
        # a stale record that every window boundary counts as off-CPU time.
        stack_ids = {tid: self._seeded_stack_id(task_dir / str(tid) / "stack") for tid in _blocked_threads(task_dir)}
        now = self._clock()
        for tid in _blocked_threads(task_dir):
            leaf = start.Leaf(now, now, tgid, stack_ids.get(tid, SEEDED_STACK), NO_STACK)
            _insert_if_absent(start, start.Key(tid), leaf)

    @property
    def _seeded_by_id(self) -> dict[int, tuple[str, ...]]:
        return {sid: frames for frames, sid in self._seeded_ids.items()}

    def _seeded_stack_id(self, stack_file: Path) -> int:
        frames = _proc_kernel_stack(stack_file)
        if not frames:
            return SEEDED_STACK
        if frames not in self._seeded_ids:
            if len(self._seeded_ids) >= MAX_SEEDED_STACKS:
                return SEEDED_STACK
            self._seeded_ids[frames] = SEEDED_STACK - 1 - len(self._seeded_ids)
        return self._seeded_ids[frames]

    def _drop_target(self, tgid: int) -> None:
        """Forget a target's counters; the kernel side stops counting once it leaves `targets`."""
        targets = self._bpf[b"targets"]
        key = targets.Key(tgid)
        if key in targets:
            del targets[key]
        for name, seen in ((b"thread_ns", self._seen_threads), (b"stack_ns", self._seen_stacks),
                           (b"hist", self._seen_hist)):
            table = self._bpf[name]
            for k in [k for k in table if k.tgid == tgid]:
                del table[k]
            for ident in [i for i in seen if i[0] == tgid]:
                del seen[ident]
        self._folded = {i: f for i, f in self._folded.items() if i[0] != tgid}


def _within_capacity(wanted: set[int], current: set[int], capacity: int) -> set[int]:
    """The targets to trace: those already traced first, then the lowest new pids, up to `capacity`."""
    kept = sorted(wanted & current)[:capacity]
    return set(kept + sorted(wanted - current)[: capacity - len(kept)])


def _proc_kernel_stack(path: Path) -> tuple[str, ...]:
    """Function names from /proc/PID/task/TID/stack ('[<0>] futex_wait+0x1b/0x40'), leaf first; () if unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return ()
    names = []
    for line in lines:
        symbol = line.split("] ", 1)[-1].split("+", 1)[0].strip()
        if symbol:
            names.append(symbol)
    return tuple(names)


def _blocked_threads(task_dir: Path) -> list[int]:
    tids = []
    try:
        entries = list(task_dir.iterdir())
    except FileNotFoundError:
        return tids
    for entry in entries:
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we listed it
        # The state follows the parenthesised comm, which may itself contain ')'.
        if stat[stat.rindex(")") + 2] in BLOCKED_STATES:
            tids.append(int(entry.name))
    return tids


def _insert_if_absent(table: Any, key: Any, leaf: Any) -> None:
    from bcc.libbcc import lib

    # EEXIST is the expected outcome when the kernel wrote a real record first.
    lib.bpf_update_elem(table.map_fd, ctypes.byref(key), ctypes.byref(leaf), BPF_NOEXIST)

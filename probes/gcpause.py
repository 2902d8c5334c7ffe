"""Python GC pauses per target, measured from outside the process with uprobes or USDT.

Traces, per target, in the target's own CPython image (its libpython, or the executable when
Python is linked statically; found through /proc/PID/maps by probes.libpython):
- USDT python:gc__start / python:gc__done when the interpreter was built with them (plain
  uprobes at the probe sites; the kernel raises the sites' semaphores via ref_ctr_offset), else
- a uprobe + uretprobe on the function each collection runs exactly once (gc_collect_main on
  3.10-3.13, collect and its compiler clones before).
The entry records the time per thread; the return adds one collection, its pause, a per-window
maximum and a log2 histogram in microseconds. Targets without either raise Unsupported, and so
does a target whose image is not a well-formed ELF file: the file is the target's to craft
(docs/security.md, rule 9). Every uprobe goes at a file offset probes.libpython found, through
the path it opened (/proc/PID/map_files/...): bcc never opens or parses the target's file.

Families (docs/window.md "members"): a uprobe bound to one pid does not fire in that process's forks, so a
followed target (a family member, `set_followed`) is counted instead by its image's *system-wide* uprobes
(pid -1, one set per image file however many members run it), filtered here by `targets`. A
`task:task_newtask` program makes each child process of a followed target a target from its fork, so a child
that lives 200 ms and ends between two windows is reported once, in the next read, with its whole life's
collections. A target that is not followed keeps uprobes bound to its pid. Never counted by both: `targets` holds
each process's mode (PER_PROCESS or SHARED), only that mode's uprobes record a collection's entry, and only the
return of the mode that recorded it counts it; the set a process was switched away from stays attached until the
next read, so a collection running across the switch is counted once, not lost. A placed child that execs is looked at again: on
an image with shared uprobes it is counted on, otherwise (or if it ended first) its gc is null with the reason.

Overhead: a uprobe costs a trap (~1-3 us here) per hit and collections are rare (about one per
700 net allocations of container objects in generation 0), so it is small next to the pause. With a followed
family the cost is no longer the targets' alone: every process on the host running the same libpython (or
static python) file takes the trap and the uretprobe's return trampoline on each collection, and one hash
lookup says it is no target (docs/BENCHMARKS.md, "gcpause followed": ~0.8 us per collection here); through
USDT the kernel also raises the sites' semaphores in every such process. Processes that do not map the file pay
nothing. Per-pid attachment costs no other process anything.

Caveats: the pause is the collector's own time; gc.callbacks run outside it. Uprobes are placed
per target pid or per image, so adding a target attaches the already loaded functions again (no recompile).
Collections run during interpreter shutdown are counted too (they call the same function).

Pid reuse: each target is held by a pidfd from just before its attach. The kernel binds each per-pid uprobe's
perf event to the task the pid named at attach time (it fires only in that task's mm), and the caller
(agent.collectors) checks the target is still the discovered process before and after the attach. The
moment the pidfd reports the exit, a watcher thread takes the tgid out of the `targets` filter; the next
read() detaches it and reports nothing for it, even when the pid already names another process (a family
member reports the collections counted while it lived, once). A followed target or a child the kernel placed
leaves `targets` and `follow` in `sched:sched_process_exit` when its last thread exits, before its pid can be
reused, and a placed child is flagged exited; user space holds a pidfd for it only when the flag is still clear
after the pidfd is open, so nothing another process does under that pid is counted or reported for it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.errors import AccessDenied, ProbeUnavailable, TargetGone, Unsupported
from analysis.health import Health
from analysis.window import GcReading, Log2Histogram
from probes import c_helpers
from probes.base import Followed, import_bcc, load_bpf, require_tracepoints, tracefs_root
from probes.libpython import USDT_PROVIDER, PythonImage, find_python_image
from probes.pidfd import ExitWatcher, ProcessHandle

BPF_TEXT = r"""
#include <uapi/linux/ptrace.h>

struct totals_t { u64 count; u64 total_ns; };
/* parity: the window's, flipped by user space at each read, so the closing window's maximum can
   be read and reset while the next one already records. All-u32 keys: no padding. */
struct max_key_t { u32 tgid; u32 parity; };
struct hist_key_t { u32 tgid; u32 slot; };
/* A child process the kernel made a target at its fork (families): its parent, whether its last thread has
   exited, and how many times it exec'd; kept until user space drops the child. */
struct newborn_t { u32 parent; u32 exited; u32 execs; };

/* tgid -> which uprobes count it: PER_PROCESS (those bound to its pid) or SHARED (its image's system-wide ones).
   One mode per process, so a process that both reach in a switch-over is counted by exactly one. */
BPF_HASH(targets, u32, u8, MAX_TARGETS);
/* A collection's entry, by thread, with the mode that recorded it: that mode's return counts it, even when the
   process was switched to the other mode meanwhile (its uprobes stay attached until the next read). */
struct start_t { u64 ts; u32 mode; u32 pad; };
BPF_HASH(start, u32, struct start_t, MAX_THREADS);
BPF_HASH(totals, u32, struct totals_t, MAX_TARGETS);
BPF_HASH(maxima, struct max_key_t, u64, MAX_TARGETS * 2);
BPF_HASH(hist, struct hist_key_t, u64, MAX_TARGETS * 64);
BPF_ARRAY(window, u64, 1);
/* Families: a followed target's child processes are SHARED targets from birth (probes/target_filter.py says why). */
BPF_HASH(follow, u32, u8, MAX_TARGETS);
BPF_HASH(newborn, u32, struct newborn_t, MAX_TARGETS);
BPF_ARRAY(follow_missed, u64, 1);
/* 0: a return without a recorded entry (attached mid-collection), 1: a map was full */
/* (the `failures` array of 2: probes/c_helpers.py) */

static __always_inline int on_start(u8 mode) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u8 *seen = targets.lookup(&tgid);
    if (!seen || *seen != mode)
        return 0;
    u32 tid = id;
    struct start_t rec = {.ts = bpf_ktime_get_ns(), .mode = mode};
    if (start.update(&tid, &rec))
        count_failure(1);
    return 0;
}

static __always_inline int on_done(u8 mode) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u8 *seen = targets.lookup(&tgid);
    if (!seen)
        return 0;
    u32 tid = id;
    struct start_t *begin = start.lookup(&tid);
    if (!begin) {
        if (*seen == mode)
            count_failure(0);
        return 0;
    }
    if (begin->mode != mode)
        return 0;  /* the other mode's entry: its own return counts it */
    u64 pause = bpf_ktime_get_ns() - begin->ts;
    start.delete(&tid);

    struct totals_t zero_totals = {};
    struct totals_t *t = totals.lookup_or_try_init(&tgid, &zero_totals);
    if (t) {
        __sync_fetch_and_add(&t->count, 1);
        __sync_fetch_and_add(&t->total_ns, pause);
    } else {
        count_failure(1);
    }

    int zero_idx = 0;
    u64 *parity = window.lookup(&zero_idx);
    u64 zero = 0;
    struct max_key_t mk = {.tgid = tgid, .parity = parity ? (*parity & 1) : 0};
    u64 *m = maxima.lookup_or_try_init(&mk, &zero);
    /* The GIL serialises collections within a process: no compare-and-swap loop needed. */
    if (m && *m < pause)
        *m = pause;

    struct hist_key_t hk = {.tgid = tgid, .slot = log2_slot(pause / 1000)};
    u64 *h = hist.lookup_or_try_init(&hk, &zero);
    if (h)
        __sync_fetch_and_add(h, 1);
    else
        count_failure(1);
    return 0;
}

int gc_start(struct pt_regs *ctx) { return on_start(PER_PROCESS); }
int gc_done(struct pt_regs *ctx) { return on_done(PER_PROCESS); }
int gc_start_shared(struct pt_regs *ctx) { return on_start(SHARED); }
int gc_done_shared(struct pt_regs *ctx) { return on_done(SHARED); }

TRACEPOINT_PROBE(task, task_newtask) {
    if (args->clone_flags & 0x00010000)  /* CLONE_THREAD: a thread, counted in its process */
        return 0;
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!follow.lookup(&parent))
        return 0;
    u32 child = args->pid;
    struct newborn_t nb = {.parent = parent};
    u8 mode = SHARED;
    if (newborn.update(&child, &nb) || targets.update(&child, &mode)) {
        newborn.delete(&child);
        u32 zero = 0;
        u64 *n = follow_missed.lookup(&zero);
        if (n)
            __sync_fetch_and_add(n, 1);
        return 0;
    }
    u8 one = 1;
    follow.update(&child, &one);
    return 0;
}

/* A process whose last thread exits leaves the filter here, before its pid can name another process; a child
   placed above is flagged, so user space never takes a pidfd of the pid's next owner for it. */
TRACEPOINT_PROBE(sched, sched_process_exit) {
#ifdef HAS_GROUP_DEAD
    if (!args->group_dead)
        return 0;
#else
    if (args->pid != (bpf_get_current_pid_tgid() >> 32))
        return 0;  /* older kernels say nothing of the group: the leader's exit stands for it */
#endif
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct newborn_t *nb = newborn.lookup(&tgid);
    if (nb)
        nb->exited = 1;
    if (nb || follow.lookup(&tgid)) {
        targets.delete(&tgid);
        follow.delete(&tgid);
    }
    return 0;
}

/* A child that execs may run another image than the one whose uprobes reach it: user space looks again. An exited
   child's entry is left alone: its pid may already be another process's. */
TRACEPOINT_PROBE(sched, sched_process_exec) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct newborn_t *nb = newborn.lookup(&tgid);
    if (nb && !nb->exited)
        __sync_fetch_and_add(&nb->execs, 1);
    return 0;
}
"""


@dataclass(frozen=True)
class GcPauseConfig:
    max_targets: int = 64
    max_threads: int = 4096

    def __post_init__(self) -> None:
        for name in ("max_targets", "max_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"GcPauseConfig.{name} must be a positive int, got {value!r}")


TRACEPOINTS = ("task:task_newtask", "sched:sched_process_exit", "sched:sched_process_exec")
# Values of the `targets` map: which uprobes count the process.
PER_PROCESS, SHARED = 1, 2


def render(config: GcPauseConfig, group_dead: bool | None = None) -> str:
    """The program's C text; `group_dead`: whether sched_process_exit says when a process's last thread exits
    (Linux 6.16's field), else found in tracefs."""
    if group_dead is None:
        group_dead = _exit_has_group_dead()
    defines = [f"#define MAX_TARGETS {config.max_targets}", f"#define MAX_THREADS {config.max_threads}",
               f"#define PER_PROCESS {PER_PROCESS}", f"#define SHARED {SHARED}"]
    if group_dead:
        defines.append("#define HAS_GROUP_DEAD 1")
    return ("\n".join(defines) + "\n" + c_helpers.failures(2) + c_helpers.log2_slot() + BPF_TEXT)


def _exit_has_group_dead() -> bool:
    root = tracefs_root()
    if root is None:
        return False
    try:
        return "group_dead" in (root / "events" / "sched" / "sched_process_exit" / "format").read_text()
    except OSError:
        return False


@dataclass
class _Attachment:
    """How one target is traced: what detach() must undo."""

    # Its CPython image; None for a child the kernel placed (it runs its parent's image until it execs).
    image: PythonImage | None
    method: str                 # "usdt" | "uprobe"
    # Uprobes bound to this process, as (event name, perf event fd); none while its image's shared ones count it.
    # They are attached at the file offsets probes.libpython found, through libbcc's bpf_attach_uprobe: the
    # kernel resolves the path to an inode without opening it, and bcc's own symbol lookup, which opens and
    # parses the file the target controls (a FIFO put there blocks it), is never asked.
    events: list[tuple[bytes, int]]
    # The process attached to: its exit takes the tgid out of the filter at once (ExitWatcher). None for a child
    # the kernel placed that exited before user space saw it: only its counts remain.
    handle: ProcessHandle | None
    # The image whose system-wide uprobes count it (a followed family member), else None.
    shared: _ImageKey | None = None
    # Execs of a child placed by the kernel already looked at.
    execs: int = 0


_ImageKey = tuple[int, int]  # (st_dev, st_ino) of the image file


@dataclass
class _SharedImage:
    """One image's system-wide uprobes (pid -1): they fire in every process running that file, and the `targets`
    filter keeps the SHARED ones."""

    method: str
    events: list[tuple[bytes, int]]
    users: set[int] = field(default_factory=set)


class GcPauseProbe:
    name = "gc"

    def __init__(self, config: GcPauseConfig | None = None, proc_root: Path = Path("/proc"),
                 locate: Callable[[int, Path], PythonImage] = find_python_image) -> None:
        self.config = config or GcPauseConfig()
        self._proc = proc_root
        self._locate = locate
        self._bpf: Any = None
        self._attached: dict[int, _Attachment] = {}
        self._shared: dict[_ImageKey, _SharedImage] = {}
        # Per-pid uprobes of targets switched to shared ones, detached at the next read (see _sweep).
        self._retired: dict[int, list[tuple[bytes, int]]] = {}
        # Followed targets (a family's members), the children the kernel placed (child -> parent), and the exited
        # ones whose last reading went out at the previous read.
        self._family = Followed()
        # Followed targets left on their own uprobes because their image's shared ones failed, with the reason.
        self._follow_failed: dict[int, str] = {}
        # Targets asked for that cannot be traced, with the reason (shown in health).
        self.unsupported: dict[int, str] = {}
        self._parity = 0
        self._seen_totals: dict[int, tuple[int, int]] = {}
        self._seen_hist: dict[tuple[int, int], int] = {}
        self._state = "stopped"
        self._reason: str | None = None
        # Guards the `targets` map and `_attached` against the exit watcher's thread.
        self._lock = threading.Lock()
        self._watcher: ExitWatcher | None = None

    def start(self, targets: Iterable[int]) -> None:
        if self._bpf is not None:
            raise RuntimeError("gcpause probe already started; use set_targets() to change targets")
        wanted = [int(t) for t in targets]
        try:
            require_tracepoints(TRACEPOINTS)
            self._bpf = load_bpf(render(self.config))
        except ProbeUnavailable as exc:
            self._state, self._reason = "failed", str(exc)
            raise
        self._state = "running"
        self._watcher = ExitWatcher(self._exited, name="gc-exits")
        try:
            self.set_targets(wanted)
        except Unsupported as exc:
            if wanted and not self._attached:
                self.stop()
                self._state, self._reason = "unsupported", str(exc)
            raise

    def set_targets(self, targets: Iterable[int]) -> None:
        """Attach to new targets, detach from dropped ones; raises Unsupported naming every new
        target that cannot be traced, after attaching all the others."""
        asked = {int(t) for t in targets}
        if self._bpf is None:
            raise RuntimeError("gcpause probe is not running; call start() first")
        kept = sorted(asked & set(self._attached))[: self.config.max_targets]
        wanted = set(kept + sorted(asked - set(kept))[: self.config.max_targets - len(kept)])
        for tgid in set(self._attached) - wanted:
            self._detach(tgid)
        self.unsupported = {t: r for t, r in self.unsupported.items() if t in wanted}
        self.unsupported.update({t: f"gc traces at most {self.config.max_targets} targets (max_targets)"
                                 for t in asked - wanted})
        failures = []
        unexpected: Exception | None = None
        for tgid in sorted(wanted - set(self._attached) - set(self.unsupported)):
            try:
                self._attach(tgid)
            except (Unsupported, AccessDenied) as exc:
                self.unsupported[tgid] = str(exc)
                failures.append(str(exc))
            except TargetGone:
                continue  # exited before we got to it: nothing to trace, not an error
            except Exception as exc:  # a bug one target's files reach: it costs that target, raised below
                kind = type(exc)
                name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
                self.unsupported[tgid] = f"attaching failed unexpectedly: {name}: {exc}"
                unexpected = unexpected or exc
        self._update_reason()
        if unexpected is not None:
            raise unexpected
        if failures:
            raise Unsupported("; ".join(failures))

    def set_followed(self, tgids: Iterable[int]) -> None:
        """The targets whose new child processes the kernel makes targets the moment they are forked (a family's
        members). A followed target is counted by its image's system-wide uprobes, which also fire in its forks;
        a target no longer followed goes back to uprobes of its own."""
        if self._bpf is None:
            raise RuntimeError("gcpause probe is not running; call start() first")
        self._family.tgids = {int(t) for t in tgids}
        for tgid in sorted(self._family.tgids & set(self._attached)):
            if self._attached[tgid].shared is None:
                self._share(tgid)
        for tgid, attachment in list(self._attached.items()):
            if (attachment.shared is not None and attachment.image is not None and tgid not in self._family.tgids
                    and tgid not in self._family.parents):
                self._unshare(tgid)
        self._follow_failed = {t: r for t, r in self._follow_failed.items() if t in self._family.tgids}
        self._sync_follow()
        self._update_reason()

    def children(self) -> dict[int, int]:
        """Child tgid -> parent tgid of the followed children among the current targets."""
        return dict(self._family.parents)

    def read(self) -> dict[int, GcReading]:
        if self._bpf is None:
            raise RuntimeError("gcpause probe is not running; call start() first")
        closing, self._parity = self._parity, self._parity ^ 1
        window = self._bpf[b"window"]
        window[window.Key(0)] = window.Leaf(self._parity)
        self._sweep()
        self._adopt()
        # By the pidfd (or the kernel's exit flag), not /proc/PID: after an exit the pid may already name another
        # process. A family member's last counts go out once; any other target's are dropped with it.
        gone = [t for t, a in self._attached.items() if a.handle is None or not a.handle.alive()]
        for tgid in self._family.to_drop(gone):
            self._detach(tgid)
        readings = {tgid: GcReading() for tgid in self._attached if tgid not in self.unsupported}
        for key, value in self._bpf[b"totals"].items():
            tgid = key.value
            count, total = self._seen_totals.get(tgid, (0, 0))
            self._seen_totals[tgid] = (value.count, value.total_ns)
            if tgid in readings:
                readings[tgid].collections = value.count - count
                readings[tgid].pause_seconds = (value.total_ns - total) / 1e9
        maxima = self._bpf[b"maxima"]
        for key, value in list(maxima.items()):
            if key.parity != closing:
                continue
            if key.tgid in readings:
                readings[key.tgid].max_pause_seconds = value.value / 1e9
            # Reset for this parity's next turn; a return that read the old parity just before
            # the flip may still write it, which then shows in that later window.
            del maxima[key]
        slots: dict[int, dict[int, int]] = {}
        for key, value in self._bpf[b"hist"].items():
            seen = self._seen_hist.get((key.tgid, key.slot), 0)
            self._seen_hist[(key.tgid, key.slot)] = value.value
            if key.tgid in readings and value.value > seen:
                slots.setdefault(key.tgid, {})[key.slot] = value.value - seen
        for tgid, by_slot in slots.items():
            readings[tgid].histogram = Log2Histogram.from_slots(by_slot, unit="us")
        return readings

    def host(self) -> None:
        return None

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.close()  # first: no exit callback runs while the maps go away
            self._watcher = None
        if self._bpf is not None:
            for tgid in list(self._attached):
                self._detach(tgid)
            for shared in self._shared.values():
                shared.users.clear()
            self._sweep()
            self._bpf.cleanup()
            self._bpf = None
        self._attached.clear()
        self._shared.clear()
        self._family = Followed()
        if self._state == "running":
            self._state, self._reason = "stopped", None

    def health(self) -> Health:
        lost = 0
        if self._bpf is not None:
            lost = sum(v.value for v in self._bpf[b"failures"].values())
        health = Health(name=self.name, state=self._state, reason=self._reason,
                        targets=len(self._attached), lost_events=lost, failed_stacks=0,
                        unsupported=dict(self.unsupported))
        if self._bpf is not None:
            health.detail["followed_children_missed"] = int(self._bpf[b"follow_missed"][0].value)
            health.detail["shared_images"] = len(self._shared)
        return health

    def method(self, tgid: int) -> str | None:
        """"usdt" or "uprobe": how a target is traced; None when it is not."""
        attachment = self._attached.get(tgid)
        return attachment.method if attachment else None

    def shared(self, tgid: int) -> bool:
        """Whether a target is counted by its image's system-wide uprobes (followed) rather than its own."""
        attachment = self._attached.get(tgid)
        return attachment is not None and attachment.shared is not None

    def _update_reason(self) -> None:
        reasons = [f"unsupported: {r}" for r in self.unsupported.values()]
        reasons += [f"pid {t} is not followed: {r}" for t, r in self._follow_failed.items()]
        self._reason = "; ".join(reasons) or None

    def _attach(self, tgid: int) -> None:
        # Held before anything is read or attached by pid: alive afterwards means it all went to this process.
        handle = ProcessHandle.open(tgid, proc_root=self._proc)
        try:
            self._attach_held(tgid, handle)
        except BaseException:
            handle.close()
            raise

    def _attach_held(self, tgid: int, handle: ProcessHandle) -> None:
        image = self._locate(tgid, self._proc)
        targets = self._bpf[b"targets"]
        with self._lock:
            targets[targets.Key(tgid)] = targets.Leaf(PER_PROCESS)
        events: list[tuple[bytes, int]] = []
        try:
            method = self._attach_image(image, image.pid, events)
            if not handle.alive():
                raise TargetGone(f"process {tgid} exited while attaching")
        except Exception as exc:  # bcc raises bare Exception when an attach fails
            _detach_events(events)
            with self._lock:
                del targets[targets.Key(tgid)]
            if isinstance(exc, TargetGone):
                raise
            if not handle.alive():
                raise TargetGone(f"process {tgid} exited while attaching") from exc
            raise Unsupported(f"pid {tgid}: attaching to {image.path} failed: {exc}") from exc
        with self._lock:
            self._attached[tgid] = _Attachment(image=image, method=method, events=events, handle=handle)
        assert self._watcher is not None
        self._watcher.watch(handle)

    def _attach_image(self, image: PythonImage, pid: int, events: list[tuple[bytes, int]]) -> str:
        """Uprobes on `image` bound to `pid` (-1: every process running the file); returns the method."""
        if image.has_gc_usdt:
            self._attach_usdt(image, pid, events)
            return "usdt"
        self._attach_uprobes(image, pid, events)
        return "uprobe"

    def _share(self, tgid: int) -> None:
        """Move a target onto its image's system-wide uprobes (attached first, when no target uses them yet).
        Both sets fire in it until the next read: the `targets` mode, switched in one map update, says which set
        records a collection's entry, and the return of the set that recorded it counts it, so a collection running
        across the switch is counted once, by the uprobes it entered through (kept attached until then)."""
        attachment = self._attached[tgid]
        assert attachment.image is not None and attachment.handle is not None
        try:
            key = _image_key(attachment.image)
            shared = self._shared.get(key) or self._attach_shared(attachment.image, key)
        except (OSError, Unsupported) as exc:
            self._follow_failed[tgid] = str(exc)
            return
        with self._lock:
            targets = self._bpf[b"targets"]
            if attachment.handle.alive():
                targets[targets.Key(tgid)] = targets.Leaf(SHARED)
            attachment.shared = key
        shared.users.add(tgid)
        self._retired[tgid], attachment.events = attachment.events, []

    def _unshare(self, tgid: int) -> None:
        """Back onto uprobes of its own (those retired at the switch to shared, while still attached): attached
        first, then the mode switched, then the shared ones let go (at the next read, when no target uses them)."""
        attachment = self._attached[tgid]
        assert attachment.image is not None and attachment.handle is not None
        if not attachment.handle.alive():
            return  # exited: dropped at the next read; its pid is no longer its to attach by
        events = self._retired.pop(tgid, [])
        try:
            if not events:
                self._attach_image(attachment.image, tgid, events)
            if not attachment.handle.alive():
                raise TargetGone(f"process {tgid} exited while attaching")
        except Exception as exc:  # bcc raises bare Exception when an attach fails
            _detach_events(events)
            if not isinstance(exc, TargetGone):
                self.unsupported[tgid] = f"pid {tgid}: attaching to {attachment.image.path} failed: {exc}"
            return
        with self._lock:
            targets = self._bpf[b"targets"]
            if attachment.handle.alive():
                targets[targets.Key(tgid)] = targets.Leaf(PER_PROCESS)
            attachment.events = events
        self._release_shared(tgid)

    def _attach_shared(self, image: PythonImage, key: _ImageKey) -> _SharedImage:
        events: list[tuple[bytes, int]] = []
        try:
            method = self._attach_image(image, -1, events)
        except Unsupported:
            raise
        except Exception as exc:  # bcc raises bare Exception when an attach fails
            _detach_events(events)
            raise Unsupported(f"system-wide uprobes on {image.path} failed: {exc}") from exc
        shared = _SharedImage(method=method, events=events)
        self._shared[key] = shared
        return shared

    def _release_shared(self, tgid: int) -> None:
        attachment = self._attached.get(tgid)
        if attachment is None or attachment.shared is None:
            return
        key, attachment.shared = attachment.shared, None
        shared = self._shared.get(key)
        if shared is None:
            return
        shared.users.discard(tgid)

    def _sweep(self) -> None:
        """Detach the uprobes a switch left attached: retired per-pid ones, and shared sets no target uses any more.
        Kept until now so that a collection running across the switch returns through the uprobes it entered by."""
        for events in self._retired.values():
            _detach_events(events)
        self._retired.clear()
        for key in [k for k, shared in self._shared.items() if not shared.users]:
            _detach_events(self._shared.pop(key).events)

    def _sync_follow(self) -> None:
        """The kernel follows the forks of the followed targets it counts through shared uprobes, and of the
        children it placed that are alive (an exited one's pid may name another process)."""
        follow = self._bpf[b"follow"]
        wanted = {t for t, a in self._attached.items() if a.shared is not None and a.handle is not None
                  and a.handle.alive() and (t in self._family.tgids or t in self._family.parents)}
        with self._lock:
            kernel = {int(k.value) for k in follow.keys()}
            for tgid in kernel - wanted:
                try:
                    del follow[follow.Key(tgid)]
                except KeyError:
                    pass  # the kernel took it out at the exit
            for tgid in wanted - kernel:
                follow[follow.Key(tgid)] = follow.Leaf(1)

    def _adopt(self) -> None:
        """Children the kernel placed since the last read become targets, counted by their parent's image's shared
        uprobes. A child the kernel shows exited gets no pidfd (its pid may already be another process's): its
        counts are reported once, then it is dropped. A child that exec'd is looked at again."""
        newborn = self._bpf[b"newborn"]
        pending = []
        for key, nb in newborn.items():
            child = int(key.value)
            if child not in self._attached:
                pending.append((key, nb))
            elif (attachment := self._attached[child]).image is None and nb.execs != attachment.execs:
                self._after_exec(child, attachment, bool(nb.exited), int(nb.execs))
        # Parents first: a child may have forked its own before either was adopted.
        while placed := [(k, nb) for k, nb in pending if int(nb.parent) in self._attached]:
            for key, nb in placed:
                self._adopt_one(newborn, key, nb)
            pending = [(k, nb) for k, nb in pending if int(k.value) not in self._attached]
        for key, _ in pending:
            self._forget_child(int(key.value))  # its parent was dropped since the fork
        self._sync_follow()

    def _adopt_one(self, newborn: Any, key: Any, nb: Any) -> None:
        """One placed child, its parent already a target, becomes a target (see _adopt)."""
        child, parent = int(key.value), int(nb.parent)
        handle = None
        if not nb.exited:
            try:
                handle = ProcessHandle.open(child, proc_root=self._proc)
            except TargetGone:
                handle = None
            # The kernel flags the exit before the pid can be reused: alive after the open, the pidfd is its.
            if handle is not None and newborn[key].exited:
                handle.close()
                handle = None
        parent_attachment = self._attached[parent]
        attachment = _Attachment(image=None, method=parent_attachment.method, events=[], handle=handle,
                                 shared=parent_attachment.shared)
        with self._lock:
            self._attached[child] = attachment
        self._family.parents[child] = parent
        if attachment.shared is not None and attachment.shared in self._shared:
            self._shared[attachment.shared].users.add(child)
        if handle is not None:
            assert self._watcher is not None
            self._watcher.watch(handle)
        if nb.execs:
            self._after_exec(child, attachment, bool(nb.exited), int(nb.execs))

    def _after_exec(self, child: int, attachment: _Attachment, exited: bool, execs: int) -> None:
        """A placed child exec'd: counted on if it runs an image with shared uprobes (its own attached when needed);
        otherwise, or when it ended before we could look, null with the reason rather than a partial count."""
        attachment.execs = execs
        if exited or attachment.handle is None or not attachment.handle.alive():
            self.unsupported[child] = (f"pid {child} exec'd another program and ended before gc looked at it: its "
                                       f"collections after the exec are not known")
            return
        try:
            image = self._locate(child, self._proc)
            key = _image_key(image)
            shared = self._shared.get(key) or self._attach_shared(image, key)
            if not attachment.handle.alive():
                raise TargetGone(f"process {child} exited while attaching")
        except TargetGone:
            self.unsupported[child] = (f"pid {child} exec'd another program and ended before gc looked at it: its "
                                       f"collections after the exec are not known")
            return
        except (Unsupported, AccessDenied, OSError) as exc:
            self.unsupported[child] = f"pid {child} exec'd a program gc cannot trace: {exc}"
            return
        self.unsupported.pop(child, None)
        if attachment.shared != key:
            self._release_shared(child)
            attachment.shared = key
            shared.users.add(child)

    def _forget_child(self, child: int) -> None:
        """A placed child that is not ours to report: out of the kernel's maps (its filter entry too, unless it is
        a target attached in its own right)."""
        names = (b"newborn",) if child in self._attached else (b"newborn", b"targets", b"follow")
        with self._lock:
            for name in names:
                table = self._bpf[name]
                try:
                    del table[table.Key(child)]
                except KeyError:
                    pass  # the kernel took it out at the exit

    def _exited(self, handle: ProcessHandle) -> None:
        """The exit watcher's callback (its thread): the tgid leaves the in-kernel filter now, not at the next
        read; the next read() detaches the probes and drops what was counted for it (or, for a family member,
        reports its last counts first)."""
        with self._lock:
            attachment = self._attached.get(handle.pid)
            if self._bpf is None or attachment is None or attachment.handle is not handle:
                return  # detached (and maybe attached again) since: not ours any more
            for name in (b"targets", b"follow"):
                table = self._bpf[name]
                key = table.Key(handle.pid)
                if key in table:
                    del table[key]

    def _attach_usdt(self, image: PythonImage, pid: int, events: list[tuple[bytes, int]]) -> None:
        """Plain uprobes at the probe sites, with the kernel raising each site's semaphore.

        Not bcc.USDT: that compiles argument readers into the program (a reload per target),
        and its per-pid context closes a file descriptor twice (it closed our perf event fd here).
        """
        bcc = import_bcc()
        attach = _attach_uprobe_with_ref_ctr(bcc)
        suffix = b"_shared" if pid < 0 else b""
        functions = {"gc__start": b"gc_start" + suffix, "gc__done": b"gc_done" + suffix}
        for probe in image.usdt_probes:
            fn = self._bpf.load_func(functions[probe.name], bcc.BPF.KPROBE)
            event = f"infersight_gc_{_owner(image, pid)}_{probe.pc_offset:x}".encode()
            fd = _open_uprobe(attach, fn.fd, _UPROBE_ENTRY, event, image, pid, probe.pc_offset,
                              probe.semaphore_offset, f"USDT {USDT_PROVIDER}:{probe.name}")
            events.append((event, fd))

    def _attach_uprobes(self, image: PythonImage, pid: int, events: list[tuple[bytes, int]]) -> None:
        bcc = import_bcc()
        attach = _attach_uprobe_with_ref_ctr(bcc)
        suffix = b"_shared" if pid < 0 else b""
        entry, done = (self._bpf.load_func(fn + suffix, bcc.BPF.KPROBE) for fn in (b"gc_start", b"gc_done"))
        for sym, offset in zip(image.gc_symbols, image.gc_offsets, strict=True):
            for kind, fn, tag in ((_UPROBE_ENTRY, entry, "start"), (_UPROBE_RETURN, done, "done")):
                event = f"infersight_gc_{_owner(image, pid)}_{offset:x}_{tag}".encode()
                events.append((event, _open_uprobe(attach, fn.fd, kind, event, image, pid, offset, 0, sym)))

    def _detach(self, tgid: int) -> None:
        with self._lock:
            attachment = self._attached.pop(tgid)
            for name in (b"targets", b"follow", b"newborn"):
                table = self._bpf[name]
                if table.Key(tgid) in table:
                    del table[table.Key(tgid)]
        self._family.parents.pop(tgid, None)
        if attachment.image is None:
            self.unsupported.pop(tgid, None)  # a placed child's reason (an exec) goes with it
        if attachment.handle is not None:
            if self._watcher is not None:
                self._watcher.unwatch(attachment.handle)
            attachment.handle.close()
        _detach_events(attachment.events)
        _detach_events(self._retired.pop(tgid, []))
        if attachment.shared is not None and (shared := self._shared.get(attachment.shared)) is not None:
            shared.users.discard(tgid)  # detached at the next read when no target uses it any more
        self._seen_totals.pop(tgid, None)
        self._seen_hist = {k: v for k, v in self._seen_hist.items() if k[0] != tgid}
        for name in (b"totals", b"hist", b"maxima"):
            table = self._bpf[name]
            for key in [k for k in table if (k.value if name == b"totals" else k.tgid) == tgid]:
                del table[key]


def _image_key(image: PythonImage) -> _ImageKey:
    """The image file's identity, through the path the uprobes are placed by (the exact file mapped)."""
    st = os.stat(image.host_path)
    return st.st_dev, st.st_ino


def _owner(image: PythonImage, pid: int) -> str:
    """The event name's owner part: the pid, or the file's inode for system-wide uprobes."""
    return str(pid) if pid >= 0 else f"all_{_image_key(image)[1]}"


# libbcc's bpf_probe_attach_type.
_UPROBE_ENTRY, _UPROBE_RETURN = 0, 1


def _attach_uprobe_with_ref_ctr(bcc: Any) -> Callable[..., int]:
    """libbcc's bpf_attach_uprobe with its last argument, ref_ctr_offset, which bcc's Python
    binding leaves out: the kernel then raises the USDT semaphore in the target (Linux >= 4.20).
    Left out, libbcc reads whatever the stack holds there (6, here), and the kernel refuses any
    other uprobe at the same place whose ref_ctr_offset differs ("ref_ctr_offset mismatch")."""
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                             ctypes.c_ulonglong, ctypes.c_int, ctypes.c_uint32, use_errno=True)
    return proto(("bpf_attach_uprobe", bcc.libbcc.lib))


def _open_uprobe(attach: Callable[..., int], fn_fd: int, kind: int, event: bytes, image: PythonImage, pid: int,
                 offset: int, ref_ctr_offset: int, site: str) -> int:
    """One uprobe's perf event fd, bound to `pid` (-1: every process); Unsupported naming the site when the kernel
    refuses it."""
    fd = attach(fn_fd, kind, event, str(image.host_path).encode(), offset, pid, ref_ctr_offset)
    if fd < 0:
        err = ctypes.get_errno()
        # libbcc's fallback through tracefs leaves the event it wrote there when the attach fails.
        _detach_events([(event, -1)])
        why = os.strerror(err) if err else f"error {fd}"
        if err == errno.EINVAL:
            why += " (another tracer may hold a uprobe there with another ref_ctr_offset: see dmesg)"
        raise Unsupported(f"pid {image.pid}: uprobe at {site} ({image.path}+{offset:#x}) failed: {why}")
    return fd


def _detach_events(events: list[tuple[bytes, int]]) -> None:
    from bcc.libbcc import lib

    for event, fd in events:
        if fd >= 0:
            lib.bpf_close_perf_event_fd(fd)
        lib.bpf_detach_uprobe(event)
    events.clear()

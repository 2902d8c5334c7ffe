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

Overhead: a uprobe costs a trap (~1-3 us here) per hit and collections are rare (about one per
700 net allocations of container objects in generation 0), so it is small next to the pause.

Caveats: the pause is the collector's own time; gc.callbacks run outside it. Uprobes are placed
per target pid, so adding a target attaches the already loaded functions again (no recompile).
Collections run during interpreter shutdown are counted too (they call the same function).

Pid reuse: each target is held by a pidfd from just before its attach. The kernel binds each uprobe's
perf event to the task the pid named at attach time (it fires only in that task's mm), and the caller
(agent.collectors) checks the target is still the discovered process before and after the attach. The
moment the pidfd reports the exit, a watcher thread takes the tgid out of the `targets` filter; the next
read() detaches it and reports nothing for it, even when the pid already names another process.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.errors import AccessDenied, ProbeUnavailable, TargetGone, Unsupported
from analysis.health import Health
from analysis.window import GcReading, Log2Histogram
from probes import c_helpers
from probes.base import import_bcc, load_bpf
from probes.libpython import USDT_PROVIDER, PythonImage, find_python_image
from probes.pidfd import ExitWatcher, ProcessHandle

BPF_TEXT = r"""
#include <uapi/linux/ptrace.h>

struct totals_t { u64 count; u64 total_ns; };
/* parity: the window's, flipped by user space at each read, so the closing window's maximum can
   be read and reset while the next one already records. All-u32 keys: no padding. */
struct max_key_t { u32 tgid; u32 parity; };
struct hist_key_t { u32 tgid; u32 slot; };

BPF_HASH(targets, u32, u8, MAX_TARGETS);
BPF_HASH(start, u32, u64, MAX_THREADS);
BPF_HASH(totals, u32, struct totals_t, MAX_TARGETS);
BPF_HASH(maxima, struct max_key_t, u64, MAX_TARGETS * 2);
BPF_HASH(hist, struct hist_key_t, u64, MAX_TARGETS * 64);
BPF_ARRAY(window, u64, 1);
/* 0: a return without a recorded entry (attached mid-collection), 1: a map was full */
/* (the `failures` array of 2: probes/c_helpers.py) */

int gc_start(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!targets.lookup(&tgid))
        return 0;
    u32 tid = id;
    u64 now = bpf_ktime_get_ns();
    if (start.update(&tid, &now))
        count_failure(1);
    return 0;
}

int gc_done(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!targets.lookup(&tgid))
        return 0;
    u32 tid = id;
    u64 *begin = start.lookup(&tid);
    if (!begin) {
        count_failure(0);
        return 0;
    }
    u64 pause = bpf_ktime_get_ns() - *begin;
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


def render(config: GcPauseConfig) -> str:
    defines = [f"#define MAX_TARGETS {config.max_targets}", f"#define MAX_THREADS {config.max_threads}"]
    return ("\n".join(defines) + "\n" + c_helpers.failures(2) + c_helpers.log2_slot() + BPF_TEXT)


@dataclass
class _Attachment:
    """How one target is traced: what detach() must undo."""

    image: PythonImage
    method: str                 # "usdt" | "uprobe"
    # Each uprobe as (event name, perf event fd). They are attached at the file offsets
    # probes.libpython found, through libbcc's bpf_attach_uprobe: the kernel resolves the path to an
    # inode without opening it, and bcc's own symbol lookup, which opens and parses the file the
    # target controls (a FIFO put there blocks it), is never asked.
    events: list[tuple[bytes, int]]
    # The process attached to: its exit takes the tgid out of the filter at once (ExitWatcher).
    handle: ProcessHandle


class GcPauseProbe:
    name = "gc"

    def __init__(self, config: GcPauseConfig | None = None, proc_root: Path = Path("/proc"),
                 locate: Callable[[int, Path], PythonImage] = find_python_image) -> None:
        self.config = config or GcPauseConfig()
        self._proc = proc_root
        self._locate = locate
        self._bpf: Any = None
        self._attached: dict[int, _Attachment] = {}
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
        self._reason = "; ".join(f"unsupported: {r}" for r in self.unsupported.values()) or None
        if unexpected is not None:
            raise unexpected
        if failures:
            raise Unsupported("; ".join(failures))

    def read(self) -> dict[int, GcReading]:
        if self._bpf is None:
            raise RuntimeError("gcpause probe is not running; call start() first")
        closing, self._parity = self._parity, self._parity ^ 1
        window = self._bpf[b"window"]
        window[window.Key(0)] = window.Leaf(self._parity)
        # By the pidfd, not /proc/PID: after an exit the pid may already name another process.
        for tgid in [t for t, a in self._attached.items() if not a.handle.alive()]:
            self._detach(tgid)
        readings = {tgid: GcReading() for tgid in self._attached}
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
            self._bpf.cleanup()
            self._bpf = None
        self._attached.clear()
        if self._state == "running":
            self._state, self._reason = "stopped", None

    def health(self) -> Health:
        lost = 0
        if self._bpf is not None:
            lost = sum(v.value for v in self._bpf[b"failures"].values())
        return Health(name=self.name, state=self._state, reason=self._reason,
                           targets=len(self._attached), lost_events=lost, failed_stacks=0,
                           unsupported=dict(self.unsupported))

    def method(self, tgid: int) -> str | None:
        """"usdt" or "uprobe": how a target is traced; None when it is not."""
        attachment = self._attached.get(tgid)
        return attachment.method if attachment else None

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
            targets[targets.Key(tgid)] = targets.Leaf(1)
        events: list[tuple[bytes, int]] = []
        try:
            if image.has_gc_usdt:
                method = "usdt"
                self._attach_usdt(image, events)
            else:
                method = "uprobe"
                self._attach_uprobes(image, events)
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

    def _exited(self, handle: ProcessHandle) -> None:
        """The exit watcher's callback (its thread): the tgid leaves the in-kernel filter now, not at the next
        read; the next read() detaches the probes and drops what was counted for it."""
        with self._lock:
            attachment = self._attached.get(handle.pid)
            if self._bpf is None or attachment is None or attachment.handle is not handle:
                return  # detached (and maybe attached again) since: not ours any more
            targets = self._bpf[b"targets"]
            key = targets.Key(handle.pid)
            if key in targets:
                del targets[key]

    def _attach_usdt(self, image: PythonImage, events: list[tuple[bytes, int]]) -> None:
        """Plain uprobes at the probe sites, with the kernel raising each site's semaphore.

        Not bcc.USDT: that compiles argument readers into the program (a reload per target),
        and its per-pid context closes a file descriptor twice (it closed our perf event fd here).
        """
        bcc = import_bcc()
        attach = _attach_uprobe_with_ref_ctr(bcc)
        functions = {"gc__start": b"gc_start", "gc__done": b"gc_done"}
        for probe in image.usdt_probes:
            fn = self._bpf.load_func(functions[probe.name], bcc.BPF.KPROBE)
            event = f"infersight_gc_{image.pid}_{probe.pc_offset:x}".encode()
            fd = _open_uprobe(attach, fn.fd, _UPROBE_ENTRY, event, image, probe.pc_offset, probe.semaphore_offset,
                              f"USDT {USDT_PROVIDER}:{probe.name}")
            events.append((event, fd))

    def _attach_uprobes(self, image: PythonImage, events: list[tuple[bytes, int]]) -> None:
        bcc = import_bcc()
        attach = _attach_uprobe_with_ref_ctr(bcc)
        entry, done = (self._bpf.load_func(fn, bcc.BPF.KPROBE) for fn in (b"gc_start", b"gc_done"))
        for sym, offset in zip(image.gc_symbols, image.gc_offsets, strict=True):
            for kind, fn, tag in ((_UPROBE_ENTRY, entry, "start"), (_UPROBE_RETURN, done, "done")):
                event = f"infersight_gc_{image.pid}_{offset:x}_{tag}".encode()
                events.append((event, _open_uprobe(attach, fn.fd, kind, event, image, offset, 0, sym)))

    def _detach(self, tgid: int) -> None:
        with self._lock:
            attachment = self._attached.pop(tgid)
            targets = self._bpf[b"targets"]
            if targets.Key(tgid) in targets:
                del targets[targets.Key(tgid)]
        if self._watcher is not None:
            self._watcher.unwatch(attachment.handle)
        attachment.handle.close()
        _detach_events(attachment.events)
        self._seen_totals.pop(tgid, None)
        self._seen_hist = {k: v for k, v in self._seen_hist.items() if k[0] != tgid}
        for name in (b"totals", b"hist", b"maxima"):
            table = self._bpf[name]
            for key in [k for k in table if (k.value if name == b"totals" else k.tgid) == tgid]:
                del table[key]


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


def _open_uprobe(attach: Callable[..., int], fn_fd: int, kind: int, event: bytes, image: PythonImage, offset: int,
                 ref_ctr_offset: int, site: str) -> int:
    """One uprobe's perf event fd; Unsupported naming the site when the kernel refuses it."""
    fd = attach(fn_fd, kind, event, str(image.host_path).encode(), offset, image.pid, ref_ctr_offset)
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

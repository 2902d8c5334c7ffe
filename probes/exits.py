"""How a target process ended: killed by which signal from whom, its exit status, or the OOM killer.

Traces: tracepoints ``signal:signal_generate``, ``signal:signal_deliver``, ``syscalls:sys_enter_exit_group``,
``sched:sched_process_exit`` and, where the kernel has it, ``oom:mark_victim``.

How: the agent learns that a target is gone when its pid leaves /proc, after its parent reaped it; by then the
exit status is gone too (only the parent gets it from wait()). So the kernel keeps, per target tgid, the last
terminating signal sent to it and by whom (``signal_generate``, in the sender's context), the first signal
delivered to it whose handler is the default and whose default ends the process (``signal_deliver``, in the
victim's context: its ``sa_handler`` argument says SIG_DFL), the code it passed to ``exit_group`` and whether
the OOM killer chose it; ``sched_process_exit`` with ``group_dead`` marks the moment the whole process died.
No kernel struct is read: tracepoint arguments and helper results only (a task's ``exit_code`` would need one).

Overhead: every signal, process exit and exit_group on the host runs a hash lookup of its tgid; these are rare
events (thousands a second at most), unlike syscalls or context switches, so the cost is not measurable beside
the other probes. Nothing is read per window: the loop asks for one record when a target's process is gone.

Caveats: a process that dies of a signal it had a handler for (a Python server's SIGINT -> KeyboardInterrupt,
then exit(1)) reads as its exit status, which is what happened. A signal sent to one thread by tgkill() names
that thread's id, not the process's: its sender is not recorded, the delivery still is. ``exit()`` of the last
thread without exit_group (rare outside raw clone users) leaves the status unknown.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from analysis.errors import ProbeUnavailable
from analysis.health import Health
from probes.base import load_bpf, require_tracepoints, tracefs_root

TRACEPOINTS = ("signal:signal_generate", "signal:signal_deliver", "syscalls:sys_enter_exit_group",
               "sched:sched_process_exit")
OOM_TRACEPOINT = "oom:mark_victim"

# Signals whose default action ends the process (signal(7): Term and Core).
FATAL_BY_DEFAULT = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP, signal.SIGABRT,
                    signal.SIGBUS, signal.SIGFPE, signal.SIGKILL, signal.SIGUSR1, signal.SIGSEGV, signal.SIGUSR2,
                    signal.SIGPIPE, signal.SIGALRM, signal.SIGTERM, signal.SIGSTKFLT, signal.SIGXCPU,
                    signal.SIGXFSZ, signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO, signal.SIGPWR, signal.SIGSYS)

BPF_TEXT = r"""
#define TRACE_SIGNAL_DELIVERED 0

struct exit_t {
    u64 sent_ns;        /* when the last terminating signal was sent to it */
    u64 died_ns;        /* sched_process_exit with group_dead */
    s64 status;         /* exit_group()'s code */
    u32 has_status;
    s32 sent_sig;       /* the last terminating signal sent to it, 0 if none */
    s32 sent_code;      /* its si_code: > 0 when the kernel made it (a fault, the OOM killer), <= 0 from a process */
    u32 sender_tgid;    /* who sent it: the current task at signal_generate */
    s32 fatal_sig;      /* the first signal delivered with its default, fatal action */
    u32 oom;            /* chosen by the OOM killer */
    u32 dead;
    char sender_comm[16];
};

BPF_HASH(targets, u32, u8, MAX_TARGETS);
/* Records outlive their target's place in `targets`: the agent reads one after the process is gone. */
BPF_TABLE("lru_hash", u32, struct exit_t, exits, MAX_RECORDS);

static inline int fatal_by_default(int sig)
{
    return (FATAL_MASK >> sig) & 1;
}

static inline struct exit_t *record(u32 tgid)
{
    struct exit_t *e = exits.lookup(&tgid);
    if (e)
        return e;
    struct exit_t zero = {};
    exits.update(&tgid, &zero);
    return exits.lookup(&tgid);
}

TRACEPOINT_PROBE(signal, signal_generate)
{
    u32 tgid = args->pid;
    if (args->result != TRACE_SIGNAL_DELIVERED || args->sig <= 0 || args->sig >= 64 || !fatal_by_default(args->sig))
        return 0;
    if (!targets.lookup(&tgid))
        return 0;
    struct exit_t *e = record(tgid);
    if (!e)
        return 0;
    e->sent_sig = args->sig;
    e->sent_code = args->code;
    e->sent_ns = bpf_ktime_get_ns();
    e->sender_tgid = bpf_get_current_pid_tgid() >> 32;
    bpf_get_current_comm(&e->sender_comm, sizeof(e->sender_comm));
    return 0;
}

TRACEPOINT_PROBE(signal, signal_deliver)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (args->sig <= 0 || args->sig >= 64 || args->sa_handler != 0 || !fatal_by_default(args->sig))
        return 0;
    if (!targets.lookup(&tgid))
        return 0;
    struct exit_t *e = record(tgid);
    if (e && !e->fatal_sig)
        e->fatal_sig = args->sig;  /* the first one: a group exit then delivers SIGKILL to every other thread */
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_exit_group)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!targets.lookup(&tgid))
        return 0;
    struct exit_t *e = record(tgid);
    if (e) {
        e->status = args->error_code;
        e->has_status = 1;
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!args->group_dead || !targets.lookup(&tgid))
        return 0;
    struct exit_t *e = record(tgid);
    if (e) {
        e->dead = 1;
        e->died_ns = bpf_ktime_get_ns();
    }
    return 0;
}

#ifdef HAVE_OOM
TRACEPOINT_PROBE(oom, mark_victim)
{
    u32 tgid = args->pid;
    if (!targets.lookup(&tgid))
        return 0;
    struct exit_t *e = record(tgid);
    if (e)
        e->oom = 1;
    return 0;
}
#endif
"""


@dataclass(frozen=True)
class ExitsConfig:
    max_targets: int = 1024
    max_records: int = 4096
    oom: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.max_targets <= 65536:
            raise ValueError(f"max_targets must be within [1, 65536], got {self.max_targets!r}")
        if not 1 <= self.max_records <= 65536:
            raise ValueError(f"max_records must be within [1, 65536], got {self.max_records!r}")


def render(config: ExitsConfig) -> str:
    """The C text for `config`: #defines first, then the program."""
    mask = sum(1 << int(s) for s in FATAL_BY_DEFAULT)
    defines = [f"#define MAX_TARGETS {config.max_targets}", f"#define MAX_RECORDS {config.max_records}",
               f"#define FATAL_MASK {mask}ULL"]
    if config.oom:
        defines.append("#define HAVE_OOM 1")
    return "\n".join(defines) + "\n" + BPF_TEXT


@dataclass(frozen=True)
class ProcessExit:
    """What the kernel saw of one process's end. `how`: killed | exited | unknown."""

    pid: int
    how: str
    signal: int | None = None
    status: int | None = None
    sender_pid: int | None = None  # 0: the kernel (a fault, the OOM killer); None: not seen
    sender_comm: str | None = None
    oom: bool = False

    def describe(self) -> str:
        """One line for the page, the alert and the log: "killed by SIGKILL (signal 9) from pid 77 (bash)"."""
        if self.how == "killed" and self.signal is not None:
            text = f"killed by {signal_name(self.signal)} (signal {self.signal})"
            if self.oom:
                return text + " from the kernel's OOM killer"
            if self.sender_pid == self.pid:
                return text + " sent by itself"
            if self.sender_pid == 0:
                return text + " from the kernel (a fault such as a bad memory access, or a kernel limit)"
            if self.sender_pid is not None:
                text += f" from pid {self.sender_pid} ({self.sender_comm or '?'})"
            return text
        if self.how == "exited" and self.status is not None:
            return f"exited with status {self.status}"
        return "exited; how was not seen (it ended before the exit probe watched it)"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def decode(pid: int, e: Any) -> ProcessExit:
    """A kernel record (the `exits` map's leaf) as a ProcessExit.

    A signal whose action is the default and fatal is turned into a group exit when it is sent (the kernel's
    complete_signal()), and every thread then dequeues SIGKILL: so a delivered SIGKILL after a terminating signal
    was sent means that signal killed it. A fatal delivery wins over exit_group()'s code (the signal ends the
    process whatever code a thread was about to pass)."""
    sig = int(e.fatal_sig)
    if sig == signal.SIGKILL and e.sent_sig:
        sig = int(e.sent_sig)
    if not sig and e.oom:
        sig = int(signal.SIGKILL)
    if sig:
        sent = int(e.sent_sig) == sig
        by_kernel = sent and int(e.sent_code) > 0  # si_code > 0: a fault or the kernel's own (SI_KERNEL)
        return ProcessExit(pid=pid, how="killed", signal=sig, oom=bool(e.oom),
                           sender_pid=(0 if by_kernel else int(e.sender_tgid)) if sent else None,
                           sender_comm=None if by_kernel or not sent else e.sender_comm.decode(errors="replace"))
    if e.has_status:
        # exit_group takes an int; only the low byte reaches the parent's wait() status.
        return ProcessExit(pid=pid, how="exited", status=int(e.status) & 0xFF)
    return ProcessExit(pid=pid, how="unknown")


class ExitsProbe:
    """Keeps, in the kernel, how each target process ended; `exit_of(pid)` reads (and drops) one record."""

    name = "exits"

    def __init__(self, config: ExitsConfig | None = None) -> None:
        self.config = config or ExitsConfig()
        self._bpf = None
        self._targets: set[int] = set()
        self._health = Health(name=self.name)
        self._explained = 0
        self._unexplained = 0

    def start(self, targets: Iterable[int]) -> None:
        if self._bpf is not None:
            raise ProbeUnavailable("exits probe is already started; use set_targets() to change targets")
        try:
            require_tracepoints(TRACEPOINTS)
            root = tracefs_root()
            oom = root is not None and (root / "events" / "oom" / "mark_victim").is_dir()
            if oom != self.config.oom:
                self.config = ExitsConfig(self.config.max_targets, self.config.max_records, oom)
            self._bpf = load_bpf(render(self.config))
        except ProbeUnavailable as exc:
            self._health.state, self._health.reason = "failed", str(exc)
            raise
        self._health.state, self._health.reason = "running", None
        self.set_targets(targets)

    def set_targets(self, targets: Iterable[int]) -> None:
        """Watch exactly `targets`. A tgid that leaves keeps its record until exit_of() reads it."""
        if self._bpf is None:
            raise ProbeUnavailable("exits probe is not started")
        wanted = set(targets)
        table = self._bpf[b"targets"]
        exits = self._bpf[b"exits"]
        for tgid in wanted - self._targets:
            # A pid seen before belongs to a new process now: its old record must not describe this one's end.
            exits.pop(exits.Key(tgid), None)
            table[table.Key(tgid)] = table.Leaf(1)
        for tgid in self._targets - wanted:
            try:
                del table[table.Key(tgid)]
            except KeyError:
                pass  # never written (the program never saw it): nothing to drop
        self._targets = wanted

    def exit_of(self, pid: int) -> ProcessExit | None:
        """How `pid` ended, once it has: None while the kernel has not seen it die (still running, or not watched)."""
        if self._bpf is None:
            return None
        exits = self._bpf[b"exits"]
        try:
            raw = exits[exits.Key(pid)]
        except KeyError:
            self._unexplained += 1
            return None
        if not raw.dead:
            return None
        found = decode(pid, raw)
        exits.pop(exits.Key(pid), None)
        self._explained += 1
        return found

    def stop(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
        self._health.state = "stopped"

    def health(self) -> Health:
        h = self._health.copy()
        h.detail = {"targets": len(self._targets), "explained": self._explained, "unexplained": self._unexplained}
        return h


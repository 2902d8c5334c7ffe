"""Classify folded kernel off-CPU stacks into wait kinds (lock, poll, sleep, block I/O, stopped, preempted, other)."""

from __future__ import annotations

from collections.abc import Mapping

WAIT_KINDS = ("futex", "poll", "sleep", "blockio", "stopped", "preempted", "other")
# What the page calls each kind.
WAIT_LABELS = {"futex": "lock (futex)", "poll": "poll / socket / pipe", "sleep": "sleep", "blockio": "disk I/O",
               "stopped": "stopped (SIGSTOP, freezer, ptrace)", "preempted": "preempted", "other": "other"}

# Checked in this order against every frame of a stack, leaf first: the first kind with a matching
# frame wins. A stopped process shows do_signal_stop on top of whatever it was doing, so it comes first.
# A task asleep inside get_signal is stopped in some form even where the stopping function is inlined: the
# cgroup freezer's do_freezer_trap (`docker pause`) leaves only exit_to_user_mode_loop;...;get_signal;schedule,
# which would otherwise read as preempted;
# block I/O frames sit under a syscall that may also sleep on a futex-like wait queue, so it comes next.
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("stopped", ("do_signal_stop", "do_freezer_trap", "ptrace_stop", "get_signal")),
    ("blockio", ("io_schedule", "blk_", "jbd2", "fsync", "fdatasync", "sync_file_range", "folio_wait",
                 "wait_on_page", "filemap_fault", "ext4_sync", "xfs_file_fsync", "bio_wait", "wait_for_completion_io")),
    ("futex", ("futex",)),
    ("poll", ("do_sys_poll", "do_select", "core_sys_select", "ep_poll", "do_epoll_wait", "sk_wait_data",
              "inet_csk_accept", "tcp_recvmsg", "unix_stream_read", "pipe_read", "sock_recvmsg", "wait_woken")),
    ("sleep", ("do_nanosleep", "hrtimer_nanosleep", "clock_nanosleep", "msleep", "schedule_timeout")),
    # Switched out without a wait: the kernel took the CPU at an interrupt or a syscall's return.
    ("preempted", ("irqentry_exit", "exit_to_user_mode_loop", "preempt_schedule", "sched_yield")),
)


def classify(stack: str) -> str:
    """The wait kind of one folded kernel stack ('root;...;leaf')."""
    frames = stack.split(";")
    for kind, needles in _RULES:
        if any(needle in frame for frame in frames for needle in needles):
            return kind
    return "other"


def by_kind(stacks: Mapping[str, float]) -> dict[str, float]:
    """Sum stack values (microseconds) per wait kind; every kind is present, zero when unseen."""
    out = dict.fromkeys(WAIT_KINDS, 0.0)
    for stack, value in stacks.items():
        out[classify(stack)] += float(value)
    return out

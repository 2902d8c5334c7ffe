"""Off-CPU time by what the thread waited for, read from the kernel stack it blocked in (futex, poll, disk...)."""

from __future__ import annotations

import re
from collections import Counter

# First match wins, checked against the whole folded kernel stack; the order puts the specific waits (a futex
# taken inside a poll loop is a lock wait) before the generic ones.
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("lock (futex)", re.compile(r"futex")),
    ("disk I/O", re.compile(r"io_schedule|blk_|ext4|xfs|btrfs|filemap|folio_wait|wait_on_page|nfs")),
    ("network socket", re.compile(r"sk_wait|tcp_|inet_|unix_stream|sock_|udp_")),
    ("poll / epoll", re.compile(r"ep_poll|do_epoll_wait|do_sys_poll|do_select|core_sys_select")),
    ("sleep", re.compile(r"nanosleep|hrtimer_sleep|msleep")),
    ("pipe", re.compile(r"pipe_read|pipe_write")),
    ("page fault", re.compile(r"page_fault|handle_mm_fault")),
    ("preempted", re.compile(r"preempt|cond_resched|exit_to_user_mode|irqentry_exit")),
)
OTHER = "other"
NAMES: tuple[str, ...] = tuple(name for name, _ in KINDS) + (OTHER,)


def classify(stack: str) -> str:
    for name, pattern in KINDS:
        if pattern.search(stack):
            return name
    return OTHER


def by_kind(folded: dict[str, int]) -> dict[str, int]:
    """Folded kernel stacks (values in the profile's unit) summed per wait kind."""
    out: Counter[str] = Counter()
    for stack, value in folded.items():
        out[classify(stack)] += value
    return dict(out)

"""The off-CPU wait kinds read from kernel stacks."""

import pytest

from dashboards.offcpu_kinds import by_kind, classify


@pytest.mark.parametrize("stack, kind", [
    ("entry_SYSCALL_64;do_syscall_64;__x64_sys_futex;do_futex;futex_wait;schedule", "lock (futex)"),
    ("do_syscall_64;__x64_sys_epoll_wait;do_epoll_wait;ep_poll;schedule_hrtimeout_range;schedule", "poll / epoll"),
    ("do_syscall_64;__x64_sys_recvfrom;tcp_recvmsg;sk_wait_data;schedule_timeout;schedule", "network socket"),
    ("ksys_read;vfs_read;filemap_read;folio_wait_bit_common;io_schedule", "disk I/O"),
    ("__x64_sys_clock_nanosleep;hrtimer_nanosleep;do_nanosleep;schedule", "sleep"),
    ("ksys_read;pipe_read;schedule", "pipe"),
    ("asm_sysvec_apic_timer_interrupt;irqentry_exit;preempt_schedule_irq", "preempted"),
    ("[blocked since before tracing]", "other"),
])
def test_classify(stack, kind):
    assert classify(stack) == kind


def test_by_kind_sums_values():
    assert by_kind({"a;futex_wait;schedule": 5, "b;futex_wait;schedule": 7, "x;schedule": 1}) == \
        {"lock (futex)": 12, "other": 1}

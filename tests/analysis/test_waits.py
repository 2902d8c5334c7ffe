"""Wait kinds from folded kernel stacks: each kind from a real-shaped stack, precedence, and the totals."""

import gzip
import json
from pathlib import Path

import pytest

from analysis.waits import WAIT_KINDS, by_kind, classify
from tests.analysis import synth

FIXTURE = Path(__file__).parent / "fixtures" / "windows_faults.jsonl.gz"


@pytest.mark.parametrize(("stack", "kind"), [
    (synth.FUTEX, "futex"),
    ("[blocked since before tracing];entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_futex;do_futex;futex_wait",
     "futex"),
    (synth.POLL, "poll"),
    ("entry_SYSCALL_64;do_syscall_64;__x64_sys_epoll_wait;do_epoll_wait;ep_poll;schedule_hrtimeout_range", "poll"),
    ("entry_SYSCALL_64;do_syscall_64;__x64_sys_recvfrom;sock_recvmsg;tcp_recvmsg;sk_wait_data;schedule_timeout",
     "poll"),
    (synth.SLEEP, "sleep"),
    (synth.FSYNC, "blockio"),
    ("entry_SYSCALL_64;do_syscall_64;ksys_write;vfs_write;ext4_file_write_iter;folio_wait_bit_common;io_schedule",
     "blockio"),
    (synth.STOP, "stopped"),
    (synth.PREEMPT, "preempted"),
    ("entry_SYSCALL_64_after_hwframe;do_syscall_64;exit_to_user_mode_loop;schedule;__schedule", "preempted"),
    ("entry_SYSCALL_64;do_syscall_64;__x64_sys_mprotect;down_write_killable;rwsem_down_write_slowpath;schedule",
     "other"),
])
def test_classify(stack, kind):
    assert classify(stack) == kind


def test_a_stopped_thread_is_stopped_whatever_it_was_waiting_in():
    # SIGSTOP lands on a thread that was in futex_wait: the stop, not the futex, is why it is off CPU.
    assert classify(synth.FUTEX + ";do_signal_stop;schedule") == "stopped"


@pytest.mark.parametrize("stack", [
    # Frozen by the cgroup freezer (`docker pause`) on this kernel: do_freezer_trap is inlined into get_signal,
    # and exit_to_user_mode_loop alone would read as preempted (tests/scenarios/variants/outside_more.toml).
    "entry_SYSCALL_64_after_hwframe;do_syscall_64;exit_to_user_mode_loop;arch_do_signal_or_restart;get_signal;"
    "schedule;__schedule",
    "asm_sysvec_reschedule_ipi;irqentry_exit_to_user_mode;arch_do_signal_or_restart;get_signal;schedule;__schedule",
    # A debugger attached (`strace -f`): every syscall stops in the tracer, at entry and at exit.
    "entry_SYSCALL_64_after_hwframe;do_syscall_64;syscall_trace_enter;ptrace_notify;ptrace_do_notify;ptrace_stop;"
    "schedule;__schedule",
])
def test_a_thread_frozen_or_traced_is_stopped_not_preempted(stack):
    assert classify(stack) == "stopped"


def test_by_kind_sums_every_kind_and_keeps_zero_kinds():
    out = by_kind({synth.FUTEX: 300, synth.SLEEP: 20, synth.FSYNC: 5, "x;y": 1})
    assert set(out) == set(WAIT_KINDS)
    assert out["futex"] == 300 and out["sleep"] == 20 and out["blockio"] == 5 and out["other"] == 1
    assert out["poll"] == 0 and out["stopped"] == 0


def test_real_windows_idle_server_waits_in_futex_and_a_sigstop_shows_as_stopped():
    rows = [json.loads(line) for line in gzip.open(FIXTURE, "rt")]
    normal = by_kind(rows[0]["offcpu"]["stacks"])
    assert normal["futex"] > 10 * sum(v for k, v in normal.items() if k != "futex")
    stopped = [by_kind(r["offcpu"]["stacks"])["stopped"] for r in rows if r["_label"] == "blocked"]
    assert max(stopped) > 1e6 * 5 and by_kind(rows[0]["offcpu"]["stacks"])["stopped"] == 0

"""PySpySampler against real Python processes: active vs idle stacks, restarts, no leftover children."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest

from agent.sources.pyspy import BurstAsk, PySpySampler, find_pyspy
from analysis.errors import ReadingError, SourceUnavailable, TargetGone
from tests.agent.pyspy.support import samples_with, wait_for


def py_spy_children() -> list[psutil.Process]:
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "py-spy" in " ".join(child.cmdline()) or child.name() == "py-spy":
                out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


def test_find_pyspy_is_the_venv_binary() -> None:
    assert find_pyspy() == str(Path(sys.executable).parent / "py-spy")


@pytest.mark.slow
def test_active_and_idle_stacks_are_kept_apart(require_root, target, sampler_factory) -> None:
    rate = 49
    sampler = sampler_factory(target.pid, rate_hz=rate, segment_seconds=1)
    wait_for(lambda: sampler.health().detail["segments"] >= 3, 40, "three py-spy segments")
    reading = sampler.read()
    segments = sampler.health().detail["segments"]

    burn_active = samples_with(reading.active, "burn_cpu_here")
    wait_idle = samples_with(reading.idle, "wait_on_lock_here")
    assert burn_active > 0, reading.active
    assert wait_idle > 0, reading.idle
    assert samples_with(reading.active, "wait_on_lock_here") == 0, "a thread blocked on a lock was sampled active"
    # The burner is runnable throughout; stale non-blocking reads may misplace a sample or two, never more.
    assert samples_with(reading.idle, "burn_cpu_here") <= max(2, burn_active // 20), reading.idle
    # Ground truth: py-spy takes rate*duration-1 ticks per segment and the waiter is in every tick.
    # One recorder reads both: the kernel's runnable time put the blocked waiter in idle, not its leaf.
    per_segment = rate - 1
    assert 0.9 * segments * per_segment <= wait_idle <= segments * per_segment, (wait_idle, segments)
    # The thread's name replaces py-spy's 'thread (TID): name' root frame.
    assert any(stack.startswith("waiter;") for stack in reading.idle), list(reading.idle)
    assert reading.rate_hz == rate
    effective = sampler.health().detail["last_effective_rate_hz"]
    assert 0 < effective <= rate * 1.3, effective  # overlapping segments may briefly exceed rate
    # A read takes what was pending: the next one holds newer segments only.
    wait_for(lambda: sampler.health().detail["segments"] > segments, 30, "one more py-spy segment")
    again = sampler.read()
    assert samples_with(again.idle, "wait_on_lock_here") <= 2 * per_segment


@pytest.mark.slow
def test_killed_pyspy_is_restarted_and_counted(require_root, target, sampler_factory) -> None:
    sampler = sampler_factory(target.pid, backoff_initial=0.2, segment_seconds=1)
    wait_for(lambda: sampler.health().detail["segments"] >= 1 and sampler.child_pids(), 30, "a running recorder")
    victim = sampler.child_pids()[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: sampler.health().detail["restarts"] >= 1, 20, "the sampler to notice the kill")
    health = sampler.health()
    assert health.error_count >= 1
    assert "killed by signal 9" in (health.reason or ""), health
    # The victim may have been recording (its seconds are lost) or still attaching (nothing recorded yet).
    if "segment lost" in health.reason:
        assert health.detail["lost_seconds"] >= 1, health
    else:
        assert "failed to attach" in health.reason, health
    assert not psutil.pid_exists(victim), "the killed recorder was not reaped"
    sampler.read()
    done = health.detail["segments"]
    wait_for(lambda: sampler.health().detail["segments"] >= done + 2, 30, "segments after the restart")
    assert victim not in sampler.child_pids()
    assert samples_with(sampler.read().active, "burn_cpu_here") > 0
    assert sampler.health().state == "running"


def test_close_leaves_no_child_and_no_zombie(require_root, target) -> None:
    sampler = PySpySampler(target.pid)
    wait_for(lambda: len(sampler.child_pids()) >= 1, 20, "the recorder to start")
    pids = sampler.child_pids()
    sampler.close()
    assert sampler.child_pids() == []
    assert py_spy_children() == []
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).ppid() != os.getpid()


def test_agent_killed_with_sigkill_takes_pyspy_along(require_root, target, tmp_path: Path) -> None:
    agent = textwrap.dedent(f"""
        import time
        from agent.sources.pyspy import PySpySampler
        s = PySpySampler({target.pid}, segment_seconds=60)  # it would outlive the test by itself
        while len(s.child_pids()) < 1:
            time.sleep(0.05)
        print(" ".join(map(str, s.child_pids())), flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", agent], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 1
    proc.kill()
    proc.wait()

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(lambda: all(gone(p) for p in pids), 5, f"py-spy children {pids} to die with their parent")
    # A SIGKILLed agent cannot remove its scratch folder; do it for it.
    for leftover in Path(tempfile.gettempdir()).glob(f"infersight-pyspy-{target.pid}-*"):
        shutil.rmtree(leftover)


@pytest.mark.slow
def test_vanished_target_raises_target_gone(require_root, target, sampler_factory) -> None:
    sampler = sampler_factory(target.pid, backoff_initial=0.1)
    wait_for(lambda: sampler.child_pids(), 20, "recorders to start")
    target.kill()
    target.wait()
    wait_for(lambda: sampler.health().state == "failed", 30, "the sampler to see the target gone")
    with pytest.raises(TargetGone, match=str(target.pid)):
        sampler.read()
    wait_for(lambda: sampler.child_pids() == [], 10, "recorders to stop")


def test_failed_attach_reads_as_no_reading_with_the_reason(require_root, sampler_factory) -> None:
    not_python = subprocess.Popen(["sleep", "60"])
    try:
        sampler = sampler_factory(not_python.pid, backoff_initial=0.1)
        wait_for(lambda: sampler.health().error_count >= 1, 30, "py-spy to fail attaching to a non-Python process")
        with pytest.raises(ReadingError, match="sampled nothing.*failed to attach"):
            sampler.read()
    finally:
        not_python.kill()
        not_python.wait()


def test_missing_pyspy_is_unsupported_not_a_crash(tmp_path: Path) -> None:
    sampler = PySpySampler(os.getpid(), pyspy_path=str(tmp_path / "no-such-py-spy"))
    try:
        health = sampler.health()
        assert health.state == "unsupported"
        assert "no-such-py-spy" in health.reason
        with pytest.raises(SourceUnavailable):
            sampler.read()
    finally:
        sampler.close()


@pytest.mark.slow
def test_one_long_lived_recorder_at_the_steady_rate_then_a_burst(require_root, target, sampler_factory) -> None:
    wanted = {"burst": False}
    sampler = sampler_factory(target.pid, rate_hz=5, burst_rate_hz=47, segment_seconds=2,
                              burst_hold_segments=1, wants_burst=lambda: wanted["burst"])
    wait_for(lambda: sampler.health().detail["segments"] >= 1, 30, "a steady segment")
    assert len(sampler.child_pids()) <= 1, "more than one py-spy recorder at a time"
    steady = sampler.read()
    assert steady.rate_hz == 5 and steady.samples % (5 * 2 - 1) == 0, steady.samples
    wanted["burst"] = True
    wait_for(lambda: sampler.health().detail["burst_segments"] >= 1, 30, "a burst segment")
    assert sampler.health().detail["rate_hz_now"] == 47
    wanted["burst"] = False
    done = sampler.health().detail["segments"]
    # The hold: one more burst segment after the trigger stops, then back to the steady rate.
    wait_for(lambda: sampler.health().detail["rate_hz_now"] == 5, 30, "the steady rate again")
    wait_for(lambda: sampler.health().detail["segments"] >= done + 1, 30, "more segments")
    reading = sampler.read()
    assert samples_with(reading.active, "burn_cpu_here") > 40, reading.active
    assert sampler.health().error_count == 0, sampler.health()


@pytest.mark.slow
def test_an_unheld_burst_returns_to_the_steady_rate_without_the_hold(require_root, target, sampler_factory) -> None:
    # A rise-only burst (agent.burst): with a hold of 3 segments, an UNHELD answer still ends the segment it stops.
    wanted = {"burst": False}
    sampler = sampler_factory(target.pid, rate_hz=5, burst_rate_hz=47, segment_seconds=2, burst_hold_segments=3,
                              wants_burst=lambda: BurstAsk.UNHELD if wanted["burst"] else BurstAsk.NO)
    wait_for(lambda: sampler.health().detail["segments"] >= 1, 30, "a steady segment")
    wanted["burst"] = True
    wait_for(lambda: sampler.health().detail["burst_segments"] >= 1, 30, "a burst segment")
    wanted["burst"] = False
    asked_off = sampler.health().detail["burst_segments"]
    wait_for(lambda: sampler.health().detail["rate_hz_now"] == 5, 30, "the steady rate again")
    # At most the segment running when the trigger stopped asking (launched just before): held, it would be 3 more.
    assert sampler.health().detail["burst_segments"] <= asked_off + 1, sampler.health().detail
    assert sampler.health().error_count == 0, sampler.health()


def test_failing_burst_trigger_is_counted_and_sampling_goes_on(require_root, target, sampler_factory) -> None:
    def broken() -> bool:
        raise RuntimeError("detector snapshot failed")

    sampler = sampler_factory(target.pid, segment_seconds=1, wants_burst=broken)
    wait_for(lambda: sampler.health().detail["segments"] >= 2, 30, "segments despite the trigger")
    health = sampler.health()
    assert health.error_count >= 1 and "detector snapshot failed" in (health.reason or ""), health
    assert health.state == "running" and health.detail["burst_segments"] == 0


@pytest.mark.parametrize("kw, bad", [({"rate_hz": 0}, "0"), ({"segment_seconds": 0}, "0"),
                                     ({"segment_seconds": 1.5}, "1.5"), ({"burst_rate_hz": 2000}, "2000"),
                                     ({"burst_hold_segments": -1}, "-1")])
def test_bad_arguments_quote_the_value(kw, bad) -> None:
    with pytest.raises(ValueError, match=bad):
        PySpySampler(os.getpid(), autostart=False, **kw)


def test_an_unheld_burst_answer_leaves_no_hold_and_a_held_one_does() -> None:
    answers: list = []
    sampler = PySpySampler(1, autostart=False, burst_hold_segments=2, wants_burst=lambda: answers.pop(0))
    try:
        # One decision per segment: a rise-only burst (UNHELD) ends the segment its trigger stops asking.
        answers[:] = [BurstAsk.UNHELD, BurstAsk.UNHELD, BurstAsk.NO, False]
        assert [sampler._burst_now() for _ in range(4)] == [True, True, False, False]
        # True (any truthy answer but UNHELD, as before BurstAsk) and HELD keep 2 segments more.
        for held in (True, BurstAsk.HELD, 2):
            answers[:] = [held, 0, None, False, False]
            assert [sampler._burst_now() for _ in range(5)] == [True, True, True, False, False], held
        # An UNHELD answer does not cut short a hold a HELD one left (an episode's, after it closed).
        answers[:] = [BurstAsk.HELD, BurstAsk.UNHELD, False, False, False]
        assert [sampler._burst_now() for _ in range(5)] == [True, True, True, True, False]
    finally:
        sampler.close()

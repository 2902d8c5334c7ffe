"""Steady py-spy recordings longer than a burst segment, against a real Python process: their length, their
samples (none lost at a boundary, idle stacks kept) and a burst trigger that cuts one short."""

from __future__ import annotations

import os

import psutil
import pytest

from agent.config import Config, StacksConfig, TargetSpec
from agent.sources.pyspy import DEFAULT_STEADY_SEGMENT_SECONDS, PySpySampler
from agent.target_sources import source_factories
from agent.targets import Target, read_proc
from analysis.errors import STEADY_RECORDING_RUNNING, ReadingError
from tests.agent.pyspy.support import samples_with, wait_for


def _durations(sampler: PySpySampler) -> set[int]:
    """The --duration of each py-spy recorder running now, read from its command line."""
    out = set()
    for pid in sampler.child_pids():
        try:
            argv = psutil.Process(pid).cmdline()
        except psutil.NoSuchProcess:
            continue
        if "--duration" in argv:
            out.add(int(argv[argv.index("--duration") + 1]))
    return out


def test_the_default_steady_segment_spans_three_windows_and_the_daemon_gives_it_to_the_sampler() -> None:
    # A third of the attaches of one-window recordings (docs/BENCHMARKS.md): the cost this default exists for.
    assert StacksConfig().steady_segment_seconds == DEFAULT_STEADY_SEGMENT_SECONDS == 15
    assert StacksConfig().segment_seconds == 5
    spec = TargetSpec(name="me", pid=os.getpid())
    target = Target(name="me", pid=os.getpid(), start_time=read_proc(os.getpid()).start_time, cmdline=("python",),
                    spec=spec)
    sampler = source_factories(target, Config(targets=(spec,)))["stacks"]()
    try:
        assert (sampler.segment_seconds, sampler.steady_segment_seconds) == (5, 15)
    finally:
        sampler.close()


@pytest.mark.slow
def test_steady_segments_have_their_length_and_lose_no_samples(require_root, target, sampler_factory) -> None:
    sampler = sampler_factory(target.pid, rate_hz=5, segment_seconds=2, steady_segment_seconds=6,
                              wants_burst=lambda: False)
    wait_for(lambda: _durations(sampler) == {6}, 30, "a steady recorder of 6 s")
    wait_for(lambda: sampler.health().detail["segments"] >= 2, 60, "two steady segments")
    done = sampler.health().detail["segments"]
    reading = sampler.read()
    # Every tick of every recording reaches the reading: py-spy takes rate*duration - 1 ticks per recording.
    assert reading.samples >= done * (5 * 6 - 1), (reading.samples, done)
    assert reading.samples % (5 * 6 - 1) == 0, reading.samples
    # The idle stacks (the lock signal's): the thread waiting on its lock is in nearly every tick.
    assert samples_with(reading.idle, "wait_on_lock_here") >= 0.8 * reading.samples, reading.idle
    assert samples_with(reading.active, "burn_cpu_here") > 0, reading.active
    # Between two steady recordings' ends a read has no stacks, and says why (not zero, not an error count).
    before = sampler.health().detail["segments"]
    try:
        sampler.read()
    except ReadingError as exc:
        assert "still running" in str(exc), exc
    else:
        assert sampler.health().detail["segments"] > before, "a reading with no segment finished"
    health = sampler.health()
    assert health.error_count == 0 and health.detail["burst_segments"] == 0, health


@pytest.mark.slow
def test_a_burst_trigger_cuts_the_steady_recording_short_and_keeps_its_samples(require_root, target,
                                                                               sampler_factory) -> None:
    wanted = {"burst": False}
    sampler = sampler_factory(target.pid, rate_hz=5, burst_rate_hz=47, segment_seconds=2,
                              steady_segment_seconds=60, burst_hold_segments=1, wants_burst=lambda: wanted["burst"])
    wait_for(lambda: _durations(sampler) == {60}, 30, "a steady recorder of 60 s")
    wanted["burst"] = True
    # Well before the 60 s recording would have ended by itself.
    wait_for(lambda: sampler.health().detail["burst_segments"] >= 1, 30, "a burst segment")
    assert sampler.health().detail["steady_cut_for_burst"] == 1
    assert sampler.health().detail["rate_hz_now"] == 47
    for _ in range(50):
        bursts = sampler.health().detail["burst_segments"]
        reading = sampler.read()
        if sampler.health().detail["burst_segments"] == bursts:
            break
    else:
        pytest.fail("could not read between two burst segments")
    # The cut recording's ticks (at least a second at 5 Hz) are in the reading beside the bursts' own.
    steady_ticks = reading.samples - bursts * (47 * 2 - 1)
    assert steady_ticks >= 5, (reading.samples, bursts)
    assert samples_with(reading.idle, "wait_on_lock_here") >= 0.8 * reading.samples, reading.idle
    health = sampler.health()
    assert health.error_count == 0 and health.detail["lost_seconds"] == 0, health


@pytest.mark.parametrize("kw", [{"segment_seconds": 5, "steady_segment_seconds": 4},
                                {"steady_segment_seconds": 61}, {"steady_segment_seconds": 7.5}])
def test_a_steady_segment_shorter_than_a_burst_one_or_out_of_range_is_refused(kw) -> None:
    with pytest.raises(ValueError, match="steady_segment_seconds"):
        PySpySampler(1, autostart=False, **kw)


@pytest.mark.parametrize("interval, segment, steady, expected", [(5.0, 5, 15, (5, 15)), (3.0, 5, 4, (3, 3)),
                                                                 (5.0, 5, 2, (5, 5)), (60.0, 10, 60, (10, 60)),
                                                                 (2.0, 5, 5, (2, 2)), (2.0, 5, 15, (2, 2)),
                                                                 (10.0, 5, 15, (5, 15))])
def test_the_daemon_gives_each_sampler_a_steady_segment_no_shorter_than_its_burst_one(
        interval: float, segment: int, steady: int, expected: tuple[int, int]) -> None:
    spec = TargetSpec(name="me", pid=os.getpid())
    config = Config(interval_seconds=interval, targets=(spec,),
                    stacks=StacksConfig(segment_seconds=segment, steady_segment_seconds=steady))
    target = Target(name="me", pid=os.getpid(), start_time=read_proc(os.getpid()).start_time, cmdline=("python",),
                    spec=spec)
    sampler = source_factories(target, config)["stacks"]()
    try:
        assert (sampler.segment_seconds, sampler.steady_segment_seconds) == expected
    finally:
        sampler.close()


@pytest.mark.parametrize("steady, spans", [(5, False), (15, True)])
def test_only_a_steady_recording_meant_to_span_windows_says_its_window_waits_on_it(steady: int, spans: bool) -> None:
    # The detector reads the latest recording's stacks for a window that says so (analysis.steady_stacks); a
    # one-window recording that ends late is a plain gap, as in every recording made before steady segments.
    sampler = PySpySampler(1, autostart=False, segment_seconds=5, steady_segment_seconds=steady)
    sampler._recording_steady = True  # a steady recording is running and nothing finished since the last read
    with pytest.raises(ReadingError) as exc:
        sampler.read()
    assert (STEADY_RECORDING_RUNNING in str(exc.value)) == spans, exc.value

"""The windows between two steady py-spy recordings read the latest one's stack signals, marked, and only those."""

from dataclasses import replace

from analysis.errors import STEADY_RECORDING_RUNNING
from analysis.steady_stacks import MAX_CARRIED_WINDOWS, SteadyStacks
from analysis.window import StackReading, Window

RUNNING = {"stacks": f"py-spy's steady recording (15 s) is still running: {STEADY_RECORDING_RUNNING}"}


def _window(i: int, stacks: StackReading | None = None, errors: dict[str, str] | None = None) -> Window:
    return Window(target="t", pid=1, start=5.0 * i, end=5.0 * (i + 1), stacks=stacks, errors=errors or {})


def test_a_window_waiting_on_a_running_steady_recording_reads_the_latest_one_marked_with_its_window() -> None:
    carry = SteadyStacks()
    assert carry.read(_window(0, StackReading(idle={"t;a": 3}, rate_hz=3, samples=45)), 0.4, {"a": 1.0}) is None
    got = carry.read(_window(1, errors=RUNNING), None, None)
    assert got is not None and (got.app_wait_threads, got.leaves, got.at) == (0.4, {"a": 1.0}, 5.0)
    assert carry.read(_window(2, errors=RUNNING), None, None) == got
    # The next recording's window replaces it.
    assert carry.read(_window(3, StackReading(rate_hz=3, samples=45)), 0.0, None) is None
    assert carry.read(_window(4, errors=RUNNING), None, None).app_wait_threads == 0.0


def test_stacks_missing_for_another_reason_are_not_carried_over_nor_afterwards() -> None:
    carry = SteadyStacks()
    carry.read(_window(0, StackReading(rate_hz=3, samples=15)), 0.4, None)
    assert carry.read(_window(1), None, None) is None  # no reason at all
    assert carry.read(_window(2, errors=RUNNING), None, None) is None  # the latest is gone with the failure
    carry.read(_window(3, StackReading(rate_hz=3, samples=15)), 0.4, None)
    assert carry.read(_window(4, errors={"stacks": "py-spy sampled nothing since the last read: exited"}),
                      None, None) is None


def test_a_gap_longer_than_any_steady_recording_stops_the_carry() -> None:
    carry = SteadyStacks()
    carry.read(_window(0, StackReading(rate_hz=3, samples=15)), 0.4, None)
    answers = [carry.read(_window(i, errors=RUNNING), None, None) for i in range(1, MAX_CARRIED_WINDOWS + 2)]
    assert all(a is not None for a in answers[:MAX_CARRIED_WINDOWS]) and answers[-1] is None


def test_nothing_running_before_the_first_recording_carries_nothing() -> None:
    assert SteadyStacks().read(_window(0, errors=RUNNING), None, None) is None


def test_the_detector_reads_the_carried_lock_signal_and_marks_it(monkeypatch) -> None:
    from analysis.detector import LatencyDetector
    from tests.analysis import synth
    from tests.analysis.synth import Load

    det = LatencyDetector(sampling_noise=True)
    seen: list[dict] = []
    real = det._corroboration
    monkeypatch.setattr(det, "_corroboration", lambda values: (seen.append(values), real(values))[1])
    for w in synth.windows(0, 40, seed=1):
        det.update(w)
    waiting = synth.window(40, Load(lock_wait_threads=0.6), seed=1)
    det.update(waiting)
    between = replace(synth.window(41, seed=1), stacks=None, errors=RUNNING)
    det.update(between)
    assert seen[-1]["app_wait"] == seen[-2]["app_wait"] > 0
    assert seen[-1]["stacks_carried_from"] == waiting.end
    # Judged at the carried recording's ticks, one recording for every window that carries it (analysis.sampling).
    ticks = waiting.stacks.samples or waiting.stacks.rate_hz * (waiting.end - waiting.start)
    assert seen[-1]["app_wait_ticks"] == seen[-2]["app_wait_ticks"] == ticks > 0
    assert seen[-1]["stacks_from"] == seen[-2]["stacks_from"] == waiting.end
    # What the detector learns is the window's own reading: none.
    assert det.steady_stacks_.latest is not None and det.steady_stacks_.latest.at == waiting.end


def test_a_recording_spans_the_windows_that_waited_on_it_and_the_one_it_came_with() -> None:
    carry = SteadyStacks()
    carry.read(_window(0, errors=RUNNING), None, None)  # the first recording, started before any finished
    carry.read(_window(1, StackReading(rate_hz=3, samples=30)), 0.0, {"a": 6.0})
    assert carry.span == 2 and carry.latest is not None and carry.latest.span == 2
    for i in (2, 3):
        carry.read(_window(i, errors=RUNNING), None, None)
    carry.read(_window(4, StackReading(rate_hz=3, samples=45)), 0.0, {"a": 9.0})
    assert carry.span == carry.latest.span == 3
    carry.read(_window(5, StackReading(rate_hz=49, samples=245)), 0.0, {"a": 80.0})  # a burst: one window
    assert carry.span == 1


def test_the_detector_reads_a_longer_recordings_profile_shift_at_one_windows_share_of_its_samples() -> None:
    from analysis.baseline import Baseline
    from analysis.profile import jensen_shannon, jensen_shannon_of_share

    base = Baseline(max_rows=10, profile_decay=1.0)
    base.profile = {"forward": 6.0, "tokenize": 3.0, "json": 1.0}
    leaves = {"forward": 8.0, "tokenize": 3.0, "wait": 1.0}
    assert base.jsd(leaves) == jensen_shannon(base.profile, leaves)
    assert base.jsd(leaves, span=3) == jensen_shannon_of_share(base.profile, leaves, 4) > base.jsd(leaves)


def test_a_recording_that_ended_just_after_a_window_spans_the_windows_its_ticks_fill() -> None:
    carry = SteadyStacks()
    carry.read(_window(0, StackReading(rate_hz=3, samples=15)), 0.0, {"a": 3.0})
    for i in (1, 2, 3):  # 15 s of ticks, but it ended just after the third window's end
        carry.read(_window(i, errors=RUNNING), None, None)
    carry.read(_window(4, StackReading(rate_hz=3, samples=45)), 0.0, {"a": 9.0})
    assert carry.span == 3


def test_the_lock_signal_is_net_of_the_threads_the_kernel_saw_in_non_lock_waits() -> None:
    from analysis.steady_stacks import lock_waits

    assert lock_waits(0.6, 0.7, 0.0) == 0.0  # every idle thread is accounted for by sleeps, disk or page faults
    assert abs(lock_waits(0.6, 0.25, 0.05) - 0.4) < 1e-9  # beyond the baseline's usual blocked waits only
    assert lock_waits(0.6, 0.01, 0.05) == 0.6  # fewer than usual: nothing to take away
    assert lock_waits(0.6, None, 0.0) == 0.6 and lock_waits(0.6, 0.7, None) == 0.6  # unmeasured: unchanged
    assert lock_waits(None, 0.7, 0.0) is None


def test_a_recording_carries_the_kernels_blocked_waits_over_the_windows_it_spanned() -> None:
    carry = SteadyStacks()
    carry.read(_window(0, StackReading(rate_hz=3, samples=15)), 0.0, None, 5.0)  # before the span: not counted
    carry.read(_window(1, errors=RUNNING), None, None, 0.9)
    carry.read(_window(2, errors=RUNNING), None, None, 0.0)
    carry.read(_window(3, StackReading(rate_hz=3, samples=45)), 0.3, None, 0.0)
    assert carry.latest is not None and carry.latest.span == 3
    assert abs(carry.latest.blocked - 0.3) < 1e-9 and carry.span_blocked == carry.latest.blocked
    carry.read(_window(4, StackReading(rate_hz=3, samples=15)), 0.0, None, None)  # unmeasured: no account
    assert carry.latest.blocked is None


def _carried_lock_signal(fault_blocked: float) -> float:
    """The lock signal a window reads after a recording of three windows whose first window had threads waiting in
    their own code 0.9 of the time, while the kernel saw `fault_blocked` threads in disk waits in that window."""
    from analysis.detector import LatencyDetector
    from tests.analysis import synth
    from tests.analysis.synth import Load

    det = LatencyDetector()
    seen: list[dict] = []
    real = det._corroboration
    det._corroboration = lambda values: (seen.append(values), real(values))[1]  # type: ignore[method-assign]
    for w in synth.windows(0, 40, seed=1):
        det.update(w)
    # The recording's idle samples: 0.9 extra thread in the first of its three windows, as a recording sums them.
    first = synth.window(40, Load(lock_wait_threads=0.9, fsync=fault_blocked), seed=1)
    det.update(replace(first, stacks=None, errors=RUNNING))
    det.update(replace(synth.window(41, seed=1), stacks=None, errors=RUNNING))
    third = synth.window(42, seed=1)
    s = first.stacks
    spanned = StackReading(active=s.active, rate_hz=s.rate_hz, samples=3 * s.samples,
                           idle={k: v + 2 * third.stacks.idle.get(k, 0) for k, v in s.idle.items()})
    det.update(replace(third, stacks=spanned))
    det.update(replace(synth.window(43, seed=1), stacks=None, errors=RUNNING))
    assert seen[-1]["stacks_carried_from"] == third.end
    return seen[-1]["app_wait"]


def test_a_recording_taken_while_threads_stalled_on_disk_or_page_faults_carries_no_lock_signal() -> None:
    # Without the kernel's blocked waits the recording's idle threads are a lock's: 0.3 extra thread over its span.
    assert _carried_lock_signal(0.0) > 0.35
    # With the kernel seeing as many threads in disk waits over the same span, they are accounted for.
    assert _carried_lock_signal(0.9) < 0.15

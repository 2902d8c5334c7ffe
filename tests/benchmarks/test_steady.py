"""The steady-state figures: 10-minute slices after the detector's warm-up, and py-spy's CPU split into bursts."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.recorders import RecorderLedger
from benchmarks.soak import Reading, psutil_slices, psutil_tree_cpu, slices, steady_verdict

TICK = 100  # SC_CLK_TCK on Linux


def reading(t: float, cpu_total: float, cpu_own: float, armed: bool | None, regressions: int | None = None) -> Reading:
    return Reading(t=t, rss_bytes=2**20, peak_rss_bytes=2**20, fds=20, threads=12, children=1, cpu_percent=None,
                   store_bytes=0, windows=None, late_ticks=0, dropped_windows=0, tick_seconds=None,
                   cpu_total=cpu_total, cpu_own=cpu_own, armed=armed, regressions=regressions)


def test_slices_start_at_the_armed_detector_and_split_the_cpu() -> None:
    # 60 s of warm-up at 5 % of a core, then 0.8 % (0.5 % the agent, 0.3 % py-spy) for 27 minutes.
    rs = [reading(t, 0.05 * t, 0.03 * t, armed=False) for t in (0.0, 30.0, 60.0)]
    base_total, base_own = 0.05 * 60, 0.03 * 60
    rs += [reading(60.0 + t, base_total + 0.008 * t, base_own + 0.005 * t, armed=True) for t in range(60, 1621, 60)]
    asked = []

    def bursts(a: float, b: float):
        asked.append((a, b))
        return 0.5, 1

    cut = slices(rs, bursts, seconds=600.0)
    # 120 s (the first armed reading) + two full slices; the 360 s left is over half a slice: it counts.
    assert [(c.start_min, c.seconds) for c in cut] == [(2.0, 600.0), (12.0, 600.0), (22.0, 360.0)]
    assert all(c.cpu_percent == pytest.approx(0.8) and c.own_percent == pytest.approx(0.5) for c in cut)
    assert cut[0].children_percent == pytest.approx(0.3) and cut[0].burst_percent == pytest.approx(0.15)
    assert asked[0] == (120.0, 720.0) and cut[0].bursts_per_hour == 6.0
    v = steady_verdict(cut, peak_rss_bytes=150 * 2**20)
    assert v["cpu_percent_median"] == pytest.approx(0.8) and v["goals"] == {"steady_cpu<=1%": True,
                                                                           "peak_rss<=200MiB": True}
    assert steady_verdict(cut, peak_rss_bytes=250 * 2**20)["goals"]["peak_rss<=200MiB"] is False


def test_bursts_in_a_slice_without_an_opened_regression_are_false() -> None:
    # One regression opens at 15 min (the second slice); each slice has one burst.
    rs = [reading(t, 0.01 * t, 0.005 * t, armed=t >= 120, regressions=0 if t < 900 else 1)
          for t in range(0, 1921, 60)]
    cut = slices(rs, lambda a, b: (0.5, 1), seconds=600.0)
    assert [c.regressions for c in cut] == [0, 1, 0]
    v = steady_verdict(cut, peak_rss_bytes=2**20)
    assert v["regressions_opened"] == 1 and v["false_bursts_per_hour"] == pytest.approx(2 * 3600 / 1800)
    # An agent that was never scraped says nothing about its regressions: not zero, unknown.
    unscraped = slices([reading(t, 0.01 * t, 0.005 * t, armed=t >= 120) for t in range(0, 1921, 60)],
                       lambda a, b: (0.5, 1), seconds=600.0)
    assert unscraped[0].regressions is None
    assert steady_verdict(unscraped, 2**20)["false_bursts_per_hour"] is None


def test_no_slice_before_the_detector_is_armed() -> None:
    rs = [reading(t, 0.01 * t, 0.01 * t, armed=False) for t in range(0, 1300, 60)]
    assert slices(rs, lambda a, b: (None, 0)) == []
    assert "error" in steady_verdict([], 0)


def _proc_tree(root: Path, agent: int, kids: dict[int, tuple[bytes, int]]) -> None:
    """A /proc with `agent` whose children are `kids`: pid -> (cmdline, CPU ticks)."""
    (root / str(agent) / "task" / str(agent)).mkdir(parents=True, exist_ok=True)
    (root / str(agent) / "task" / str(agent) / "children").write_text(" ".join(map(str, kids)))
    for pid, (cmdline, ticks) in kids.items():
        (root / str(pid) / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "task" / str(pid) / "children").write_text("")
        (root / str(pid) / "cmdline").write_bytes(cmdline)
        fields = ["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 30
        (root / str(pid) / "stat").write_text(f"{pid} (py-spy) " + " ".join(fields))


def pyspy(rate: int, target: int = 7) -> bytes:
    return b"\0".join([b"/venv/bin/py-spy", b"record", b"--pid", str(target).encode(), b"--rate", str(rate).encode(),
                       b"--idle", b""])


def test_ledger_books_recorders_cpu_by_rate(tmp_path: Path) -> None:
    now = [0.0]
    ledger = RecorderLedger(1, proc=tmp_path, clock=lambda: now[0])
    # Steady, steady, a burst of two recorders, steady: one burst; a non-py-spy child is not booked.
    timeline = [(10, 3, 20), (11, 3, 20), (12, 49, 300), (13, 49, 300), (14, 3, 20)]
    for i, (pid, rate, ticks) in enumerate(timeline):
        now[0] = 5.0 * i
        _proc_tree(tmp_path, 1, {pid: (pyspy(rate), ticks // 2), 99: (b"/usr/bin/setpriv\0", 500)})
        ledger.poll()
        now[0] = 5.0 * i + 4.5
        _proc_tree(tmp_path, 1, {pid: (pyspy(rate), ticks), 99: (b"/usr/bin/setpriv\0", 900)})
        ledger.poll()
    used = ledger.use(0.0, 25.0)
    assert used.recorders == 5 and used.burst_recorders == 2 and used.bursts == 1
    assert used.cpu_seen == pytest.approx(6.6) and used.burst_share == pytest.approx(6.0 / 6.6)
    assert used.bursts_per_hour == pytest.approx(144.0)
    # A window holding steady recorders only.
    assert ledger.use(0.0, 10.0).bursts == 0 and ledger.use(0.0, 10.0).burst_share == 0.0


def test_the_second_reader_gives_each_slice_from_its_nearest_readings() -> None:
    rs = [reading(t, 0.01 * t, 0.005 * t, armed=t >= 120) for t in range(0, 1321, 30)]
    cut = slices(rs, lambda a, b: (None, 0), seconds=600.0)
    # psutil read 1.1 % of a core throughout, at moments 2 s after the soak's own readings.
    seen = {t + 2.0: (0.011 * (t + 2.0), 0.0) for t in range(0, 1321, 30)}
    assert psutil_slices(cut, seen) == [pytest.approx(1.1)] * len(cut)
    assert psutil_slices(cut, {}) == [None] * len(cut)
    assert psutil_slices(cut, {5.0: (1.0, 0.0)}) == [None] * len(cut)  # one reading: no span


def test_the_second_reader_reads_this_process_and_its_children() -> None:
    import os
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\nimport sys; sys.stdout.write('x'); "
                              "sys.stdout.flush(); time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert child.stdout.read(1) == b"x"
        total, own = psutil_tree_cpu(os.getpid())
        t = os.times()
        assert own == pytest.approx(t.user + t.system, abs=0.05)
        assert total >= own + 0.25  # the live child's 0.3 s of CPU is in the tree
    finally:
        child.kill()
        child.wait()

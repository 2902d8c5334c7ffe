"""The agent gives back the file pages only its start-up touched (agent/memory.py, issue 33)."""

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from agent import daemon
from agent.memory import FileMapping, clean_file_mappings

SMAPS = """\
55d0c0000000-55d0c0001000 r--p 00000000 fe:01 1 /usr/bin/python3.11
Rss:                   4 kB
Anonymous:             0 kB
7f0000000000-7f0004000000 r-xp 00a00000 fe:01 2 /venv/scipy/_lib/_ccallback_c.so
Size:              65536 kB
Rss:               40960 kB
Anonymous:             0 kB
7f0004000000-7f0004100000 r--p 04a00000 fe:01 2 /venv/scipy/_lib/_ccallback_c.so
Rss:                1024 kB
Anonymous:            12 kB
7f0004100000-7f0004200000 rw-p 04b00000 fe:01 2 /venv/scipy/_lib/_ccallback_c.so
Rss:                1024 kB
Anonymous:             0 kB
7f0005000000-7f0006000000 r-xp 00100000 fe:01 3 /usr/lib/libunused.so
Rss:                   0 kB
Anonymous:             0 kB
7f0006000000-7f0006001000 r--s 00000000 fe:01 4 /var/lib/infersight/store.db-shm
Rss:                   4 kB
Anonymous:             0 kB
7f0007000000-7f0007001000 r--p 00000000 00:05 5 /dev/zero
Rss:                   4 kB
Anonymous:             0 kB
7f0008000000-7f0008001000 rw-p 00000000 00:00 0
Rss:                   4 kB
Anonymous:             4 kB
7f0009000000-7f0009001000 r-xp 00000000 fe:01 6 /tmp/old build/lib.so (deleted)
Rss:                   4 kB
Anonymous:             0 kB
"""


def test_only_clean_private_read_only_file_pages_are_chosen() -> None:
    # Not chosen: a mapping with a written (anonymous) page, a writable one, one with nothing resident, a shared
    # one (the store's), a device, and anonymous memory. A deleted file's pages are still clean copies.
    assert clean_file_mappings(SMAPS.splitlines(keepends=True)) == [
        FileMapping(0x55D0C0000000, 0x55D0C0001000, "/usr/bin/python3.11", 4096),
        FileMapping(0x7F0000000000, 0x7F0004000000, "/venv/scipy/_lib/_ccallback_c.so", 40960 * 1024),
        FileMapping(0x7F0009000000, 0x7F0009001000, "/tmp/old build/lib.so (deleted)", 4096),
    ]
    assert clean_file_mappings([]) == []


# A fresh interpreter: the detector's scikit-learn fit, the page-out, and the same fit again.
CHILD = textwrap.dedent("""
    import json
    import numpy as np
    from analysis.latency_model import ExpectedLatency, Row
    from agent.memory import page_out_startup_files, rss_file_bytes

    rng = np.random.default_rng(7)
    rows = [Row(n=20 + i % 7, rate=2 + rng.random() * 3, tpr=50 + rng.random() * 40, mean=0.1 + rng.random() * 0.05,
                p50=0.09, p99=0.3 + rng.random() * 0.1, buckets=((0.1, 5.0), (0.5, 14.0), (float("inf"), 1.0)))
            for i in range(60)]
    first = ExpectedLatency().fit(rows)
    before = rss_file_bytes()
    freed = page_out_startup_files()
    after = rss_file_bytes()
    second = ExpectedLatency().fit(rows)
    print(json.dumps({"before": before, "freed": freed, "after": after, "after_refit": rss_file_bytes(),
                      "same": all(first.coef_[k].tolist() == second.coef_[k].tolist()
                                  and first.intercept_[k] == second.intercept_[k] for k in first.coef_)}))
""")


@pytest.mark.root  # the kernel pages out file pages only for their owner (root here) or a writer
def test_start_up_file_pages_leave_and_the_model_fits_the_same(require_root) -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    # scikit-learn's and scipy's import leaves ~30 MiB of clean library pages that the fit never runs again.
    assert f["freed"] > 15 * mib and f["after"] < f["before"] - 15 * mib, f
    assert f["after_refit"] - f["after"] < 10 * mib, f  # what the fit needs comes back, a few MiB
    assert f["same"], f


# scikit-learn's import as the agent does it (a page-out after each step) or in one go; the peak (VmHWM) of each.
STAGED = textwrap.dedent("""
    import json, sys
    import numpy as np
    from agent.memory import page_out_startup_files
    from analysis import latency_model
    calls = []
    if sys.argv[1] == "steps":
        latency_model.set_import_step(lambda: calls.append(page_out_startup_files()))
    rng = np.random.default_rng(3)
    x, y = rng.random((200, 2)), rng.random(200)
    coef = latency_model._huber_class()(max_iter=200).fit(x, y).coef_.tolist()
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"hwm_kib": hwm, "steps": len(calls), "coef": coef}))
""")


@pytest.mark.root
def test_scikit_learns_import_in_steps_peaks_lower_and_fits_the_same(require_root) -> None:
    def run(how: str) -> dict:
        out = subprocess.run([sys.executable, "-c", STAGED, how], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    whole, steps = run("whole"), run("steps")
    assert whole["steps"] == 0 and steps["steps"] == 6
    assert steps["coef"] == whole["coef"]
    # Measured: 122 -> 101 MiB; the file pages of one step leave before the next step's arrive.
    assert steps["hwm_kib"] < whole["hwm_kib"] - 10 * 1024, (steps, whole)


# glibc's dynamic thresholds: an 8 MiB block, mmap'd and freed, raises the trim threshold to 16 MiB; 10 MiB of
# small blocks freed afterwards then stay resident at the heap's top, unless the thresholds are pinned.
PIN = textwrap.dedent("""
    import ctypes, json, sys
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    if sys.argv[1] == "pin":
        from agent.memory import pin_malloc_thresholds
        assert pin_malloc_thresholds()
    def rss():
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:"))
    big = libc.malloc(8 << 20)
    ctypes.memset(big, 1, 8 << 20)
    libc.free(big)
    base = rss()
    blocks = [libc.malloc(64 << 10) for _ in range(160)]
    for b in blocks:
        ctypes.memset(b, 1, 64 << 10)
    for b in reversed(blocks):
        libc.free(b)
    print(json.dumps({"kept_kib": rss() - base}))
""")


def test_pinned_malloc_thresholds_give_back_a_freed_heap_top() -> None:
    def kept(how: str) -> int:
        out = subprocess.run([sys.executable, "-c", PIN, how], capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["kept_kib"]

    assert kept("plain") > 8 * 1024  # glibc's default behaviour: the 10 MiB stay (measured 10,252 KiB)
    assert kept("pin") < 2 * 1024  # measured 108 KiB


class _Detection:
    def __init__(self, states: list[str | None]) -> None:
        self.states = iter(states)

    def observe(self, window: object) -> SimpleNamespace | None:
        state = next(self.states)
        if state == "raise":
            raise RuntimeError("detector fault")
        return None if state is None else SimpleNamespace(state=state)


@pytest.mark.parametrize(("states", "calls"), [
    (["warmup", "warmup", None, "healthy", "healthy", "regression"], [1, 4]),  # the first window, the first fit
    (["warmup"] * 5, [1]),  # not again while the baseline is learned
    (["raise", "healthy", "healthy"], [1, 2]),
    (["healthy", "healthy"], [1, 1]),  # a saved baseline: the first window is the first fit
])
def test_the_agent_pages_out_after_its_first_window_and_after_the_first_fit(monkeypatch, states, calls) -> None:
    seen: list[int] = []
    trims: list[int] = []
    window = SimpleNamespace(target="t")
    agent = SimpleNamespace(store=SimpleNamespace(add_window=lambda w: None), _observe_identity=lambda w: None,
                            detection=_Detection(states), state=SimpleNamespace(count_error=lambda name: None),
                            _startup_paged_out=False, _fit_paged_out=False, _windows=0)
    n = 0
    monkeypatch.setattr(daemon, "page_out_startup_files", lambda: seen.append(n) or 0)
    monkeypatch.setattr(daemon, "trim_heap", lambda: trims.append(n))
    for n in range(1, len(states) + 1):
        daemon.Agent._sink(agent, window)
    assert seen == calls
    assert trims == calls  # the heaps are trimmed with each page-out
    # Without a detector: once, after the first window; then the heaps are trimmed every TRIM_EVERY_WINDOWS.
    agent.detection, agent._startup_paged_out, agent._windows, seen[:], trims[:] = None, False, 0, [], []
    every = daemon.TRIM_EVERY_WINDOWS
    for n in range(1, 2 * every + 2):
        daemon.Agent._sink(agent, window)
    assert seen == [1]
    assert trims == [1, every, 2 * every]

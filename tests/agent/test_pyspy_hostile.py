"""A target that names its functions to hurt: kilobyte names with control characters and line breaks, a new
stack every sample, stacks 700 frames deep. The limits apply while py-spy's output is parsed, and py-spy itself
stops at its address-space limit instead of growing with the target."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from agent.sources.folded import TRUNCATED, StackLimits
from agent.sources.pyspy import ADDRESS_SPACE_BYTES, OUTPUT_MAX_BYTES, PySpySampler
from probes.pidfd import read_start_time

pytestmark = [pytest.mark.root, pytest.mark.slow]

HOSTILE = textwrap.dedent("""
    import random, sys, threading, time
    NAME, FUNCS, DEEP = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    SRC = ("def _f(depth, rng):\\n"
           "    if depth == 0:\\n"
           "        t = time.perf_counter() + 0.0005\\n"
           "        while time.perf_counter() < t: pass\\n"
           "        return\\n"
           "    funcs[rng.randrange(len(funcs))](depth - 1, rng)\\n")

    def named(src, name, **env):
        ns = dict(env)
        exec(compile(src, "<hostile>", "exec"), ns)
        f = ns["_f"]
        f.__code__ = f.__code__.replace(co_name=name, co_qualname=name)
        return f

    funcs = []
    for i in range(FUNCS):
        evil = "\\x1b[31m;<b>\\n" if i % 7 == 0 else ""  # an escape, a frame separator, a line break
        funcs.append(named(SRC, f"f{i}_{evil}" + "x" * NAME, funcs=funcs, time=time))

    def chains():
        rng = random.Random()
        while True:
            funcs[rng.randrange(len(funcs))](rng.randrange(3, 12), rng)

    DOWN = "def _f(n):\\n    return chain[n % len(chain)](n - 1) if n else idle()\\n"
    def idle():
        while True:
            time.sleep(0.001)
    deep_long, deep_short = [], []
    for i in range(50):
        deep_long.append(named(DOWN, f"d{i}_" + "y" * NAME, chain=deep_long, idle=idle))
        deep_short.append(named(DOWN, f"s{i}", chain=deep_short, idle=idle))
    sys.setrecursionlimit(10000)
    for _ in range(4):
        threading.Thread(target=chains, daemon=True).start()
    threading.Thread(target=deep_long[0], args=(DEEP,), daemon=True).start()
    threading.Thread(target=deep_short[0], args=(700,), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()
""")


def _hostile(name_chars: int, funcs: int, deep: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOSTILE, str(name_chars), str(funcs), str(deep)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_hostile_frame_names_are_bounded_when_py_spys_output_is_parsed(require_root) -> None:
    # Names just under py-spy's own read limit (it drops longer ones), so they reach the parser.
    target = _hostile(3000, 2000, 600)
    limits = StackLimits(max_stacks=30)
    sampler = PySpySampler(target.pid, rate_hz=10, segment_seconds=1, start_time=read_start_time(target.pid),
                           allowed_uids=frozenset({0}), stack_limits=limits)
    try:
        deadline = time.monotonic() + 120
        while sampler.health().detail["segments"] < 3:
            assert time.monotonic() < deadline, f"py-spy recorded too little: {sampler.health()}"
            time.sleep(0.2)
        reading = sampler.read()
        cut = sampler.health().detail["stack_limits_cut"]
    finally:
        sampler.close()
        target.kill()
        target.wait()
    stacks = {**reading.active, **reading.idle}
    frames = [frame for stack in stacks for frame in stack.split(";")]
    assert max(map(len, frames)) <= limits.max_frame_len, "a frame name longer than the limit was kept"
    assert max(len(stack.split(";")) for stack in stacks) <= limits.max_depth
    assert len(set(reading.active) | set(reading.idle)) <= limits.max_stacks + 1
    assert TRUNCATED in stacks
    # Each limit was met by what the target made: names, a line over 1 MiB, 700 frames, ever-new stacks.
    assert cut["long_frames"] > 0 and cut["long_lines"] > 0 and cut["deep_stacks"] > 0, cut
    assert cut["dropped_stacks"] > 0 and cut["dropped_samples"] > 0, cut
    # py-spy prints a name's line break as it is: the halves are skipped and counted, the segment is kept (it
    # used to be lost whole, so such a target had no stacks at all).
    assert cut["bad_lines"] > 0, cut
    assert not any("\x1b" in f and len(f) > limits.max_frame_len for f in frames)


def test_pyspy_stops_at_its_limits_instead_of_growing_with_the_target(require_root) -> None:
    # Unlimited, py-spy 0.4.3 grew to 1 GB in one 5 s segment at 49 Hz with 600-frame stacks of such names.
    # Which of its two bounds stops it first depends on the host: its address space (512 MiB) did until
    # 2026-12-04, when on that day's host its output passed the file size bound (32 MiB, SIGXFSZ) first in every
    # segment, alone and in the suite. Either one stops it; neither may let it grow past its address space.
    target = _hostile(4000, 3000, 1500)
    sampler = PySpySampler(target.pid, rate_hz=49, segment_seconds=5, start_time=read_start_time(target.pid),
                           allowed_uids=frozenset({0}))
    peak = 0
    bounds = (f"{ADDRESS_SPACE_BYTES >> 20} MiB address space limit", f"{OUTPUT_MAX_BYTES >> 20} MiB file size limit")
    try:
        deadline = time.monotonic() + 180
        while not any(bound in (sampler.health().reason or "") for bound in bounds):
            assert time.monotonic() < deadline, f"py-spy never reached its limit: {sampler.health()}"
            for pid in sampler.child_pids():
                try:
                    peak = max(peak, psutil.Process(pid).memory_info().vms)
                except psutil.Error:
                    continue
            time.sleep(0.05)
        health = sampler.health()
    finally:
        sampler.close()
        target.kill()
        target.wait()
    assert any(bound in health.reason for bound in bounds), health.reason
    assert health.detail["lost_seconds"] >= 5 and health.state == "running"  # lost, counted, retried
    assert 0 < peak <= ADDRESS_SPACE_BYTES

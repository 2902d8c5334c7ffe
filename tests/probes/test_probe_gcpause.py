"""Tests for probes/gcpause.py and probes/libpython.py against real interpreters and their own gc.callbacks."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.errors import TargetGone, Unsupported
from probes.gcpause import GcPauseConfig, GcPauseProbe, render
from probes.libpython import find_python_image, read_elf_symbols

PYENV = Path("/root/.pyenv/versions")
DEBIAN_PYTHON = Path("/usr/bin/python3.11")

# Counts and times its own collections with gc.callbacks: the ground truth. Automatic collection
# is off while the callback is not installed, so no collection escapes the child's count.
# Version-agnostic (3.6+): no f-strings with '=', no walrus.
GC_CHILD = r"""
import gc, sys, time
gc.disable()
print("ready")
sys.stdout.flush()
state = {"n": 0, "total": 0.0, "t0": 0.0}
def cb(phase, info):
    if phase == "start":
        state["t0"] = time.perf_counter()
    else:
        state["n"] += 1
        state["total"] += time.perf_counter() - state["t0"]
for line in sys.stdin:
    gc.callbacks.append(cb)
    gc.enable()
    keep = [[i] for i in range(200000)]   # a big heap: full collections take milliseconds
    for _ in range(30):
        gc.collect()
    for _ in range(100000):               # allocation-driven generation 0/1 collections
        a = [[]]
        a[0].append(a)
    del keep
    gc.disable()
    gc.callbacks.remove(cb)
    print(state["n"], repr(state["total"]))
    sys.stdout.flush()
    state["n"], state["total"] = 0, 0.0
"""


def _spawn_gc_child(python: str) -> subprocess.Popen:
    child = subprocess.Popen([python, "-c", GC_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def _round(child: subprocess.Popen) -> tuple[int, float]:
    child.stdin.write("go\n")
    child.stdin.flush()
    count, seconds = child.stdout.readline().split()
    return int(count), float(seconds)


def _finish(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(timeout=10)


def test_render_and_config() -> None:
    text = render(GcPauseConfig(max_targets=5, max_threads=7))
    assert text.startswith("#define MAX_TARGETS 5\n#define MAX_THREADS 7\n")
    assert "int gc_start(struct pt_regs *ctx)" in text and "int gc_done(struct pt_regs *ctx)" in text
    with pytest.raises(ValueError, match="max_threads.*0"):
        GcPauseConfig(max_threads=0)


def test_finds_this_venvs_shared_libpython_and_its_gc_symbol(python_exe) -> None:
    child = _spawn_gc_child(python_exe)
    try:
        image = find_python_image(child.pid)
        # As root, through map_files: exactly the file the process maps, whatever its path names by now.
        assert image.host_path.parent == Path(f"/proc/{child.pid}/map_files")
        assert os.stat(image.host_path).st_ino == os.stat(image.path).st_ino
    finally:
        _finish(child)
    assert image.shared
    assert image.version == (3, 11)
    assert image.path.endswith("/libpython3.11.so.1.0")
    assert image.gc_symbols == ("gc_collect_main",)
    assert not image.has_gc_usdt


def test_reads_usdt_notes_and_semaphores_of_debians_static_python() -> None:
    if not DEBIAN_PYTHON.exists():
        pytest.skip(f"{DEBIAN_PYTHON} is not installed (Debian's python3.11 package)")
    symbols = read_elf_symbols(DEBIAN_PYTHON)
    probes = {p.name: p for p in symbols.usdt if p.provider == "python"}
    # Cross-checked with `readelf -n /usr/bin/python3.11`: Location 0x4287f3, Semaphore 0xa8426e.
    assert {"gc__start", "gc__done", "function__entry"} <= set(probes)
    start = probes["gc__start"]
    assert start.semaphore and start.semaphore_offset and start.pc_offset
    assert "Py_Initialize" in symbols.functions
    assert "gc_collect_main" not in symbols.functions  # stripped: the USDT path is the only way


def test_not_python_and_gone_targets_are_domain_errors() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.05)
        with pytest.raises(Unsupported, match=r"not a Python interpreter.*Py_Initialize"):
            find_python_image(child.pid)
    finally:
        _finish(child)
    with pytest.raises(TargetGone, match=str(child.pid)):
        find_python_image(child.pid)


def test_stripped_libpython_is_unsupported_with_the_reason(tmp_path) -> None:
    """A fixture /proc tree whose process maps a stripped copy of this machine's libpython."""
    if shutil.which("strip") is None:
        pytest.fail("strip (binutils) is missing; 'make setup' installs gcc, which brings it")
    lib = PYENV / "3.11.7/lib/libpython3.11.so.1.0"
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    subprocess.run(["strip", "-o", str(root / "lib/libpython3.11.so.1.0"), str(lib)], check=True)
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "maps").write_text("7f0000000000-7f0000100000 r-xp 00000000 fe:01 42 /lib/libpython3.11.so.1.0\n")
    (proc / "root").symlink_to(root)
    (proc / "exe").symlink_to("/usr/bin/python3.11")
    with pytest.raises(Unsupported, match=r"CPython 3\.11.*neither USDT.*gc_collect_main.*stripped"):
        find_python_image(4242, proc_root=tmp_path / "proc")
    (proc / "maps").write_text("7f0000000000-7f0000100000 r-xp 00000000 fe:01 42 "
                               "/lib/libpython3.11.so.1.0 (deleted)\n")
    with pytest.raises(Unsupported, match="replaced on disk"):
        find_python_image(4242, proc_root=tmp_path / "proc")


def _assert_matches_child(probe: GcPauseProbe, pid: int, count: int, seconds: float) -> None:
    reading = probe.read()[pid]
    assert reading.collections == count  # exactly
    assert reading.pause_seconds == pytest.approx(seconds, rel=0.10)
    assert reading.histogram.total() == count
    assert 0 < reading.max_pause_seconds <= reading.pause_seconds


@pytest.mark.bpf
def test_shared_libpython_counts_exactly_what_gc_callbacks_count(require_bpf, python_exe) -> None:
    child = _spawn_gc_child(python_exe)
    probe = GcPauseProbe()
    try:
        probe.start([child.pid])
        assert probe.method(child.pid) == "uprobe"
        probe.read()
        for _ in range(2):  # two windows: counters restart per window
            count, seconds = _round(child)
            assert count > 100  # the allocation loop really drove collections
            _assert_matches_child(probe, child.pid, count, seconds)
        health = probe.health()
    finally:
        probe.stop()
        _finish(child)
    assert health.state == "running" and health.lost_events == 0 and health.targets == 1


@pytest.mark.bpf
def test_static_python_through_usdt_counts_exactly(require_bpf) -> None:
    if not DEBIAN_PYTHON.exists():
        pytest.skip(f"{DEBIAN_PYTHON} is not installed (Debian's python3.11 package)")
    ldd = subprocess.run(["ldd", str(DEBIAN_PYTHON)], capture_output=True, text=True, check=True).stdout
    assert "libpython" not in ldd, f"{DEBIAN_PYTHON} is expected to be statically linked: {ldd}"
    semaphore = next(p.semaphore for p in read_elf_symbols(DEBIAN_PYTHON).usdt if p.name == "gc__start")
    child = _spawn_gc_child(str(DEBIAN_PYTHON))
    probe = GcPauseProbe()
    try:
        # A non-PIE executable: the link-time address is the address in the process.
        assert _read_u16(child.pid, semaphore) == 0
        probe.start([child.pid])
        assert probe.method(child.pid) == "usdt"
        assert _read_u16(child.pid, semaphore) == 1  # raised by the kernel (uprobe ref_ctr_offset)
        probe.read()
        count, seconds = _round(child)
        _assert_matches_child(probe, child.pid, count, seconds)
        probe.stop()
        assert _read_u16(child.pid, semaphore) == 0  # and lowered again on detach
    finally:
        probe.stop()
        _finish(child)


def _read_u16(pid: int, address: int) -> int:
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(address)
        return int.from_bytes(mem.read(2), "little")


@pytest.mark.bpf
@pytest.mark.parametrize("version", ["3.8.18", "3.12.1", "3.13.0"])
def test_other_cpython_versions_count_exactly(require_bpf, version) -> None:
    """3.8 runs its collector in two compiler clones (collect.constprop.0/1); 3.12 and 3.13 in gc_collect_main."""
    python = PYENV / version / "bin" / f"python{version.rsplit('.', 1)[0]}"
    if not python.exists():
        pytest.skip(f"{python} is not installed on this machine (pyenv)")
    child = _spawn_gc_child(str(python))
    probe = GcPauseProbe()
    try:
        probe.start([child.pid])
        probe.read()
        count, seconds = _round(child)
        _assert_matches_child(probe, child.pid, count, seconds)
    finally:
        probe.stop()
        _finish(child)


@pytest.mark.bpf
def test_target_that_is_not_python_is_unsupported(require_bpf) -> None:
    child = subprocess.Popen(["sleep", "100"])
    probe = GcPauseProbe()
    try:
        time.sleep(0.05)
        with pytest.raises(Unsupported, match=rf"pid {child.pid} \(.*sleep\) is not a Python interpreter"):
            probe.start([child.pid])
        health = probe.health()
    finally:
        probe.stop()
        _finish(child)
    assert health.state == "unsupported"
    assert "not a Python interpreter" in health.reason


@pytest.mark.bpf
def test_targets_added_and_removed_without_reload(require_bpf, python_exe) -> None:
    first, second = _spawn_gc_child(python_exe), _spawn_gc_child(python_exe)
    sleeper = subprocess.Popen(["sleep", "100"])
    probe = GcPauseProbe()
    try:
        probe.start([first.pid])
        loaded = probe._bpf
        with pytest.raises(Unsupported, match=str(sleeper.pid)):
            probe.set_targets([first.pid, second.pid, sleeper.pid])
        assert probe.health().state == "running" and probe.health().targets == 2
        probe.read()
        counts = {pid: _round(child) for pid, child in ((first.pid, first), (second.pid, second))}
        readings = probe.read()
        assert {pid: r.collections for pid, r in readings.items()} == {pid: c for pid, (c, _) in counts.items()}
        probe.set_targets([second.pid])
        _round(first)  # collects, but is no longer a target
        count, _ = _round(second)
        readings = probe.read()
        assert set(readings) == {second.pid} and readings[second.pid].collections == count
        _finish(second)
        assert probe.read() == {}  # an exited target is dropped, not an error
        assert probe._bpf is loaded
    finally:
        probe.stop()
        for child in (first, second, sleeper):
            _finish(child)
    assert probe.health().state == "stopped"
    probe.stop()  # idempotent


@pytest.mark.bpf
def test_an_unexpected_error_locating_one_target_costs_only_that_target(require_bpf, python_exe) -> None:
    """A surprise from one target's lookup (a parser bug its file reaches) is raised only after every other target
    is attached, and leaves that target unsupported with the reason."""
    bad, good = _spawn_gc_child(python_exe), _spawn_gc_child(python_exe)

    def locate(pid: int, proc: Path):
        if pid == bad.pid:
            raise struct.error("unpack_from requires a buffer of at least 64 bytes")
        return find_python_image(pid, proc)

    probe = GcPauseProbe(locate=locate)
    try:
        with pytest.raises(struct.error):
            probe.start([bad.pid, good.pid])
        health = probe.health()
        probe.read()
        count, _ = _round(good)
        _round(bad)
        readings = probe.read()
    finally:
        probe.stop()
        _finish(bad)
        _finish(good)
    assert health.state == "running" and health.targets == 1
    assert health.unsupported == {bad.pid: "attaching failed unexpectedly: struct.error: unpack_from requires a "
                                           "buffer of at least 64 bytes"}
    assert set(readings) == {good.pid} and readings[good.pid].collections == count


def test_no_root_needed_to_locate(python_exe) -> None:
    """Locating the image works for any user who may read the target's /proc files."""
    assert find_python_image(os.getpid()).version == sys.version_info[:2]


# A family parent driven over stdin: it collects itself, or forks a child that collects and ends at once (short), one
# that collects and stays (long), or one that execs a program that is not Python (exec). Prints each child's pid.
FAMILY_PARENT = r"""
import gc, os, sys, time
gc.disable()
print("ready", flush=True)
for line in sys.stdin:
    cmd, n = line.split()
    n = int(n)
    if cmd == "self":
        for _ in range(n):
            gc.collect()
        print(os.getpid(), flush=True)
    elif cmd == "short":
        pid = os.fork()
        if pid == 0:
            for _ in range(n):
                gc.collect()
            os._exit(0)
        os.waitpid(pid, 0)
        print(pid, flush=True)
    elif cmd == "long":
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            for _ in range(n):
                gc.collect()
            os.write(w, b"x")
            time.sleep(3600)
            os._exit(0)
        os.read(r, 1)
        print(pid, flush=True)
    elif cmd == "grand":  # a child whose own child collects; both end before the next read
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            grand = os.fork()
            if grand == 0:
                for _ in range(n):
                    gc.collect()
                os._exit(0)
            os.waitpid(grand, 0)
            os.write(w, str(grand).encode().ljust(16))
            os._exit(0)
        os.waitpid(pid, 0)
        print(int(os.read(r, 16)), pid, flush=True)
    elif cmd == "heap":
        keep = [[i] for i in range(n)]  # full collections of it take a few hundred ms
        print(os.getpid(), flush=True)
    elif cmd == "exec":
        pid = os.fork()
        if pid == 0:
            os.execv("/bin/sleep", ["sleep", "3600"])
        print(pid, flush=True)
"""

# Not a target, on the same interpreter and libpython as the family: collects without pause the whole time.
STRANGER = r"""
import gc, time
gc.disable()
while True:
    gc.collect()
    time.sleep(0.0005)
"""


def _ask(parent: subprocess.Popen, line: str) -> int:
    parent.stdin.write(line + "\n")
    parent.stdin.flush()
    return int(parent.stdout.readline())


def _wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.bpf
@pytest.mark.parametrize("interpreter", ["shared libpython", "static with USDT"])
def test_a_followed_family_counts_its_forks_exactly_and_never_a_stranger_on_the_same_image(require_bpf, python_exe,
                                                                                            interpreter) -> None:
    """Followed, the parent is counted by its image's system-wide uprobes (USDT sites for Debian's static python):
    they fire in its forks, and in every other process running that file, which the in-kernel filter leaves out."""
    if interpreter == "static with USDT":
        if not DEBIAN_PYTHON.exists():
            pytest.skip(f"{DEBIAN_PYTHON} is not installed (Debian's python3.11 package)")
        python_exe = str(DEBIAN_PYTHON)
    parent = subprocess.Popen([python_exe, "-c", FAMILY_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    stranger = subprocess.Popen([python_exe, "-c", STRANGER])
    assert parent.stdout.readline().strip() == "ready"
    kids: list[int] = []
    probe = GcPauseProbe()
    try:
        probe.start([parent.pid])
        assert probe.method(parent.pid) == ("usdt" if interpreter == "static with USDT" else "uprobe")
        assert not probe.shared(parent.pid)  # not followed: uprobes bound to its pid, as for any single process
        probe.set_followed([parent.pid])
        assert probe.shared(parent.pid) and probe.health().detail["shared_images"] == 1
        probe.read()
        _ask(parent, "self 5")
        short = _ask(parent, "short 7")  # lives a few ms and ends between two reads
        # Out of the filter at its exit, before its pid can be reused, and flagged so that no pidfd is taken for it.
        assert probe._bpf[b"targets"].get(probe._bpf[b"targets"].Key(short)) is None
        assert probe._bpf[b"newborn"][probe._bpf[b"newborn"].Key(short)].exited == 1
        long = _ask(parent, "long 9")
        execd = _ask(parent, "exec 0")
        parent.stdin.write("grand 3\n")
        parent.stdin.flush()
        grand, middle = (int(w) for w in parent.stdout.readline().split())
        kids += [long, execd]
        _wait_for(lambda: os.readlink(f"/proc/{execd}/exe").endswith("sleep"))
        first = probe.read()
        children = probe.children()
        second_self = _ask(parent, "self 4")
        second = probe.read()
        probe.set_followed([])  # followed no more: back on uprobes of its own, exactly one set counting it
        assert not probe.shared(parent.pid)
        _ask(parent, "self 3")
        third = probe.read()
        health = probe.health()
        totals = {int(k.value) for k in probe._bpf[b"totals"].keys()}
    finally:
        probe.stop()
        for pid in kids:
            os.kill(pid, 9)
        _finish(parent)
        _finish(stranger)
    assert second_self == parent.pid
    assert {pid: r.collections for pid, r in first.items()} == {parent.pid: 5, short: 7, long: 9, middle: 0, grand: 3}
    assert execd not in first and "exec'd a program gc cannot trace" in health.unsupported[execd]
    assert children == {short: parent.pid, long: parent.pid, execd: parent.pid, middle: parent.pid, grand: middle}
    # The short child went out once, with its whole life's counts; the stranger was never counted at all.
    assert {pid: r.collections for pid, r in second.items()} == {parent.pid: 4, long: 0}
    assert {pid: r.collections for pid, r in third.items()} == {parent.pid: 3, long: 0}
    assert stranger.pid not in totals and short not in totals
    assert health.lost_events == 0 and health.detail["followed_children_missed"] == 0


def _take_pid(pid: int, argv: list[str]) -> subprocess.Popen | None:
    """`argv` started with exactly `pid` (the host's ns_last_pid set right before the fork); None when another
    process took the pid first."""
    for _ in range(20):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(argv)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
        if os.path.exists(f"/proc/{pid}"):
            return None
    return None


@pytest.mark.bpf
def test_a_placed_child_whose_pid_is_reused_before_the_read_reports_only_its_own_life(require_bpf,
                                                                                       python_exe) -> None:
    """A followed child ends, and a stranger on the same libpython takes its pid before the next read: the child is
    reported once with its own 7 collections, no pidfd is taken for the stranger, and the stranger's collections
    (reached by the same system-wide uprobes) are never counted."""
    parent = subprocess.Popen([python_exe, "-c", FAMILY_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout.readline().strip() == "ready"
    probe = GcPauseProbe()
    stranger = None
    try:
        probe.start([parent.pid])
        probe.set_followed([parent.pid])
        for _ in range(5):  # another process on the host may fork between and take the pid: again, new child
            short = _ask(parent, "short 7")
            stranger = _take_pid(short, [python_exe, "-c", STRANGER])
            if stranger is not None:
                break
            probe.read()  # the lost attempt's child goes out, and is dropped at the next read
        else:
            pytest.fail("another process took the child's pid first, 5 times")
        time.sleep(0.3)  # the stranger collects hundreds of times meanwhile
        first = probe.read()
        held = probe._attached[short].handle
        second = probe.read()
        third = probe.read()
        in_filter = probe._bpf[b"targets"].get(probe._bpf[b"targets"].Key(short))
    finally:
        probe.stop()
        _finish(parent)
        if stranger is not None:
            _finish(stranger)
    assert first[short].collections == 7 and held is None
    assert short not in second and short not in third and in_filter is None


@pytest.mark.bpf
def test_a_collection_running_while_its_process_is_switched_is_counted_once(require_bpf, python_exe) -> None:
    """Per-pid to shared uprobes and back, each switch made in the middle of a ~0.3 s collection: the uprobes it
    entered by stay attached until the next read and count it, the other set leaves it alone."""
    parent = subprocess.Popen([python_exe, "-c", FAMILY_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout.readline().strip() == "ready"
    probe = GcPauseProbe()
    counts, modes = [], []
    try:
        probe.start([parent.pid])
        _ask(parent, "heap 1000000")
        probe.read()
        for follow in ([parent.pid], [], [parent.pid]):
            parent.stdin.write("self 1\n")
            parent.stdin.flush()
            time.sleep(0.05)  # inside the collection
            probe.set_followed(follow)
            assert int(parent.stdout.readline()) == parent.pid
            counts.append(probe.read()[parent.pid].collections)
            modes.append(probe.shared(parent.pid))
        health = probe.health()
    finally:
        probe.stop()
        _finish(parent)
    assert counts == [1, 1, 1] and modes == [True, False, True]
    assert health.lost_events == 0

"""The neighbours of `memory.toml` and `disk.toml` do what they say to a real process and disk, and leave nothing
behind: memsqueeze makes a process read its own file pages back from disk (major faults) from a memory-limited
family cgroup, and puts it back; diskhog writes and fsyncs, and its file is gone."""

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Reads through a file mapping again and again: its working set is the file's pages. It says when the first pass is
# done: only pages it has mapped can be paged out of it (process_madvise walks its page tables).
READER = """
import mmap, sys, time
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
total, passes = 0, 0
while True:
    for offset in range(0, len(m), 4096):
        total += m[offset]
    passes += 1
    if passes == 1:
        print("read", flush=True)
    time.sleep(0.01)
"""


def _major_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[9])


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def _memory_cgroup(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    v1 = [line.split(":", 2)[2] for line in lines if "memory" in line.split(":", 2)[1].split(",")]
    return v1[0] if v1 else next(line[3:] for line in lines if line.startswith("0::"))


@pytest.mark.flaky(reruns=1, reason="once in CI's full suite the reader read back no page in 40 s; not reproduced "
                   "here (also with the squeeze started 50 ms after the reader): a failure prints what the squeeze said")
def test_memsqueeze_makes_the_process_read_its_pages_back_and_puts_it_back(require_root, tmp_path):
    data = Path("/var/tmp") / f"infersight-test-squeeze-{os.getpid()}"
    with open(data, "wb") as f:  # on a disk: pages of tmpfs are never read back
        f.write(os.urandom(64 << 20))
        f.flush()
        os.fsync(f.fileno())  # clean pages, which the kernel may drop and read again
    reader = subprocess.Popen([sys.executable, "-c", READER, str(data)], stdout=subprocess.PIPE, text=True)
    squeeze = None
    try:
        # The whole file is mapped once before the squeeze starts. A fixed sleep was not enough on CI's busy host
        # (2 s): the squeeze paged out a mapping not yet touched, the reader then mapped the pages still cached in
        # its old cgroup, and never read one back (0 major faults in 40 s).
        ready, _, _ = select.select([reader.stdout], [], [], 60)
        assert ready and reader.stdout.readline().strip() == "read", "the reader did not read its file in 60 s"
        home = _memory_cgroup(reader.pid)
        before = _major_faults(reader.pid)
        squeeze = subprocess.Popen([sys.executable, str(HERE / "memsqueeze.py"), str(reader.pid), "60", "20", "2000"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 40
        while _major_faults(reader.pid) - before < 200 and squeeze.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert squeeze.poll() is None, squeeze.communicate()[0]
        if _major_faults(reader.pid) - before < 200:  # what the squeeze saw, for the report
            squeeze.send_signal(signal.SIGTERM)
            said = squeeze.communicate(timeout=30)[0]
            pytest.fail(f"the reader read back {_major_faults(reader.pid) - before} pages in 40 s (>= 200 expected): "
                        f"the squeeze said:\n{said}")
        assert f"infersight_eval_mem_{reader.pid}/server" in _memory_cgroup(reader.pid)
        assert _rss(squeeze.pid) >= 16 << 20  # the neighbour is who grew
        squeeze.send_signal(signal.SIGTERM)
        said = squeeze.communicate(timeout=30)[0]
        assert squeeze.returncode == 0, said
        assert reader.poll() is None, said  # nothing was killed
        assert _memory_cgroup(reader.pid) == home, said
        assert "cannot remove" not in said and "family capped at" in said, said
    finally:
        for proc in (squeeze, reader):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        data.unlink()


def test_diskhog_writes_and_syncs_and_leaves_no_file(tmp_path):
    out = subprocess.run([sys.executable, str(HERE / "diskhog.py"), "1.5", str(tmp_path), "64", "1", "4", "8"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    synced = int(out.stdout.split()[3])
    assert 16 <= synced <= 8 * 64, out.stdout  # paced: about 1.5 s at 64 MiB/s, each fsync'd 4 MiB counted
    assert list(tmp_path.iterdir()) == []


def test_diskhog_refuses_sizes_that_do_not_nest(tmp_path):
    out = subprocess.run([sys.executable, str(HERE / "diskhog.py"), "1", str(tmp_path), "64", "8", "4"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "need 0 < CHUNK_MIB <= SYNC_MIB <= FILE_MIB" in out.stderr
    assert list(tmp_path.iterdir()) == []

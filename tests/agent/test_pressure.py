"""The pressure source: PSI deltas of the host and the target's cgroup, major faults, reclaim; None with a reason."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.sources.pressure import NO_PSI, PressureSource, parse_pressure
from analysis.errors import TargetGone

PSI = "some avg10=0.00 avg60=0.00 avg300=0.00 total={some}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total={full}\n"


def _psi(directory: Path, pattern: str, some: int, full: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for r in ("cpu", "memory", "io"):
        (directory / pattern.format(r)).write_text(PSI.format(some=some, full=full))


def _proc(tmp_path: Path, majflt: int = 5, cgroup: str = "0::/system.slice/srv.service\n", pgsteal: int = 100) -> Path:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True, exist_ok=True)
    fields = ["S"] + ["0"] * 8 + [str(majflt)] + ["0"] * 30  # field 12 (majflt) is the 10th after the comm
    (proc / "42" / "stat").write_text(f"42 (srv) {' '.join(fields)}\n")
    (proc / "42" / "cgroup").write_text(cgroup)
    (proc / "vmstat").write_text(f"nr_free_pages 1\npgsteal_kswapd {pgsteal}\npgsteal_direct 1\n")
    return proc


def test_deltas_of_host_and_cgroup_in_seconds_with_faults_and_reclaim(tmp_path):
    proc = _proc(tmp_path)
    cg = tmp_path / "cg"
    _psi(proc / "pressure", "{}", 1_000_000, 0)
    _psi(cg / "system.slice" / "srv.service", "{}.pressure", 2_000_000, 500_000)
    source = PressureSource(42, proc_root=proc, cgroup_mounts=(tmp_path / "nowhere", cg))
    _psi(proc / "pressure", "{}", 1_250_000, 0)
    _psi(cg / "system.slice" / "srv.service", "{}.pressure", 4_000_000, 1_500_000)
    _proc(tmp_path, majflt=12, pgsteal=400)
    r = source.read()
    assert r.host["memory"] == {"some": 0.25, "full": 0.0}
    assert r.cgroup["io"] == {"some": 2.0, "full": 1.0}
    assert r.cgroup_path == "/system.slice/srv.service"
    assert r.major_faults == 7 and r.reclaimed_pages == 300 and r.reasons == {}


def test_a_kernel_without_psi_gives_none_and_says_why_never_zero(tmp_path):
    proc = _proc(tmp_path)
    source = PressureSource(42, proc_root=proc, cgroup_mounts=(tmp_path / "cg",))
    r = source.read()
    assert r.host is None and r.cgroup is None
    assert r.reasons["host"] == NO_PSI and r.reasons["cgroup"] == NO_PSI
    assert r.writers is None and "no PSI" in r.reasons["writers"]  # nobody named without the stall to name them by
    assert r.major_faults == 0 and r.reclaimed_pages == 0  # those do not need PSI


def test_psi_switched_off_refuses_reads_and_is_a_reason(tmp_path):
    # psi=0: the files may be there but reading them fails (EOPNOTSUPP); a directory in their place fails alike.
    proc = _proc(tmp_path)
    for r in ("cpu", "memory", "io"):
        (proc / "pressure" / r).mkdir(parents=True)
    r = PressureSource(42, proc_root=proc, cgroup_mounts=(tmp_path / "cg",)).read()
    assert r.host is None and r.reasons["host"].startswith("/proc/pressure unreadable")


def test_a_cgroup_v1_only_host_has_host_psi_but_no_cgroup_figure(tmp_path):
    proc = _proc(tmp_path, cgroup="4:memory:/x\n1:cpu:/\n")
    _psi(proc / "pressure", "{}", 1, 0)
    source = PressureSource(42, proc_root=proc, cgroup_mounts=(tmp_path / "cg",))
    r = source.read()
    assert r.host is not None and r.cgroup is None and "cgroup v1-only" in r.reasons["cgroup"]


def test_a_target_that_moved_cgroup_has_no_cgroup_delta(tmp_path):
    proc = _proc(tmp_path)
    cg = tmp_path / "cg"
    _psi(cg / "system.slice" / "srv.service", "{}.pressure", 10, 0)
    _psi(cg / "other", "{}.pressure", 99_000_000, 0)
    source = PressureSource(42, proc_root=proc, cgroup_mounts=(cg,))
    _proc(tmp_path, cgroup="0::/other\n")
    r = source.read()
    assert r.cgroup is None and "moved to cgroup /other" in r.reasons["cgroup"]


def test_a_gone_target_is_target_gone(tmp_path):
    proc = _proc(tmp_path)
    source = PressureSource(42, proc_root=proc, cgroup_mounts=(tmp_path / "cg",))
    for f in (proc / "42").iterdir():
        f.unlink()
    (proc / "42").rmdir()
    with pytest.raises(TargetGone):
        source.read()


def test_a_malformed_pressure_line_is_an_error_quoting_it():
    with pytest.raises(ValueError, match="bogus"):
        parse_pressure("bogus line\n")


def test_on_this_kernel_a_process_that_faults_its_pages_back_is_counted():
    """Real /proc and cgroupfs: PSI of the host and of the process's own cgroup, and the major faults of a child
    that maps a file it dropped from the page cache (each first touch of a page reads the disk)."""
    if not Path("/proc/pressure/cpu").exists():
        pytest.fail("this kernel has no PSI; the CI machine's has (docs/kernel.md)")
    code = ("import mmap, os, sys, tempfile\n"
            "f = tempfile.TemporaryFile(); f.write(os.urandom(8 << 20)); f.flush(); os.fsync(f.fileno())\n"
            "os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)\n"
            "print('ready', flush=True); sys.stdin.readline()\n"
            "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
            "s = sum(m[i] for i in range(0, len(m), 4096))\n"
            "print('done', flush=True); sys.stdin.readline()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        source = PressureSource(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        time.sleep(0.1)
        r = source.read()
    finally:
        child.kill()
        child.wait()
    assert set(r.host) == {"cpu", "memory", "io"} and all(v >= 0 for d in r.host.values() for v in d.values())
    assert r.cgroup is not None, r.reasons
    assert r.major_faults >= 1, r  # the dropped pages came back from the disk
    assert r.reclaimed_pages is not None

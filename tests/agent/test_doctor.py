"""doctor: real checks on this host, and each failure path with injected fake roots."""

import json
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from agent import doctor
from agent.doctor import FAIL, PASS, WARN, Host


def _fake_tracefs(root: Path, tracepoints=doctor.PROBE_TRACEPOINTS, uprobes=True) -> Path:
    for tp in tracepoints:
        category, event = tp.split(":")
        (root / "events" / category / event).mkdir(parents=True)
    if uprobes:
        (root / "uprobe_events").touch()
    return root


def _by_name(results):
    return {r.name: r for r in results}


@pytest.mark.bpf
def test_real_host_passes_every_required_check(require_bpf):
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "doctor"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all required checks passed" in proc.stdout
    assert "counted 1000/1000 getppid calls" in proc.stdout
    assert "attached to a child process" in proc.stdout


@pytest.mark.bpf
def test_real_host_json_lists_every_check(require_bpf):
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "doctor", "--json"],
                          capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    names = {c["name"] for c in report["checks"]}
    for tp in doctor.PROBE_TRACEPOINTS:
        assert f"tracepoint {tp}" in names
    assert {"root", "kernel", "tracefs", "btf", "uprobes", "kprobes", "kernel headers", "bcc",
            "bpf program", "py-spy", "torch"} <= names
    probes = {c["name"]: c for c in report["checks"] if c["name"].startswith("probe ")}
    assert set(probes) == {"probe syscalls", "probe offcpu", "probe gc", "probe tcp", "probe runqueue", "probe delivery",
                           "probe exits"}
    assert all(c["status"] == "ok" for c in probes.values()), probes


def test_doctor_checks_every_hook_the_probes_use():
    assert set(doctor.PROBE_TRACEPOINTS) == {
        "raw_syscalls:sys_enter", "raw_syscalls:sys_exit", "sched:sched_switch", "sched:sched_wakeup",
        "sched:sched_wakeup_new", "tcp:tcp_retransmit_skb", "tcp:tcp_retransmit_synack",
        "task:task_newtask",  # families: a member's forks are followed in the kernel
        # delivery (docs/delivery.md)
        "sock:sock_send_length", "sock:sock_recv_length", "tcp:tcp_probe", "sock:inet_sock_set_state",
        "tcp:tcp_cong_state_set", "tcp:tcp_destroy_sock"}


def test_missing_tracepoint_fails_and_names_it(tmp_path):
    tracefs = _fake_tracefs(tmp_path / "tracing", tracepoints=[t for t in doctor.PROBE_TRACEPOINTS
                                                               if t != "tcp:tcp_retransmit_skb"])
    result = doctor.check_tracepoint(Host(tracefs=tracefs), "tcp:tcp_retransmit_skb")
    assert result.status == FAIL and result.failed
    assert "tcp_retransmit_skb" in result.detail
    assert result.fix


def test_unmounted_tracefs_fails_with_mount_fix(tmp_path):
    result = doctor.check_tracefs(Host(tracefs=tmp_path / "absent"))
    assert result.failed
    assert "mount -t tracefs" in result.fix


def test_missing_bcc_fails_and_points_to_setup():
    def no_bcc(name):
        raise ImportError(f"No module named {name!r}")

    host = Host(import_module=no_bcc, euid=lambda: 0)
    assert doctor.check_bcc(host).failed
    assert "make setup" in doctor.check_bcc(host).fix
    assert doctor.check_bpf_loads(host).failed


def test_not_root_is_a_clear_failure_not_a_traceback(tmp_path, capsys):
    host = Host(tracefs=_fake_tracefs(tmp_path / "tracing"), btf=tmp_path / "vmlinux",
                modules=tmp_path / "modules", euid=lambda: 1000, pyspy=None)
    (tmp_path / "vmlinux").touch()
    code = doctor.main(host=host)
    out = capsys.readouterr().out
    assert code == 1
    assert "running as uid 1000" in out and "sudo infersight doctor" in out
    assert "Traceback" not in out


def test_headers_missing_matching_and_mismatched(tmp_path):
    modules = tmp_path / "modules"
    host = Host(modules=modules, kernel_release="6.18.0-test")
    assert doctor.check_headers(host).failed

    (modules / "6.18.0-test").mkdir(parents=True)
    other = tmp_path / "usr/src/linux-headers-6.1.0-57-amd64"
    other.mkdir(parents=True)
    (modules / "6.18.0-test" / "build").symlink_to(other)
    mismatched = doctor.check_headers(host)
    assert mismatched.status == WARN and not mismatched.failed
    assert "mismatched" in mismatched.detail

    matching = tmp_path / "usr/src/linux-headers-6.18.0-test"
    matching.mkdir()
    (modules / "6.18.0-test" / "build").unlink()
    (modules / "6.18.0-test" / "build").symlink_to(matching)
    assert doctor.check_headers(host).status == PASS


def test_missing_uprobes_and_btf_fail(tmp_path):
    tracefs = _fake_tracefs(tmp_path / "tracing", uprobes=False)
    host = Host(tracefs=tracefs, btf=tmp_path / "nope")
    assert doctor.check_uprobes(host).failed
    assert doctor.check_btf(host).failed


def test_missing_pyspy_fails():
    result = doctor.check_pyspy(Host(pyspy=None))
    assert result.failed and "make setup" in result.fix


def test_exit_code_nonzero_when_a_requirement_is_removed(tmp_path, capsys):
    """The whole report on a host whose tracefs lacks one tracepoint: exit 1, the line names the fix."""
    tracefs = _fake_tracefs(tmp_path / "tracing", tracepoints=[t for t in doctor.PROBE_TRACEPOINTS
                                                               if t != "tcp:tcp_retransmit_skb"])
    host = Host(tracefs=tracefs, euid=lambda: 1000, pyspy=None)
    assert doctor.main(host=host) == 1
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if "tcp:tcp_retransmit_skb" in row)
    assert line.startswith("FAIL") and "fix:" in line


def test_a_probe_that_cannot_load_names_its_reason():
    from analysis.errors import TracepointMissing

    class Missing:
        def start(self, targets):
            raise TracepointMissing("tracepoint tcp:tcp_retransmit_skb does not exist in /sys/kernel/tracing/events")

    class Fine:
        def start(self, targets):
            self.started = list(targets)

        def stop(self):
            pass

    results = doctor.check_probes(Host(euid=lambda: 0), factories={"tcp": Missing, "syscalls": Fine})
    by = _by_name(results)
    assert by["probe tcp"].failed and "tcp_retransmit_skb does not exist" in by["probe tcp"].detail
    assert by["probe syscalls"].status == PASS


def test_gpu_is_never_a_failure_and_a_cpu_only_host_is_information(tmp_path):
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML starts on this host: it has a GPU")
    # This host: no driver and no /dev/nvidia*: said neutrally, not counted.
    result = doctor.check_gpu(Host())
    assert (result.status, result.failed) == (doctor.INFO, False)
    assert result.detail.startswith("no GPU on this host")
    # The same NVML failure where a device node exists: the GPU is there and unreadable, a warning with a fix.
    (tmp_path / "nvidia0").touch()
    broken = doctor.check_gpu(Host(dev=tmp_path))
    assert (broken.status, broken.failed) == (doctor.WARN, False)
    assert "/nvidia0" in broken.detail and broken.fix


def test_psi_present_missing_or_switched_off_is_said_never_a_failure(tmp_path):
    real = doctor.check_psi(Host())  # this kernel: PSI on, cgroup v2 mounted at /sys/fs/cgroup/unified
    assert real.status == PASS and "per cgroup" in real.detail
    missing = doctor.check_psi(Host(proc=tmp_path / "proc", cgroup=tmp_path / "cg"))
    assert missing.status == WARN and not missing.failed and "no pressure stall information" in missing.detail
    (tmp_path / "off" / "pressure" / "cpu").mkdir(parents=True)  # unreadable, as with psi=0
    off = doctor.check_psi(Host(proc=tmp_path / "off", cgroup=tmp_path / "cg"))
    assert off.status == WARN and "switched off" in off.detail and off.fix == "boot with psi=1"
    (tmp_path / "v1" / "pressure").mkdir(parents=True)
    (tmp_path / "v1" / "pressure" / "cpu").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n")
    host_only = doctor.check_psi(Host(proc=tmp_path / "v1", cgroup=tmp_path / "cg"))
    assert host_only.status == PASS and "host-wide only" in host_only.detail

"""`python -m probes NAME`: every probe's C renders, config overrides are typed, a real run prints windows."""

import json
import os
import subprocess
import sys

import pytest

from probes.__main__ import PROBES, build_config
from probes.syscalls import SyscallsConfig


@pytest.mark.parametrize("name", sorted(PROBES))
def test_every_probe_prints_its_c(name):
    proc = subprocess.run([sys.executable, "-m", "probes", name, "--print-c"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "#define" in proc.stdout


def test_set_parses_by_field_type_and_rejects_the_rest():
    assert build_config(SyscallsConfig, ["latency=true"]).latency is True
    with pytest.raises(ValueError, match="expects a bool, got 'maybe'"):
        build_config(SyscallsConfig, ["latency=maybe"])
    with pytest.raises(ValueError, match="KEY one of"):
        build_config(SyscallsConfig, ["nonsense=1"])


@pytest.mark.bpf
def test_a_real_tcp_run_prints_the_host_figures_of_the_probe_protocol(require_bpf):
    proc = subprocess.run([sys.executable, "-m", "probes", "tcp", "--pid", str(os.getpid()), "--count", "1",
                           "--interval", "0.3"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    window = json.loads(proc.stdout.splitlines()[0])
    assert window["host"]["retransmits"] >= 0 and isinstance(window["host"]["flows"], list)
    assert {"not_sent", "send_failed", "errors"} <= set(window)


@pytest.mark.bpf
def test_a_real_run_prints_one_json_line_per_window(require_bpf):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = subprocess.run([sys.executable, "-m", "probes", "offcpu", "--pid", str(sleeper.pid), "--count", "2",
                               "--interval", "0.5"], capture_output=True, text=True, timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and len(lines) == 3
    for window in lines[:2]:
        assert window["readings"][str(sleeper.pid)]["seconds"] == pytest.approx(0.5, abs=0.1)
    assert lines[2]["health"]["state"] == "running"

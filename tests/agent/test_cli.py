"""Bad command lines and bad config files: one clear line on stderr, exit status 2, no traceback."""

import os
import subprocess
import sys

import pytest


def infersight(*args, **kw):
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True,
                          timeout=60, **kw)


@pytest.mark.parametrize("args, says", [
    (["collect"], "--pid"),
    (["collect", "--pid", "abc"], "'abc'"),
    (["collect", "--pid", "1", "--interval", "0"], "'0'"),
    (["collect", "--pid", "1", "--interval", "61"], "'61'"),
    (["collect", "--pid", "1", "--probes", "syscalls,kprobes"], "kprobes"),
    (["collect", "--pid", "-5"], "-5"),
    (["collect", "--pid", "1", "--port", "80"], "argument --port: not allowed with argument --pid"),
    (["collect", "--port", "0"], "argument --port: must be within [1, 65535], got 0"),
    (["collect", "--unit", "vllm service"], "argument --unit: must be a systemd unit name"),
    (["collect", "--cgroup", "a/../b"], "argument --cgroup: must be a cgroup directory"),
    (["collect", "--cgroup", "/"], "argument --cgroup: names the root cgroup"),
    (["collect", "--container", "a b"], "argument --container: must be a container id or name prefix"),
    (["collect", "--unit", "vllm", "--children"], "--children goes with --pid"),
    (["loadtest", "--url", "http://127.0.0.1:1", "--port", "x"], "argument --port: expected an integer, got 'x'"),
    (["loadtest", "--url", "http://127.0.0.1:1", "--children"], "--children goes with --pid"),
    (["loadtest", "--url", "http://127.0.0.1:1", "--cgroup", "no/such/infersight-cg", "--no-probes", "--no-pyspy"],
     "the server is not running: cgroup '"),
    (["run", "--nope"], "--nope"),
    (["frobnicate"], "frobnicate"),
    ([], "COMMAND"),
])
def test_bad_arguments_one_line_exit_2(args, says):
    proc = infersight(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert says in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text, says", [
    ("interval_seconds = 0.5\n", "interval_seconds"),
    ("interval_second = 5\n", "did you mean 'interval_seconds'"),
    ("interval_seconds = 'fast'\n", "'fast'"),
    ("[[targets]]\nname = 'x'\n", "exactly one of pid, pidfile, process_regex"),
    ("[[targets]]\nname = 'x'\npid = 1\n[targets.latency]\nurl = 'ftp://h/m'\nmetric = 'm'\n", "ftp://h/m"),
    ("this is = = not toml\n", "TOML syntax error"),
])
def test_bad_config_one_line_exit_2(tmp_path, text, says):
    path = tmp_path / "infersight.toml"
    path.write_text(text)
    proc = infersight("run", "--config", str(path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("infersight: config error:") and says in lines[0]


def test_unreadable_config_exit_2(tmp_path):
    proc = infersight("run", "--config", str(tmp_path / "missing.toml"))
    assert proc.returncode == 2
    assert "cannot read config file" in proc.stderr and proc.stderr.count("\n") == 1


def test_world_writable_config_is_refused(tmp_path):
    path = tmp_path / "infersight.toml"
    path.write_text("interval_seconds = 5\n")
    os.chmod(path, 0o666)
    proc = infersight("run", "--config", str(path))
    assert proc.returncode == 2
    assert "writable" in proc.stderr and str(path) in proc.stderr


def test_collect_of_a_missing_pid_says_so(require_root):
    proc = infersight("collect", "--pid", str(2**22), "--duration", "1", "--no-pyspy", "--probes", "syscalls")
    assert proc.returncode == 1
    assert f"process {2**22} does not exist" in proc.stderr


def test_collect_of_a_missing_unit_says_so_in_one_line(require_root):
    proc = infersight("collect", "--unit", "no-such-infersight", "--duration", "1", "--no-pyspy", "--probes",
                      "syscalls")
    assert proc.returncode == 1
    assert proc.stderr == ("infersight: no process runs in systemd unit 'no-such-infersight.service' (no cgroup v2 "
                           "path of a host process names it: the unit is stopped, or not a unit of this host's "
                           "systemd)\n")


def test_selector_options_make_the_config_target_spec():
    from agent.cli import build_parser
    from agent.single_target import selector_spec

    def spec(*argv: str):
        return selector_spec(build_parser().parse_args(["collect", *argv]))

    assert (spec("--pid", "42").name, spec("--pid", "42").family) == ("pid42", False)
    assert (spec("--pid", "42", "--children").pid, spec("--pid", "42", "--children").family) == (42, True)
    assert (spec("--unit", "vllm").unit_name, spec("--unit", "vllm").name) == ("vllm.service", "unit-vllm")
    assert spec("--cgroup", "/sys/fs/cgroup/system.slice/x.service").name == "cgroup-sys_fs_cgroup_system.slice_x.service"
    assert (spec("--container", "3f2a").container, spec("--port", "8000").port) == ("3f2a", 8000)


def test_status_without_agent_says_nobody_answers():
    proc = infersight("status", "--url", "http://127.0.0.1:9")
    assert proc.returncode == 1
    assert "no agent answering at http://127.0.0.1:9" in proc.stderr


def test_version():
    proc = infersight("--version")
    assert proc.returncode == 0 and proc.stdout.strip().startswith("infersight ") and proc.stdout.strip()[-1].isdigit()


@pytest.mark.parametrize("spelling", [["--from", "-10m"], ["--from=-10m"]])
def test_relative_times_parse_with_or_without_equals(tmp_path, spelling):
    from agent.store import Store

    Store.open(tmp_path / "store").close()
    proc = infersight("flamegraph", "--store", str(tmp_path / "store"), "--target", "x", *spelling,
                      "--baseline-from", "-2h", "--baseline-to", "-1h", "--format", "json")
    # Parsed: the command gets as far as the empty store (exit 1), not an argument error (exit 2).
    assert proc.returncode == 1 and "no active samples" in proc.stderr, proc.stderr

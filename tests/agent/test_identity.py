"""agent.identity against real processes (ground truth: what the test started them with) and against fixture /proc
trees for what a real process cannot easily be made to do (exit mid-read, thousands of distributions, hostile names)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.config import ConfigError, config_from_dict
from agent.identity import Gone, Identity, IdentityReader, ModelFile, diff, env_matcher
from agent.targets import Target, read_proc

SECRET = "s3cr3t-value-7f1e2d"
CHILD = """
import sys, time, numpy
model = open(sys.argv[1], "rb")
print("ready", flush=True)
time.sleep(120)
"""


def _target(pid: int, name: str = "srv") -> Target:
    info = read_proc(pid)
    return Target(name=name, pid=pid, start_time=info.start_time, cmdline=info.cmdline, spec=None)


def _start(tmp_path: Path, env: dict[str, str], python: str = sys.executable,
           code: str = CHILD) -> subprocess.Popen:
    model = tmp_path / "model.safetensors"
    if not model.exists():
        model.write_bytes(b"\0" * 4096)
    script = tmp_path / "child.py"
    script.write_text(code)
    proc = subprocess.Popen([python, str(script), str(model), "--api-key", SECRET], stdout=subprocess.PIPE,
                            env={"PATH": os.environ["PATH"], **env}, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def started(tmp_path):
    procs: list[subprocess.Popen] = []

    def start(env: dict[str, str], **kw) -> subprocess.Popen:
        procs.append(_start(tmp_path, env, **kw))
        return procs[-1]
    yield start
    for p in procs:
        p.kill()
        p.wait()


ENV = {"OMP_NUM_THREADS": "3", "VLLM_ATTENTION_BACKEND": "TORCH_SDPA", "SECRET_TOKEN": SECRET,
       "DATABASE_URL": f"postgres://u:{SECRET}@db/x", "HOME": "/nonexistent"}


def test_a_real_process_ground_truth(started, tmp_path):
    proc = started(ENV)
    identity = IdentityReader().read(_target(proc.pid))
    assert identity.exe == os.path.realpath(sys.executable)
    assert identity.python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert ("numpy", importlib.metadata.version("numpy")) in identity.dists
    model = tmp_path / "model.safetensors"
    assert identity.models == (ModelFile(str(model), 4096, round(model.stat().st_mtime, 3)),)
    # Exactly the allowlisted variables, with their values; no other name or value.
    assert dict(identity.env) == {"OMP_NUM_THREADS": "3", "VLLM_ATTENTION_BACKEND": "TORCH_SDPA"}
    assert "--api-key ***" in identity.cmdline
    assert SECRET not in repr(identity) and SECRET not in str(identity.to_dict())
    assert identity.torch_threads is None and "torch_threads" in identity.unknown


def test_build_id_is_the_elf_note(started):
    proc = started({})
    identity = IdentityReader().read(_target(proc.pid))
    notes = subprocess.run(["readelf", "-n", os.path.realpath(sys.executable)], capture_output=True, text=True,
                           check=True).stdout
    assert identity.build_id == re.search(r"Build ID: ([0-9a-f]+)", notes)[1]
    assert identity.exe_size == os.stat(os.path.realpath(sys.executable)).st_size


def test_deleted_executable_is_still_identified(started, tmp_path):
    exe = tmp_path / "python3.11"
    shutil.copy2("/usr/bin/python3.11", exe)
    proc = started({}, python=str(exe), code="import sys, time\nprint('ready', flush=True)\ntime.sleep(120)\n")
    exe.unlink()
    identity = IdentityReader().read(_target(proc.pid))
    assert identity.exe == f"{exe} (deleted)"
    assert "deleted" in identity.unknown["exe_file"]
    assert identity.build_id and identity.exe_size == os.stat("/usr/bin/python3.11").st_size
    assert identity.python == "3.11"


def test_an_exited_process_is_gone(started):
    proc = started({})
    target = _target(proc.pid)
    proc.kill()
    proc.wait()
    with pytest.raises(Gone):
        IdentityReader().read(target)


def test_restart_with_same_identity_has_no_diff(started):
    reader = IdentityReader()
    first = reader.read(_target(started(ENV).pid))
    second = reader.read(_target(started(ENV).pid))
    assert diff(first, second) == []
    third = reader.read(_target(started({**ENV, "OMP_NUM_THREADS": "1"}).pid))
    changes = diff(second, third)
    assert [c.part for c in changes] == ["env"]
    assert changes[0].before == "OMP_NUM_THREADS=3" and changes[0].after == "OMP_NUM_THREADS=1"


def test_cost_of_a_cached_read(started):
    """The per-window cost (docs/changes.md): reads of a settled process, `refresh_windows` 12, in CPU time."""
    reader = IdentityReader()
    target = _target(started(ENV).pid)
    reader.read(target)
    began = time.process_time()
    for _ in range(120):
        reader.read(target)
    per_read = (time.process_time() - began) / 120
    # 0.1 % of a core at 5 s windows is 5 ms per window; a loaded CI host gets 10x headroom.
    assert per_read < 0.0005, per_read


# --- fixture /proc trees -------------------------------------------------------------------------------------------

def _fake_proc(root: Path, pid: int, *, env: bytes = b"", maps: list[str] = (), fds: dict[str, str] | None = None,
               start_time: int = 100, exe: str = sys.executable) -> Path:
    """A /proc/PID with what the reader reads; its `root` is `root/fs` (the process's mount namespace)."""
    base = root / "proc" / str(pid)
    (base / "fd").mkdir(parents=True)
    (root / "fs").mkdir(exist_ok=True)
    (base / "root").symlink_to(root / "fs")
    (base / "exe").symlink_to(exe)
    (base / "stat").write_text(f"{pid} (python3) S 1 1 1 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 {start_time} 0 0\n")
    (base / "environ").write_bytes(env)
    (base / "maps").write_text("".join(f"7f00{i:08x}-7f01{i:08x} r-xp 00000000 08:01 1 {p}\n"
                                       for i, p in enumerate(maps)))
    for n, target in (fds or {}).items():
        (base / "fd" / n).symlink_to(target)
    return root / "proc"


def _fake_target(pid: int, start_time: int = 100) -> Target:
    return Target(name="srv", pid=pid, start_time=start_time, cmdline=("python3", "serve.py"), spec=None)


def test_process_exiting_mid_read_returns_nothing(tmp_path):
    proc_root = _fake_proc(tmp_path, 4242, start_time=999)  # the pid now belongs to another process
    with pytest.raises(Gone):
        IdentityReader(proc_root=proc_root).read(_fake_target(4242, start_time=100))


def test_thousands_of_distributions(tmp_path):
    site = tmp_path / "fs" / "venv" / "lib" / "python3.11" / "site-packages"
    for i in range(5000):
        (site / f"pkg{i}-1.{i}.dist-info").mkdir(parents=True)
    (site / "pkg4321").mkdir()
    (site / "other-2.0.dist-info").mkdir()
    (site / "other-2.0.dist-info" / "top_level.txt").write_text("renamed\n")
    (site / "renamed").mkdir()
    maps = ["/venv/lib/python3.11/site-packages/pkg4321/_ext.cpython-311-x86_64-linux-gnu.so",
            "/venv/lib/python3.11/site-packages/renamed/_c.so", "/venv/lib/python3.11/site-packages/orphan/_c.so"]
    proc_root = _fake_proc(tmp_path, 10, maps=maps)
    reader = IdentityReader(proc_root=proc_root)
    began = time.process_time()
    identity = reader.read(_fake_target(10))
    assert identity.dists == (("other", "2.0"), ("pkg4321", "1.4321"))
    assert identity.unknown["dists_partial"] == "1 package(s) with no dist-info naming them: orphan"
    assert time.process_time() - began < 2.0
    # The folder is indexed once per mtime: the next refresh costs no listing.
    began = time.process_time()
    for _ in range(24):
        reader.read(_fake_target(10))
    assert time.process_time() - began < 0.5


def test_hostile_names_are_kept_printable_and_capped(tmp_path):
    site = tmp_path / "fs" / "sp" / "site-packages"
    evil = "<img src=x onerror=alert(1)>"
    (site / f"{evil}-9.9<b>.dist-info").mkdir(parents=True)
    (site / evil).mkdir()
    model = tmp_path / "fs" / f"m\n{evil}.pt"
    model.write_bytes(b"x")
    proc_root = _fake_proc(tmp_path, 11, maps=[f"/sp/site-packages/{evil}/x.so"], fds={"3": f"/m\n{evil}.pt"},
                           env=b"OMP_NUM_THREADS=\x1b[31m" + b"A" * 5000 + b"\0")
    identity = IdentityReader(proc_root=proc_root).read(_fake_target(11))
    assert identity.dists == ((evil, "9.9<b>"),)  # kept as text; the page and reports escape it
    assert identity.models[0].path == f"/m?{evil}.pt"
    value = dict(identity.env)["OMP_NUM_THREADS"]
    assert value.startswith("?[31m") and len(value) <= 257


def test_environ_values_of_other_variables_are_dropped(tmp_path):
    env = b"".join(f"{k}={v}\0".encode() for k, v in
                   [("PATH", "/bin"), ("VLLM_X", "1"), ("VLLMX", SECRET), ("TOKEN", SECRET), ("NOEQUALS", "")])
    env += b"CUDA_VISIBLE_DEVICES=0,1"  # the last variable has no terminating NUL
    proc_root = _fake_proc(tmp_path, 12, env=env * 1)
    identity = IdentityReader(proc_root=proc_root).read(_fake_target(12))
    assert dict(identity.env) == {"VLLM_X": "1", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_env_matcher_and_config():
    allowed = env_matcher(["OMP_NUM_THREADS", "VLLM_*"])
    assert allowed("VLLM_") and allowed("VLLM_USE_V1") and allowed("OMP_NUM_THREADS")
    assert not allowed("OMP_NUM_THREADSX") and not allowed("VLLMX") and not allowed("vllm_x")
    assert config_from_dict({}).identity.env_allowlist[:1] == ("OMP_NUM_THREADS",)
    with pytest.raises(ConfigError, match=r"identity.env_allowlist\[1\]: must be a variable name"):
        config_from_dict({"identity": {"env_allowlist": ["OK", "BAD*NAME"]}})
    with pytest.raises(ValueError, match="refresh_windows"):
        IdentityReader(refresh_windows=0)


def test_unknown_parts_are_no_change():
    known = Identity(exe="/usr/bin/python3.11", build_id="ab", cmdline="a", env=(("X", "1"),), dists=(("n", "1"),))
    unknown = Identity(exe="/usr/bin/python3.11", build_id="ab", cmdline="a", env=None, dists=None,
                       unknown={"env": "cannot read"})
    assert diff(known, unknown) == [] and diff(unknown, known) == []
    assert Identity.from_dict(known.to_dict()) == known
    rebuilt = diff(known, Identity(exe="/usr/bin/python3.11", build_id="cd", cmdline="b", env=(("X", "1"),),
                                   dists=(("n", "2"),)))
    assert [c.part for c in rebuilt] == ["build", "cmdline", "dists"]


def test_a_distribution_loaded_by_one_side_only_is_no_change():
    before = Identity(exe="/p", build_id="ab", dists=(("markupsafe", "3.0.4"), ("torch", "2.13.0")))
    lazy = Identity(exe="/p", build_id="ab", dists=(("torch", "2.13.0"),))
    assert diff(before, lazy) == [] and diff(lazy, before) == []
    upgraded = Identity(exe="/p", build_id="ab", dists=(("torch", "2.14.0"),))
    assert [(c.part, c.before, c.after) for c in diff(before, upgraded)] == [("dists", "torch=2.13.0",
                                                                             "torch=2.14.0")]

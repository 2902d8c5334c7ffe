"""Family targets against real processes: children, cgroup v2, systemd units and containers found from cgroup
paths, listening ports, a PID namespace, max_processes and members of users not allowed."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.config import TargetSpec
from agent.families import Families, ProcTable, cgroup_v2_mount, find_container_cgroup, find_unit_cgroup, role_of
from agent.targets import Target, discover

NOBODY = 65534
DEADLINE_S = 60.0  # a loaded 2-core CI machine starts pythons slowly; conditions are polled, never slept on

# One process of a test family: sets its title when given one (setproctitle, as vLLM does), starts the children
# its spec names (`a,b` two children; `a(b)` a child with a grandchild), says it is ready (a file named by its
# pid in $FAMILY_READY) and sleeps until killed.
MEMBER = r"""
import os, subprocess, sys, time
title, spec = sys.argv[1], sys.argv[2]
if title != "-":
    import setproctitle
    setproctitle.setproctitle(title)

def split(text):
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    return [c for c in out + [cur] if c and c != "-"]

for part in split(spec):
    name, _, inner = part.partition("(")
    subprocess.Popen([sys.executable, "-c", "CODE = %r\n" % CODE + CODE, name, inner[:-1] or "-"])
open(os.path.join(os.environ["FAMILY_READY"], str(os.getpid())), "w").close()
while True:
    time.sleep(60)
"""


def spawn_family(ready: Path, title: str, spec: str, *, argv: tuple[str, ...] = (),
                 preexec: Callable[[], None] | None = None, wrap: tuple[str, ...] = ()) -> subprocess.Popen:
    """A process tree in its own session (so the test can end all of it by that id)."""
    ready.mkdir(exist_ok=True)
    code = f"CODE = {MEMBER!r}\n{MEMBER}"
    return subprocess.Popen([*wrap, sys.executable, "-c", code, title, spec or "-", *argv], start_new_session=True,
                            preexec_fn=preexec, env={**os.environ, "FAMILY_READY": str(ready)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def end(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=DEADLINE_S)


def wait_for(what: str, check: Callable[[], object]) -> object:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_ready(ready: Path, count: int) -> list[int]:
    """The pids of the `count` family processes that have set their title and started their children."""
    return sorted(map(int, os.listdir(wait_for(f"{count} ready processes",
                                               lambda: ready if len(os.listdir(ready)) >= count else None))))


@pytest.fixture
def cleanup() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        end(p)


def members(target: Target) -> list[tuple[int, str]]:
    return [(m.pid, m.role) for m in target.members]


# ---- roles -------------------------------------------------------------------------------------------------

def test_role_is_the_title_a_process_set_else_its_name(cleanup: list[subprocess.Popen], tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    titled = spawn_family(ready, "VLLM::EngineCore", "")
    spaced = spawn_family(ready, "gunicorn: worker [app:app]", "")
    plain = spawn_family(ready, "-", "")
    long_name = tmp_path / "triton_python_backend_stub"
    long_name.symlink_to(shutil.which("sleep"))
    stub = subprocess.Popen([str(long_name), "600"], start_new_session=True)
    renamed = subprocess.Popen(["bash", "-c", "exec -a sglang::scheduler_TP0 sleep 600"], start_new_session=True)
    cleanup.extend([titled, spaced, plain, stub, renamed])

    def role(pid: int) -> str:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        return role_of(comm, Path(f"/proc/{pid}/cmdline").read_bytes())

    wait_ready(ready, 3)
    # setproctitle also set comm, cut to 15 characters: only the command line has the whole title.
    assert Path(f"/proc/{titled.pid}/comm").read_text().strip() == "VLLM::EngineCor"
    assert role(spaced.pid) == "gunicorn: worker [app:app]"
    wait_for("exec -a", lambda: Path(f"/proc/{renamed.pid}/comm").read_text().strip() == "sleep")
    assert role(renamed.pid) == "sglang::scheduler_TP0"
    assert role(stub.pid) == "triton_python_backend_stub"  # comm is "triton_python_b"
    comm = Path(f"/proc/{plain.pid}/comm").read_text().strip()
    assert role(plain.pid) == comm or role(plain.pid).startswith(f"{comm} ")  # python: no title, its program


def test_role_rules_on_command_lines() -> None:
    # A Python server is named by the module or script it runs: every one's comm is `python3`.
    assert role_of("python3", b"/usr/bin/python3\0-m\0vllm.entrypoints.openai.api_server\0") == \
        "python3 -m vllm.entrypoints.openai.api_server"
    assert role_of("python", b"/venv/bin/python\0-u\0/srv/app/serve.py\0--port\0008\0") == "python serve.py"
    assert role_of("python3.11", b"python3.11\0-c\0import x\0") == "python3.11"
    assert role_of("vllm", b"/opt/venv/bin/python3\0/opt/venv/bin/vllm\0serve\0m\0") == "vllm"
    assert role_of("bash", b"-bash\0") == "bash"
    assert role_of("postgres", b"postgres: checkpointer \0") == "postgres: checkpointer"
    assert role_of("sh", b"") == "sh"
    assert role_of("x", b"A\x01B" + b"\0" * 30) == "A?B"
    assert len(role_of("x", b"T" * 500 + b"\0\0\0")) == 64


# ---- children ----------------------------------------------------------------------------------------------

def test_children_finds_three_children_and_a_grandchild(cleanup: list[subprocess.Popen], tmp_path: Path) -> None:
    root = spawn_family(tmp_path / "ready", "-", "w1(leaf),w2,w3")
    cleanup.append(root)
    wait_ready(tmp_path / "ready", 5)
    table = ProcTable.scan()
    below = table.descendants(root.pid)
    problems: dict[str, str] = {}
    [target] = discover([TargetSpec(name="svc", pid=root.pid, children=True)], problems=problems)
    assert problems == {}
    assert target.pid == root.pid and target.members[0].pid == root.pid
    assert [m.pid for m in target.members[1:]] == sorted(below)
    assert sorted(m.role for m in target.members[1:]) == ["leaf", "w1", "w2", "w3"]
    assert target.member_keys[0] == target.key and len(target.member_keys) == 5
    assert target.family_problems == ()
    # The old way, unchanged: one process, no members.
    [single] = discover([TargetSpec(name="svc", pid=root.pid)])
    assert single.members == () and single.member_keys == (single.key,)


def test_family_is_re_read_every_discovery(cleanup: list[subprocess.Popen], tmp_path: Path) -> None:
    root = spawn_family(tmp_path / "ready", "-", "w1,w2")
    cleanup.append(root)
    wait_ready(tmp_path / "ready", 3)
    spec = TargetSpec(name="svc", pid=root.pid, children=True)
    families = Families()
    [before] = discover([spec], families=families)
    gone = before.members[1].pid
    os.kill(gone, signal.SIGKILL)
    wait_for("the member's exit", lambda: gone not in [m.pid for m in discover([spec], families=families)[0].members])
    [after] = discover([spec], families=families)
    assert [m.pid for m in after.members] == [root.pid, before.members[2].pid]


def test_vllm_shaped_regex_old_way_and_folded_with_children(cleanup: list[subprocess.Popen], tmp_path: Path) -> None:
    """An API process `... vllm serve` whose engine child renames itself VLLM::EngineCore, and (second server)
    one whose child keeps a command line the regex also matches."""
    tag = uuid.uuid4().hex[:8]
    api = spawn_family(tmp_path / "ready", "-", "VLLM::EngineCore", argv=("vllm", "serve", f"model-{tag}"))
    cleanup.append(api)
    wait_ready(tmp_path / "ready", 2)
    regex = rf"vllm serve model-{tag}"
    [old] = discover([TargetSpec(name="vllm", process_regex=regex)])
    assert (old.name, old.pid, old.members) == ("vllm", api.pid, ())  # the engine is not watched: the old gap
    [folded] = discover([TargetSpec(name="vllm", process_regex=regex, children=True)])
    assert folded.name == "vllm" and folded.pid == api.pid
    engine = ProcTable.scan().descendants(api.pid)[0]
    assert members(folded)[1] == (engine, "VLLM::EngineCore") and len(folded.members) == 2

    # A child that matches the regex too: the old way makes two targets named by pid, children=true one.
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'] + sys.argv[1:])\n"
         "time.sleep(600)", "vllm", "serve", f"pair-{tag}"], start_new_session=True)
    cleanup.append(parent)
    wait_for("the matching child", lambda: len(ProcTable.scan().descendants(parent.pid)) == 1 and len(
        discover([TargetSpec(name="p", process_regex=rf"vllm serve pair-{tag}")])) == 2)
    regex = rf"vllm serve pair-{tag}"
    old_targets = discover([TargetSpec(name="p", process_regex=regex)])
    kid = ProcTable.scan().descendants(parent.pid)[0]
    assert [(t.name, t.members) for t in old_targets] == [(f"p#{parent.pid}", ()), (f"p#{kid}", ())]
    [one] = discover([TargetSpec(name="p", process_regex=regex, children=True)])
    assert (one.name, one.pid, [m.pid for m in one.members]) == ("p", parent.pid, [parent.pid, kid])


def test_max_processes_keeps_the_leader_and_the_oldest(cleanup: list[subprocess.Popen], tmp_path: Path) -> None:
    root = spawn_family(tmp_path / "ready", "-", "a(b),c,d")
    cleanup.append(root)
    wait_ready(tmp_path / "ready", 5)
    table = ProcTable.scan()
    by_age = sorted(table.descendants(root.pid), key=lambda p: (table.stats[p].start_time, p))
    [target] = discover([TargetSpec(name="svc", pid=root.pid, children=True, max_processes=3)])
    assert [m.pid for m in target.members] == [root.pid, *sorted(by_age[:2])]
    left = sorted(by_age[2:])
    assert target.family_problems == (f"2 processes over max_processes (3) left out (pids {left[0]}, {left[1]}); "
                                      f"raise max_processes to watch them",)


def test_member_of_a_user_not_allowed_is_left_out_with_a_line(require_root: None, cleanup: list[subprocess.Popen]) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "subprocess.Popen(['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', 'sleep', '600'])\n"
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
         "time.sleep(600)"], start_new_session=True)
    cleanup.append(parent)

    def started() -> list[int]:
        below = ProcTable.scan().descendants(parent.pid)
        ok = len(below) == 2 and any(os.stat(f"/proc/{p}").st_uid == NOBODY for p in below if os.path.exists(
            f"/proc/{p}"))
        return below if ok else []

    below = wait_for("the nobody child", started)
    nobody = next(p for p in below if os.stat(f"/proc/{p}").st_uid == NOBODY)
    [target] = discover([TargetSpec(name="svc", pid=parent.pid, children=True)], allowed_uids=frozenset({0}))
    assert [m.pid for m in target.members] == [parent.pid, *(p for p in below if p != nobody)]
    assert target.family_problems == (f"pid {nobody} (sleep) runs as uid {NOBODY}, not root or a user in "
                                      f"allowed_users: left out of the family",)
    # Without an allowed-users rule (no policy), every member is kept.
    [everyone] = discover([TargetSpec(name="svc", pid=parent.pid, children=True)])
    assert len(everyone.members) == 3


def test_unreadable_member_says_so(tmp_path: Path) -> None:
    """A member whose command line cannot be read is not dropped silently (fixture /proc: root reads any real
    /proc file)."""
    from tests.agent.test_targets import fake_proc

    proc = tmp_path / "proc"
    fake_proc(proc, 100, "python", ["python", "-m", "srv"], 1000)
    fake_proc(proc, 101, "python", ["python", "-c", "w"], 1001)
    fake_proc(proc, 102, "python", ["python", "-c", "w"], 1002)
    for pid in (101, 102):  # fake_proc makes every process a child of 1: these are 100's
        stat = proc / str(pid) / "stat"
        stat.write_text(stat.read_text().replace(" S 1 ", " S 100 ", 1))
    (proc / "102" / "cmdline").unlink()
    (proc / "102" / "cmdline").mkdir()
    [target] = discover([TargetSpec(name="svc", pid=100, children=True)], proc, hold=False, own_pid=1,
                        families=Families(proc))
    assert [m.pid for m in target.members] == [100, 101]
    assert target.family_problems == ("cannot read pid 102 (python): Is a directory",)


# ---- cgroup v2 ---------------------------------------------------------------------------------------------

@pytest.fixture
def cgroup_root(require_root) -> Iterator[Path]:
    """A cgroup made by the test under the cgroup v2 mount, removed (with everything below it) at the end."""
    mount = cgroup_v2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy is mounted on this host (no cgroup2 line in /proc/self/mountinfo)")
    root = mount / f"infersight-test-{uuid.uuid4().hex[:8]}"
    try:
        root.mkdir()
    except OSError as exc:
        pytest.skip(f"the cgroup v2 mount {mount} is not writable here: {exc.strerror}")
    yield root
    deadline = time.monotonic() + DEADLINE_S
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [root]:
        while True:
            try:
                folder.rmdir()
                break
            except OSError:
                # Killed processes leave their cgroup once reaped: wait, but not forever.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def join(cgroup: Path) -> Callable[[], None]:
    """A preexec_fn that moves the new process into `cgroup` before it execs: its children are born inside."""
    def run() -> None:
        with open(cgroup / "cgroup.procs", "w") as fh:
            fh.write(str(os.getpid()))
    return run


def test_cgroup_family_has_every_process_in_it_and_below(cgroup_root: Path,
                                                         cleanup: list[subprocess.Popen], tmp_path: Path) -> None:
    svc = cgroup_root / "svc"
    (svc / "workers").mkdir(parents=True)
    root = spawn_family(tmp_path / "ready", "-", "engine,helper", preexec=join(svc))
    cleanup.append(root)
    wait_ready(tmp_path / "ready", 3)
    # A process moved into a sub-cgroup is still a member (cgroup.procs read recursively).
    helper = next(p for p in ProcTable.scan().descendants(root.pid)
                  if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"helper\0"))
    (svc / "workers" / "cgroup.procs").write_text(str(helper))
    mount = cgroup_v2_mount()
    assert mount is not None
    relative = str(svc.relative_to(mount))
    for value in (str(svc), relative, "/" + relative):
        problems: dict[str, str] = {}
        [target] = discover([TargetSpec(name="svc", cgroup=value)], problems=problems)
        assert problems == {}
        # The leader is the process started from outside the cgroup (its parent is pytest).
        assert target.pid == root.pid and target.members[0].pid == root.pid
        assert sorted(m.role for m in target.members[1:]) == ["engine", "helper"]
        assert [m.pid for m in target.members[1:]] == sorted(ProcTable.scan().descendants(root.pid))


def test_pid_namespace_members_show_host_pids(cgroup_root: Path, cleanup: list[subprocess.Popen],
                                              tmp_path: Path) -> None:
    """A container's processes as the host sees them: `unshare --pid --fork --mount-proc` in a cgroup."""
    ctr = cgroup_root / "ns"
    ctr.mkdir()
    box = spawn_family(tmp_path / "ready", "-", "VLLM::EngineCore", preexec=join(ctr),
                       wrap=("unshare", "--pid", "--fork", "--mount-proc"))
    cleanup.append(box)
    # unshare forks the namespace's init (our python, pid 1 inside) and waits for it.
    assert wait_ready(tmp_path / "ready", 2)[0] == 1  # the pids the processes see: the namespace's
    inside = ProcTable.scan().descendants(box.pid)
    nspids = [Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].splitlines()[0].split() for pid in inside]
    assert sorted(ns[-1] for ns in nspids) == ["1", "2"] and all(ns[0] == str(p) for ns, p in zip(nspids, inside))
    for spec in (TargetSpec(name="ctr", cgroup=str(ctr)), TargetSpec(name="ctr", pid=box.pid, children=True)):
        [target] = discover([spec])
        assert target.pid == box.pid
        assert [m.pid for m in target.members] == [box.pid, *inside]  # host pids, never the namespace's 1
        assert "VLLM::EngineCore" in [m.role for m in target.members]


def test_container_found_by_id_prefix_from_its_cgroup_path(cgroup_root: Path,
                                                           cleanup: list[subprocess.Popen], tmp_path: Path) -> None:
    ident = uuid.uuid4().hex + uuid.uuid4().hex
    other = "f" + uuid.uuid4().hex[:7] + ident[8:]
    scope = cgroup_root / f"docker-{ident}.scope"
    scope.mkdir()
    (cgroup_root / f"docker-{other}.scope").mkdir()  # another container, empty: never found, never matched
    app = spawn_family(tmp_path / "ready", "-", "worker", preexec=join(scope))
    cleanup.append(app)
    wait_ready(tmp_path / "ready", 2)
    problems: dict[str, str] = {}
    [target] = discover([TargetSpec(name="ctr", container=ident[:12])], problems=problems)
    assert problems == {} and target.pid == app.pid
    assert [m.pid for m in target.members] == [app.pid, *ProcTable.scan().descendants(app.pid)]
    # Found from the host processes' /proc/PID/cgroup, with the scan's result kept for the next window.
    families = Families()
    discover([TargetSpec(name="ctr", container=ident[:12])], families=families)
    assert (cgroup_root / f"docker-{ident}.scope").relative_to(families.mount) == Path(
        families._cgroup_cache[("container", ident[:12])])
    # The container stops: its processes end and the runtime removes its cgroup. A line, not an error.
    end(app)
    cleanup.remove(app)
    wait_for("the scope to empty", lambda: not (scope / "cgroup.procs").read_text().strip())
    scope.rmdir()
    problems = {}
    assert discover([TargetSpec(name="ctr", container=ident[:12])], problems=problems, families=families) == []
    assert problems == {"ctr": f"no container matches {ident[:12]!r} (no host process's cgroup v2 path holds a "
                               f"container id or name starting so): it is stopped, or runs elsewhere"}


def test_unit_found_from_host_cgroup_paths(cgroup_root: Path, cleanup: list[subprocess.Popen],
                                           tmp_path: Path) -> None:
    unit = f"infersight-test-{uuid.uuid4().hex[:8]}.service"
    service = cgroup_root / "app.slice" / unit
    (service / "sub").mkdir(parents=True)
    app = spawn_family(tmp_path / "ready", "-", "engine", preexec=join(service / "sub"))  # it made a sub-cgroup
    cleanup.append(app)
    wait_ready(tmp_path / "ready", 2)
    problems: dict[str, str] = {}
    [target] = discover([TargetSpec(name="u", systemd_unit=unit.removesuffix(".service"))], problems=problems)
    assert problems == {} and target.pid == app.pid and len(target.members) == 2


def test_unit_in_system_slice_is_found_without_a_scan(cgroup_root: Path, cleanup: list[subprocess.Popen],
                                                       tmp_path: Path) -> None:
    """systemd puts a service without Slice= at system.slice/NAME: that directory is tried first. The test's own
    cgroup stands for the v2 root (a mountinfo that mounts it there), so the host's system.slice is not touched."""
    unit = f"infersight-test-{uuid.uuid4().hex[:8]}.service"
    service = cgroup_root / "system.slice" / unit
    service.mkdir(parents=True)
    app = spawn_family(tmp_path / "ready", "-", "engine", preexec=join(service))
    cleanup.append(app)
    wait_ready(tmp_path / "ready", 2)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"41 31 0:38 / {cgroup_root} rw,relatime - cgroup2 cgroup2 rw\n")
    families = Families(mountinfo=mountinfo, proc_root=Path("/nonexistent-proc-for-the-scan"))
    # With no /proc to scan, only the system.slice path can find it.
    assert families.cgroup_of("systemd_unit", unit) == service


def test_cgroup_v1_directory_is_refused_with_the_v2_mount_named(tmp_path: Path) -> None:
    from agent.families import FamilyNotFound, cgroup_dir

    (tmp_path / "v1" / "cpu").mkdir(parents=True)
    (tmp_path / "unified").mkdir()
    with pytest.raises(FamilyNotFound, match=rf"'{tmp_path}/v1/cpu' is not in the cgroup v2 hierarchy "
                                             rf"\(mounted at {tmp_path}/unified\)"):
        cgroup_dir(str(tmp_path / "v1" / "cpu"), tmp_path / "unified")
    assert cgroup_dir("/system.slice/x.service", tmp_path / "unified") == tmp_path / "unified/system.slice/x.service"


def test_cgroup_paths_name_units_and_containers() -> None:
    ident = "3f" + "a" * 62
    paths = ["/system.slice/vllm.service", "/system.slice/vllm.service/sub", "/user.slice/user-0.slice",
             f"/system.slice/docker-{ident}.scope", f"/kubepods/burstable/pod1/{'b' * 64}",
             f"/machine.slice/libpod-conmon-{'c' * 64}.scope", f"/machine.slice/libpod-{'c' * 64}.scope",
             f"/kubepods.slice/cri-containerd-{'d' * 64}.scope", f"/crio-{'e' * 64}.scope/init.scope",
             "/machine.slice/machine-web\\x2d1.scope", "/lxc.payload.db1"]
    assert find_unit_cgroup("vllm.service", paths) == "system.slice/vllm.service"
    assert find_container_cgroup("3fa", paths) == f"system.slice/docker-{ident}.scope"
    assert find_container_cgroup("bbbb", paths) == f"kubepods/burstable/pod1/{'b' * 64}"
    assert find_container_cgroup("cc", paths) == f"machine.slice/libpod-{'c' * 64}.scope"  # not conmon's
    assert find_container_cgroup("dd", paths) == f"kubepods.slice/cri-containerd-{'d' * 64}.scope"
    assert find_container_cgroup("e", paths) == f"crio-{'e' * 64}.scope"
    assert find_container_cgroup("web-", paths) == "machine.slice/machine-web\\x2d1.scope"
    assert find_container_cgroup("db", paths) == "lxc.payload.db1"
    with pytest.raises(Exception, match=r"container prefix '3' matches 2 containers \(3faaaaaaaaaa, 3fbbbb"):
        find_container_cgroup("3", [*paths, f"/docker/3f{'b' * 62}"])


def test_missing_unit_cgroup_and_container_are_problems_not_errors(require_root) -> None:
    problems: dict[str, str] = {}
    specs = [TargetSpec(name="u", systemd_unit="no-such-infersight.service"),
             TargetSpec(name="c", cgroup="no/such/infersight"),
             TargetSpec(name="k", container="0123456789ab" + "cdef" * 3)]
    assert discover(specs, problems=problems) == []
    mount = cgroup_v2_mount()
    assert problems == {
        "u": "no process runs in systemd unit 'no-such-infersight.service' (no cgroup v2 path of a host process "
             "names it: the unit is stopped, or not a unit of this host's systemd)",
        "c": f"cgroup '{mount}/no/such/infersight' does not exist (no cgroup.procs there)",
        "k": "no container matches '0123456789abcdefcdefcdef' (no host process's cgroup v2 path holds a "
             "container id or name starting so): it is stopped, or runs elsewhere"}


def test_no_cgroup_v2_mount_says_so(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n")
    problems: dict[str, str] = {}
    assert discover([TargetSpec(name="c", cgroup="x")], problems=problems,
                    families=Families(mountinfo=mountinfo)) == []
    assert problems == {"c": "no cgroup v2 hierarchy is mounted (no cgroup2 line in /proc/self/mountinfo); cgroup, "
                             "systemd_unit and container targets need it"}
    mountinfo.write_text("41 31 0:38 / /sys/fs/cgroup/uni\\040fied rw - cgroup2 cgroup2 rw\n")
    assert cgroup_v2_mount(mountinfo) == Path("/sys/fs/cgroup/uni fied")


# ---- port --------------------------------------------------------------------------------------------------

PREFORK = r"""
import os, socket, time
import setproctitle
sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
sock.bind(("::", 0))
sock.listen()
for _ in range(2):  # pre-fork workers: each holds the listening socket, as gunicorn's do, and starts a helper
    if os.fork() == 0:
        setproctitle.setproctitle("worker")
        if os.fork() == 0:
            sock.close()
            setproctitle.setproctitle("helper")
        time.sleep(600)
        os._exit(0)
print(sock.getsockname()[1], flush=True)
time.sleep(600)
"""


def test_port_finds_the_listening_master_and_its_workers(cleanup: list[subprocess.Popen]) -> None:
    server = subprocess.Popen([sys.executable, "-c", PREFORK], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    cleanup.append(server)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    spec = TargetSpec(name="web", port=port)
    expected = ["helper", "helper", "worker", "worker"]
    wait_for("the workers' titles", lambda: sorted(m.role for m in discover([spec])[0].members[1:]) == expected)
    problems: dict[str, str] = {}
    families = Families()
    for _ in range(2):  # the second time from the remembered holder
        [target] = discover([spec], problems=problems, families=families)
        assert problems == {}
        assert target.pid == server.pid  # the master, though the workers hold the socket too
        assert sorted(m.role for m in target.members[1:]) == expected
        assert families._port_cache[port][0] == server.pid
    [alone] = discover([TargetSpec(name="web", port=port, children=False)])
    assert (alone.pid, alone.members) == (server.pid, ())


def test_port_nobody_listens_on_is_a_problem(require_root) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]  # bound, never listened on
        problems: dict[str, str] = {}
        assert discover([TargetSpec(name="web", port=free)], problems=problems) == []
    assert problems == {"web": f"nothing listens on TCP port {free} in the agent's network namespace"}


def test_loadtest_and_collect_selectors_resolve_the_family(cleanup: list[subprocess.Popen]) -> None:
    """`infersight loadtest --port N` watches the master and its workers; `--pid N` alone only the master."""
    from agent.cli import build_parser
    from agent.loadtest.command import _resolve_target

    server = subprocess.Popen([sys.executable, "-c", PREFORK], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    cleanup.append(server)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    wait_for("the workers", lambda: len(ProcTable.scan().descendants(server.pid)) == 4)
    below = ProcTable.scan().descendants(server.pid)
    for argv in (["--port", str(port)], ["--pid", str(server.pid), "--children"]):
        args = build_parser().parse_args(["loadtest", "--url", f"http://127.0.0.1:{port}", *argv])
        pid, spec, members = _resolve_target(args)
        assert (pid, members) == (server.pid, (server.pid, *below)) and spec.family
    args = build_parser().parse_args(["loadtest", "--url", f"http://127.0.0.1:{port}", "--pid", str(server.pid)])
    pid, spec, members = _resolve_target(args)
    assert (pid, spec.family, members) == (server.pid, False, ())


def test_allowed_users_checked_again_every_discovery(require_root: None, cleanup: list[subprocess.Popen],
                                                     tmp_path: Path) -> None:
    """A member that turns into another user after it was admitted (setresuid) is left out the next window."""
    flag = tmp_path / "drop"
    parent = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys, time\n"
         "code = 'import os, sys, time\\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)\\n"
         "os.setresuid(65534, 65534, 65534)\\ntime.sleep(600)'\n"
         "subprocess.Popen([sys.executable, '-c', code, sys.argv[1]])\n"
         "time.sleep(600)", str(flag)], start_new_session=True)
    cleanup.append(parent)
    spec = TargetSpec(name="svc", pid=parent.pid, children=True)
    allowed = frozenset({0})
    [child] = wait_for("the child", lambda: ProcTable.scan().descendants(parent.pid))
    families = Families()
    [before] = discover([spec], allowed_uids=allowed, families=families)
    assert [m.pid for m in before.members] == [parent.pid, child] and before.family_problems == ()
    flag.touch()
    wait_for("the uid change", lambda: Path(f"/proc/{child}/status").read_text().split("Uid:")[1].split()[0] == "65534")
    [after] = discover([spec], allowed_uids=allowed, families=families)
    assert [m.pid for m in after.members] == [parent.pid]
    assert after.family_problems == (f"pid {child} (python) runs as uid {NOBODY}, not root or a user in "
                                     f"allowed_users: left out of the family",)


def test_daemon_discovery_applies_allowed_users_to_members(require_root: None, cleanup: list[subprocess.Popen]) -> None:
    """The daemon's discover function (agent/target_policy.py) with the default allowed_users (root only)."""
    from agent.config import Config
    from agent.state import AgentState
    from agent.target_policy import make_discover

    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, time\n"
         "subprocess.Popen(['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', 'sleep', '600'])\n"
         "time.sleep(600)"], start_new_session=True)
    cleanup.append(parent)
    wait_for("the nobody child", lambda: any(os.stat(f"/proc/{p}").st_uid == NOBODY
                                             for p in ProcTable.scan().descendants(parent.pid)))
    spec = TargetSpec(name="svc", pid=parent.pid, children=True)
    run = make_discover(Config(targets=(spec,)), AgentState())
    for _ in range(2):
        problems: dict[str, str] = {}
        [target] = run([spec], problems)
        assert [m.pid for m in target.members] == [parent.pid] and problems == {}
        assert len(target.family_problems) == 1 and f"runs as uid {NOBODY}" in target.family_problems[0]

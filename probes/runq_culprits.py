"""Who the run-queue probe charged a target's wait to: the kernel's (tgid, comm, ns) made into named Culprits."""

from __future__ import annotations

import pwd
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from analysis.redact import redact_cmdline
from analysis.window import Culprit


def read_or_none(path: Path) -> str | None:
    """A /proc file's text; None when the process is gone or hides it."""
    try:
        return path.read_text(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        return None


def user_of(status: str) -> str | None:
    """The user name of /proc/PID/status's real uid."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return str(uid)  # a uid without a passwd entry (a container's user): the number is the name
    return None


def _cgroup(text: str) -> str | None:
    """The unified (v2) path, else systemd's named v1 hierarchy: where a unit or a container puts a process."""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    for hid, controllers, path in lines:
        if hid == "0" and controllers == "":
            return path
    for _, controllers, path in lines:
        if controllers == "name=systemd":
            return path
    return None


def kind_of(tgid: int, target: int, agent_pids: Iterable[int]) -> str:
    if tgid == 0:
        return "idle"
    if tgid == target:
        return "self"
    if tgid in set(agent_pids):
        return "agent"
    return ""


# The programs the agent runs as its children (agent/sources/pyspy.py): their CPU is the agent's own.
AGENT_CHILDREN = ("py-spy",)


def parse_stat(stat: str) -> tuple[str, list[str]]:
    """(comm, the fields after comm) of a /proc/PID/stat text. comm may hold ')' and spaces: it ends at the last
    ')'. The fields count from 0 at field 3 (state)."""
    close = stat.rfind(")")
    return stat[stat.find("(") + 1:close], stat[close + 2:].split()


def proc_stats(proc_root: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(pid, comm, the fields after comm) of every process's /proc/PID/stat; one that exits meanwhile is skipped."""
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        stat = read_or_none(entry / "stat")
        if stat is None:
            continue
        yield int(entry.name), *parse_stat(stat)


def is_agent_sampler(comm: str, fields: list[str], agent: int) -> bool:
    """Whether a process (its stat's comm and fields) is a sampler the agent started (a child in AGENT_CHILDREN)."""
    return len(fields) > 1 and fields[1] == str(agent) and comm in AGENT_CHILDREN


def agent_pids(proc_root: Path, agent: int, among: Iterable[int]) -> set[int]:
    """The agent and, of the processes `among`, the samplers it started (children named in AGENT_CHILDREN).

    Only the charged processes are asked, one /proc/PID/stat each: a scan of every process's stat each window was
    a third of the agent's main-thread CPU in steady state (docs/BENCHMARKS.md "Where the agent process's own CPU
    goes"). The stat's comm is the process's, not the thread's that ran (py-spy's signal thread is "ctrl-c")."""
    found = {agent}
    for pid in set(among) - {0, agent}:
        stat = read_or_none(proc_root / str(pid) / "stat")
        if stat is not None and is_agent_sampler(*parse_stat(stat), agent):
            found.add(pid)
    return found


def user_and_cmdline(proc_dir: Path) -> tuple[str | None, str | None]:
    """The user name and the redacted command line of the process at /proc/PID; None for what it hides or lost."""
    status, cmdline = read_or_none(proc_dir / "status"), read_or_none(proc_dir / "cmdline")
    return (user_of(status) if status is not None else None,
            redact_cmdline([a for a in cmdline.split("\0") if a]) if cmdline else None)


def resolve(tgid: int, comm: str, seconds: float, kind: str, proc_root: Path) -> Culprit:
    """The culprit as /proc shows it now; its user, cgroup and command line None with a reason when the pid is
    gone or belongs to another program (comm differs: the kernel's comm is the one that ran)."""
    culprit = Culprit(pid=tgid, comm=comm, seconds=seconds, kind=kind)
    if tgid == 0:
        return culprit
    base = proc_root / str(tgid)
    now_comm = read_or_none(base / "comm")
    if now_comm is None:
        culprit.reason = "exited before the window's end"
        return culprit
    if now_comm.rstrip("\n") != comm:
        culprit.reason = f"its pid now runs {now_comm.strip()!r}: it exited and the pid was reused"
        return culprit
    culprit.user, culprit.cmdline = user_and_cmdline(base)
    cgroup = read_or_none(base / "cgroup")
    culprit.cgroup = _cgroup(cgroup) if cgroup is not None else None
    if culprit.user is None or culprit.cgroup is None:
        culprit.reason = "exited while it was read"
    return culprit


def top(charges: Mapping[int, tuple[str, int]], target: int, agent: set[int], n: int,
        proc_root: Path) -> list[Culprit]:
    """The n neighbours with the most of the target's wait (tgid -> (comm, ns)), plus every idle, self and agent
    charge (so that the agent's own share can be taken out), largest first."""
    ranked = sorted(charges.items(), key=lambda kv: -kv[1][1])
    kept: list[Culprit] = []
    neighbours = 0
    for tgid, (comm, ns) in ranked:
        kind = kind_of(tgid, target, agent)
        if not kind:
            if neighbours >= n:
                continue
            neighbours += 1
        kept.append(resolve(tgid, comm, ns / 1e9, kind, proc_root))
    return kept

"""Target discovery: turn TargetSpecs into running processes keyed by (pid, start time), and diff the sets."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.config import ConfigError, TargetSpec
from agent.families import Families, FamilyNotFound, ProcStat, cgroup_procs, role_of, roots_first, topmost
from agent.trust import StatFn, open_trusted
from analysis.errors import AccessDenied, ProbeError, TargetGone
from analysis.snapshot import Skipped
from probes.pidfd import ProcessHandle, read_uids

PROC = Path("/proc")
_PIDFILE_MAX_BYTES = 64
# A process sets its own argv (up to ARG_MAX, megabytes): read enough to match and show, no more, or
# a user's processes with huge command lines would cost the agent that much memory every window.
CMDLINE_MAX_BYTES = 64 << 10
# Of another (not allowed) user's process only this much of the command line is read, to count in `skipped` what a
# regex would have matched: the front of a command line names the server, and the user's argv costs nothing more.
OTHERS_CMDLINE_BYTES = 256
PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    # Clock ticks after boot (field 22 of /proc/PID/stat): with pid, identifies one process for its lifetime.
    start_time: int
    comm: str
    state: str
    cmdline: tuple[str, ...]
    kernel_thread: bool = False  # PF_KTHREAD in the flags field of /proc/PID/stat


@dataclass(frozen=True)
class Member:
    """One process of a target's family (docs/config.md "Families")."""

    pid: int
    start_time: int
    # What operators recognise the process by: its title from the command line (setproctitle's
    # `VLLM::EngineCore`, longer than comm's 15 characters), else comm.
    role: str
    cmdline: tuple[str, ...]

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start_time)


@dataclass(frozen=True)
class Target:
    """A watched server. `pid` is its leader: the process the spec selected (the one whose latency source
    answers, and whose exit is the server going down). A family target also lists every process of the family
    in `members`, the leader first; a single-process target has `members == ()`."""

    name: str
    pid: int
    start_time: int
    cmdline: tuple[str, ...]
    spec: TargetSpec
    members: tuple[Member, ...] = ()
    # Family-level lines for status, the page and the log: members over max_processes, members of users not
    # allowed, members that could not be read. Never silent.
    family_problems: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start_time)

    @property
    def member_keys(self) -> tuple[tuple[int, int], ...]:
        """(pid, start time) of every process probes and sources measure for this target: the members of a
        family, else the leader alone."""
        return tuple(m.key for m in self.members) or (self.key,)



@dataclass(frozen=True)
class TargetDiff:
    added: tuple[Target, ...]
    removed: tuple[Target, ...]
    same: tuple[Target, ...]

    @property
    def restarted(self) -> tuple[str, ...]:
        """Names that lost one process and gained another: the same server, started again."""
        gone = {t.name for t in self.removed}
        return tuple(sorted(gone & {t.name for t in self.added}))


def read_proc(pid: int, proc_root: Path = PROC) -> ProcInfo:
    """One process's identity from `proc_root`; TargetGone if it has exited, AccessDenied if unreadable."""
    base = f"{proc_root}/{pid}"
    try:
        stat_text = _read(f"{base}/stat").decode(errors="replace")
        raw_cmdline = _read(f"{base}/cmdline", CMDLINE_MAX_BYTES)
    except (FileNotFoundError, ProcessLookupError):
        raise TargetGone(f"process {pid} does not exist (no {base})") from None
    except PermissionError as exc:
        raise AccessDenied(f"cannot read {base}: {exc.strerror}") from None
    # comm may itself contain ')' or spaces: it ends at the last ')'.
    open_paren, close_paren = stat_text.find("("), stat_text.rfind(")")
    rest = stat_text[close_paren + 1:].split()
    if open_paren < 0 or close_paren < 0 or len(rest) < 20:
        raise TargetGone(f"process {pid}: unparsable {base}/stat: {stat_text[:80]!r}")
    cmdline = tuple(a.decode(errors="replace") for a in raw_cmdline.split(b"\0") if a)
    return ProcInfo(pid=pid, start_time=int(rest[19]), comm=stat_text[open_paren + 1:close_paren],
                    state=rest[0], cmdline=cmdline, kernel_thread=bool(int(rest[6]) & PF_KTHREAD))


def _read(path: str, limit: int | None = None) -> bytes:
    # Plain os calls: a scan reads two files per process every window, and pathlib + text I/O cost ~2x.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks, size = [], 0
        while (limit is None or size < limit) and (chunk := os.read(fd, 65536 if limit is None
                                                                     else min(65536, limit - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def list_pids(proc_root: Path = PROC) -> list[int]:
    return sorted(int(name) for name in os.listdir(proc_root) if name.isdigit())


def read_pidfile(path: Path, *, stat: StatFn = os.lstat, readlink: Callable[[str], str] = os.readlink,
                 trusted_uids: frozenset[int] | None = None) -> int:
    """The pid in a trusted pidfile; ConfigError naming the file and its content otherwise. The file is
    checked as opened (agent.config.open_trusted): a swap after the path check is refused, a FIFO never blocks."""
    try:
        fd = open_trusted(path, what="pidfile", stat=stat, readlink=readlink, trusted_uids=trusted_uids)
        try:
            raw = os.read(fd, _PIDFILE_MAX_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ConfigError(f"cannot read pidfile {str(path)!r}: {exc.strerror or exc}") from None
    text = raw.decode(errors="replace").strip()
    if len(raw) > _PIDFILE_MAX_BYTES or not text.isdigit() or not 0 < int(text) <= 2**22:
        raise ConfigError(f"pidfile {str(path)!r} does not hold a pid, got {text[:_PIDFILE_MAX_BYTES]!r}")
    return int(text)


def _not_live(info: ProcInfo) -> str | None:
    """None for a process that can be watched; else why not (yet). Zombies have exited (nothing to trace); kernel
    threads have no command line, and neither has a process in the middle of execve: its parent (a vfork-based
    spawn) runs on before the new command line is set."""
    if info.state in ("Z", "X"):
        return f"process {info.pid} has exited (state {info.state})"
    if info.cmdline:
        return None
    if info.kernel_thread:
        return f"process {info.pid} is a kernel thread: nothing to trace"
    return (f"process {info.pid} has no command line yet (still starting, or it cleared its own); "
            "looked for again every window")


@dataclass
class _Scan:
    """One pass over /proc for the regex specs: the processes that may be watched, read in full, and of the
    others (a uid outside allowed_uids) only the pid, the first uid not allowed and the front of the command line."""

    allowed: list[ProcInfo]
    others: list[tuple[int, int, str]]


def _scan(proc_root: Path, own: int, allowed: frozenset[int] | None) -> _Scan:
    out = _Scan(allowed=[], others=[])
    for pid in list_pids(proc_root):
        if pid == own:
            continue
        try:
            if allowed is not None and (bad := _first_not_allowed(pid, allowed, proc_root)) is not None:
                # Never the whole command line of a process that cannot be selected: any user can make theirs
                # 64 KiB long and start thousands, and the root agent would read and match them every window.
                front = _read(f"{proc_root}/{pid}/cmdline", OTHERS_CMDLINE_BYTES)
                out.others.append((pid, bad, " ".join(a.decode(errors="replace") for a in front.split(b"\0") if a)))
                continue
            info = read_proc(pid, proc_root)
        except (TargetGone, AccessDenied, FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # exited between listing and reading; denied only without root (untraceable anyway)
        if _not_live(info) is None:
            out.allowed.append(info)
    return out


def _first_not_allowed(pid: int, allowed: frozenset[int], proc_root: Path) -> int | None:
    """The first of the process's uids outside `allowed`, or None when all are inside.

    The owner of /proc/PID (its effective uid) turns most away with one stat(). An allowed owner is confirmed
    by every uid in /proc/PID/status: a process may hold other uids than its effective one, and the files under
    a non-dumpable process's /proc/PID show root (its directory did not, on 6.18; older kernels differ).
    """
    owner = os.stat(f"{proc_root}/{pid}").st_uid
    if owner not in allowed:
        return owner
    return next((u for u in read_uids(pid, proc_root) if u not in allowed), None)


def _match(spec: TargetSpec, info: ProcInfo) -> bool:
    assert spec.pattern is not None
    return bool(spec.pattern.search(info.comm) or spec.pattern.search(" ".join(info.cmdline)))


def discover(specs: Iterable[TargetSpec], proc_root: Path = PROC, *, own_pid: int | None = None,
             problems: dict[str, str] | None = None, stat: StatFn = os.lstat,
             readlink: Callable[[str], str] = os.readlink,
             trusted_uids: frozenset[int] | None = None, allowed_uids: frozenset[int] | None = None,
             max_targets: int | None = None, skipped: dict[str, Skipped] | None = None,
             hold: bool = True, families: Families | None = None) -> list[Target]:
    """The processes that the specs select right now, in spec order.

    A spec that selects nothing leaves one line in `problems[spec.name]` (pidfile missing or untrusted,
    pid gone, no regex match) so the status page can say why. A regex that matches one process names it
    after the spec; several are named `name#pid`. The agent (`own_pid`) never matches; a process already
    claimed by an earlier spec is not claimed again.

    With `allowed_uids`, a process any of whose uids is outside that set is never selected: another
    user must not be able to make a root agent trace (and run py-spy as root on) processes it starts.
    Its uids are read first and its command line is not (beyond `OTHERS_CMDLINE_BYTES`, matched only to
    count it in `skipped`). At most `max_targets` are selected in all; `skipped[spec.name]` counts what a
    spec matched but lost.

    With `hold` (the default), each selected process is checked once more under a pidfd: its pid still
    names the process that was read (same start time) and its uids are still allowed. `hold=False` is for
    fixture /proc trees, whose pids are not real processes.

    A family spec (`spec.family`: children, systemd_unit, cgroup, container, port) gives targets with
    `members`: the leader and every process of its family, each checked against `allowed_uids`, at most
    `spec.max_processes`; what was left out is said in `family_problems`. A regex family that matches a
    process and its descendant is one target led by the topmost. `families` keeps what is costly to find
    between discoveries (the daemon passes the same one every window).
    """
    own = os.getpid() if own_pid is None else own_pid
    found: list[Target] = []
    claimed: dict[int, str] = {}
    scanned: _Scan | None = None
    families = families if families is not None else Families(proc_root)
    families.begin()

    def note(spec: TargetSpec, why: str) -> None:
        if problems is not None:
            problems[spec.name] = why

    # For cgroup, systemd_unit and container specs: the cgroup's processes, and the lines from reading it.
    pools: dict[str, list[int]] = {}
    pool_notes: dict[str, list[str]] = {}

    for spec in specs:
        left = None if max_targets is None else max(0, max_targets - len(found))
        infos: list[ProcInfo] = []
        others: list[tuple[int, int]] = []
        if spec.process_regex is not None:
            assert spec.pattern is not None
            if scanned is None:
                scanned = _scan(proc_root, own, allowed_uids)
            infos = [i for i in scanned.allowed if _match(spec, i)]
            others = [(pid, uid) for pid, uid, front in scanned.others if spec.pattern.search(front)]
            if not infos and not others:
                note(spec, f"no process matches process_regex {spec.process_regex!r}")
            if spec.family and infos:
                top = topmost([i.pid for i in infos], families.table)
                infos = [i for i in infos if top[i.pid] == i.pid]
                # A match of another user below a leader is reported as that family's member, not as skipped.
                leaders = {i.pid for i in infos}
                others = [(pid, uid) for pid, uid in others
                          if not any(up in leaders for up in families.table.ancestors(pid))]
        elif spec.selector not in ("pid", "pidfile"):
            try:
                infos, others, pool, notes = _family_leader(spec, families, proc_root, own, allowed_uids)
            except (FamilyNotFound, TargetGone, AccessDenied) as exc:
                note(spec, str(exc))
                continue
            if not infos and not others:
                note(spec, notes[0] if notes else f"no process of {spec.selector} {_selected(spec)!r} can be watched")
                continue
            pools[spec.name] = pool
            pool_notes[spec.name] = notes
        else:
            try:
                pid = spec.pid if spec.pid is not None else read_pidfile(
                    spec.pidfile, stat=stat, readlink=readlink, trusted_uids=trusted_uids)
                info = read_proc(pid, proc_root)
            except (ConfigError, TargetGone, AccessDenied) as exc:
                note(spec, str(exc))
                continue
            if (why := _not_live(info)) is not None:
                note(spec, why)
                continue
            infos = [info]
            if allowed_uids is not None:
                refused = _not_allowed(infos, allowed_uids, proc_root)
                others = list(refused.items())
                infos = [i for i in infos if i.pid not in refused]
        taken = [i for i in infos if i.pid in claimed]
        infos = [i for i in infos if i.pid not in claimed]
        if taken and not infos and not others:
            note(spec, f"process {taken[0].pid} is already watched as target {claimed[taken[0].pid]!r}")
        matched = len(infos) + len(others)
        if hold:
            held = [(i, _held(i, allowed_uids, proc_root)) for i in infos]
            others += [(i.pid, uid) for i, uid in held if uid is not None and uid >= 0]
            # uid -1: the process exited or its pid names another process now; simply not running any more.
            infos = [i for i, uid in held if uid is None]
        if others and not infos:
            pid, uid = others[0]
            note(spec, f"process {pid} runs as uid {uid}, not root or a user in allowed_users; "
                       f"a root agent traces only processes of users it trusts")
        over = infos[left:] if left is not None else []
        infos = infos[:left] if left is not None else infos
        if over and not infos:
            note(spec, f"max_targets ({max_targets}) reached: process {over[0].pid} is not watched")
        if skipped is not None and spec.process_regex is not None:
            skipped[spec.name] = Skipped(matched=matched, not_allowed=len(others),
                                         over_limit=len(over), max_targets=max_targets)
        for info in infos:
            name = spec.name if len(infos) == 1 else f"{spec.name}#{info.pid}"
            claimed[info.pid] = name
            members: tuple[Member, ...] = ()
            family_problems: tuple[str, ...] = ()
            if spec.family:
                pool = pools.get(spec.name)
                if pool is None:
                    pool = families.table.descendants(info.pid)
                members, family_problems = family_members(
                    info, pool, spec=spec, stat=families.stat, proc_root=proc_root, own=own,
                    allowed=allowed_uids, claimed=claimed, notes=pool_notes.get(spec.name, ()))
                for m in members:
                    claimed.setdefault(m.pid, name)
            found.append(Target(name=name, pid=info.pid, start_time=info.start_time, cmdline=info.cmdline,
                                spec=spec, members=members, family_problems=family_problems))
    return found


def _selected(spec: TargetSpec) -> object:
    return getattr(spec, spec.selector)


def _family_leader(spec: TargetSpec, families: Families, proc_root: Path, own: int,
                   allowed: frozenset[int] | None) -> tuple[list[ProcInfo], list[tuple[int, int]], list[int], list[str]]:
    """The leader of a port, cgroup, systemd_unit or container spec, as discover() handles a selected process:
    ([its ProcInfo] or [], [(pid, uid not allowed)] when no process may lead, the family's candidate pids (a
    port's: its holder's descendants), lines from reading the cgroup). FamilyNotFound when the selector finds
    no process."""
    if spec.port is not None:
        holder = families.port_holder(spec.port)
        ordered: list[ProcStat] = [holder]
        pool = families.table.descendants(holder.pid) if spec.family else []
        notes: list[str] = []
    else:
        value = spec.unit_name or spec.cgroup or spec.container
        assert value is not None
        where = families.cgroup_of(spec.selector, value)
        pids, notes = cgroup_procs(where)
        # The agent inside the cgroup it watches (a sidecar, a unit that runs both) is not a member, nor are
        # its own children (py-spy).
        inside = own in pids
        stats = [st for pid in pids if pid != own and (st := families.stat(pid)) is not None and st.live
                 and not (inside and st.ppid == own)]
        if not stats:
            raise FamilyNotFound(f"no process runs in {spec.selector} {value!r} (cgroup {where})")
        ordered = roots_first(stats)
        pool = [st.pid for st in stats]
    refused: list[tuple[int, int]] = []
    # The oldest process started from outside the family leads; one not allowed or unreadable cannot, and the next
    # is tried (at most max_processes of them: the cost stays bounded however large the cgroup).
    for st in ordered[:spec.max_processes]:
        try:
            bad = _first_not_allowed(st.pid, allowed, proc_root) if allowed is not None else None
            if bad is not None:
                refused.append((st.pid, bad))
                continue
            info = read_proc(st.pid, proc_root)
        except (TargetGone, FileNotFoundError, ProcessLookupError):
            continue  # exited since the cgroup was read
        except (AccessDenied, PermissionError) as exc:
            notes.append(f"cannot read pid {st.pid} ({st.comm}): {exc}")
            continue
        if _not_live(info) is None:
            return [info], [], pool, notes
    return [], refused[:1], [], notes


def family_members(leader: ProcInfo, pool: Iterable[int], *, spec: TargetSpec, stat: Callable[[int], ProcStat | None],
                   proc_root: Path = PROC, own: int | None = None, allowed: frozenset[int] | None = None,
                   claimed: dict[int, str] | None = None,
                   notes: Iterable[str] = ()) -> tuple[tuple[Member, ...], tuple[str, ...]]:
    """The members of `leader`'s family from the candidate pids `pool`: the leader first, the others by pid,
    each with its role; and a line for every process left out (over max_processes, of a user not allowed,
    unreadable, already another target's). Processes that exited meanwhile, zombies, kernel threads, the agent
    and (when the agent is in the pool itself) its own children, py-spy, are not members and need no line."""
    own = os.getpid() if own is None else own
    pool = list(pool)
    own_inside = own in pool
    problems = list(notes)
    others: list[ProcStat] = []
    for pid in pool:
        if pid in (leader.pid, own):
            continue
        st = stat(pid)
        if st is None or not st.live or (own_inside and st.ppid == own):
            continue
        if claimed is not None and pid in claimed:
            problems.append(f"pid {pid} ({st.comm}) is already watched as target {claimed[pid]!r}: not a member")
            continue
        others.append(st)
    # The oldest are kept: a burst of new processes never pushes out members already watched.
    others.sort(key=lambda st: (st.start_time, st.pid))
    keep = spec.max_processes - 1
    if len(others) > keep:
        over = sorted(st.pid for st in others[keep:])
        shown = ", ".join(map(str, over[:5])) + (", ..." if len(over) > 5 else "")
        problems.append(f"{len(over)} processes over max_processes ({spec.max_processes}) left out "
                        f"(pids {shown}); raise max_processes to watch them")
        others = others[:keep]
    try:
        members = [_member(leader.pid, leader.start_time, leader.comm, proc_root)]
    except (TargetGone, OSError):
        # Exited (or denied) since it was selected: the next discovery drops it; its role from what was read.
        members = [Member(pid=leader.pid, start_time=leader.start_time, cmdline=leader.cmdline,
                          role=role_of(leader.comm, b"\0".join(a.encode() for a in leader.cmdline)))]
    for st in others:
        try:
            if allowed is not None and (bad := _first_not_allowed(st.pid, allowed, proc_root)) is not None:
                problems.append(f"pid {st.pid} ({st.comm}) runs as uid {bad}, not root or a user in allowed_users: "
                                f"left out of the family")
                continue
            members.append(_member(st.pid, st.start_time, st.comm, proc_root))
        except (TargetGone, FileNotFoundError, ProcessLookupError):
            continue  # exited since it was listed: simply not a member any more
        except (AccessDenied, PermissionError, OSError) as exc:
            problems.append(f"cannot read pid {st.pid} ({st.comm}): {getattr(exc, 'strerror', None) or exc}")
    head = [m for m in members if m.pid == leader.pid]
    return tuple(head + sorted((m for m in members if m.pid != leader.pid), key=lambda m: m.pid)), tuple(problems)


def read_member(pid: int, proc_root: Path = PROC) -> Member:
    """The process running as `pid` now, as a family member (its role from its own command line); TargetGone or
    AccessDenied as read_proc."""
    info = read_proc(pid, proc_root)
    return _member(pid, info.start_time, info.comm, proc_root)


def _member(pid: int, start_time: int, comm: str, proc_root: Path) -> Member:
    try:
        raw = _read(f"{proc_root}/{pid}/cmdline", CMDLINE_MAX_BYTES)
    except (FileNotFoundError, ProcessLookupError):
        raise TargetGone(f"process {pid} does not exist") from None
    cmdline = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
    return Member(pid=pid, start_time=start_time, role=role_of(comm, raw), cmdline=cmdline)


def _held(info: ProcInfo, allowed: frozenset[int] | None, proc_root: Path) -> int | None:
    """None when the process now holding `info.pid` is the one read (same start time) and, under its pidfd,
    all its uids are allowed; else the first uid not allowed, or -1 when it exited or the pid names another
    process. The reads above were not bound to one process: between them the pid could change hands."""
    try:
        handle = ProcessHandle.open(info.pid, info.start_time, proc_root)
    except ProbeError:
        return -1
    try:
        uids = read_uids(info.pid, proc_root) if allowed is not None else ()
        if not handle.alive():
            return -1
        return next((u for u in uids if allowed is not None and u not in allowed), None)
    except (TargetGone, AccessDenied):
        return -1
    finally:
        handle.close()


def _not_allowed(infos: list[ProcInfo], allowed: frozenset[int], proc_root: Path) -> dict[int, int]:
    """pid -> the first uid outside `allowed`, for the processes that have one (or have exited)."""
    refused: dict[int, int] = {}
    for info in infos:
        try:
            uids = read_uids(info.pid, proc_root)
        except (TargetGone, AccessDenied):
            refused[info.pid] = -1
            continue
        bad = [u for u in uids if u not in allowed]
        if bad:
            refused[info.pid] = bad[0]
    return refused


def diff_targets(old: Iterable[Target], new: Iterable[Target]) -> TargetDiff:
    """Compare two discoveries by (pid, start_time), so a reused pid reads as removed + added."""
    old_by = {t.key: t for t in old}
    new_by = {t.key: t for t in new}
    return TargetDiff(added=tuple(t for k, t in new_by.items() if k not in old_by),
                      removed=tuple(t for k, t in old_by.items() if k not in new_by),
                      same=tuple(t for k, t in new_by.items() if k in old_by))

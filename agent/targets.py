"""Target discovery: turn TargetSpecs into running processes keyed by (pid, start time), and diff the sets."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.config import ConfigError, TargetSpec
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
             hold: bool = True) -> list[Target]:
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
    """
    own = os.getpid() if own_pid is None else own_pid
    found: list[Target] = []
    claimed: dict[int, str] = {}
    scanned: _Scan | None = None

    def note(spec: TargetSpec, why: str) -> None:
        if problems is not None:
            problems[spec.name] = why

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
            found.append(Target(name=name, pid=info.pid, start_time=info.start_time, cmdline=info.cmdline,
                                spec=spec))
    return found


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

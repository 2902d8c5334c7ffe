"""Target discovery: turn TargetSpecs into running processes keyed by (pid, start time), and diff the sets."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.config import ConfigError, StatFn, TargetSpec, check_trusted_path
from analysis.errors import AccessDenied, TargetGone

PROC = Path("/proc")
_PIDFILE_MAX_BYTES = 64


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    # Clock ticks after boot (field 22 of /proc/PID/stat): with pid, identifies one process for its lifetime.
    start_time: int
    comm: str
    state: str
    cmdline: tuple[str, ...]


@dataclass(frozen=True)
class Target:
    name: str
    pid: int
    start_time: int
    cmdline: tuple[str, ...]
    spec: TargetSpec

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start_time)


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
        raw_cmdline = _read(f"{base}/cmdline")
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
                    state=rest[0], cmdline=cmdline)


def _read(path: str) -> bytes:
    # Plain os calls: a scan reads two files per process every window, and pathlib + text I/O cost ~2x.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def list_pids(proc_root: Path = PROC) -> list[int]:
    return sorted(int(name) for name in os.listdir(proc_root) if name.isdigit())


def read_pidfile(path: Path, *, stat: StatFn = os.lstat, readlink: Callable[[str], str] = os.readlink,
                 trusted_uids: frozenset[int] | None = None) -> int:
    """The pid in a trusted pidfile; ConfigError naming the file and its content otherwise."""
    check_trusted_path(path, what="pidfile", stat=stat, readlink=readlink, trusted_uids=trusted_uids)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_PIDFILE_MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read pidfile {str(path)!r}: {exc.strerror or exc}") from None
    text = raw.decode(errors="replace").strip()
    if len(raw) > _PIDFILE_MAX_BYTES or not text.isdigit() or not 0 < int(text) <= 2**22:
        raise ConfigError(f"pidfile {str(path)!r} does not hold a pid, got {text[:_PIDFILE_MAX_BYTES]!r}")
    return int(text)


def _live(info: ProcInfo) -> bool:
    # Zombies have exited (nothing to trace); kernel threads have no command line.
    return info.state not in ("Z", "X") and bool(info.cmdline)


def _scan(proc_root: Path) -> list[ProcInfo]:
    infos = []
    for pid in list_pids(proc_root):
        try:
            infos.append(read_proc(pid, proc_root))
        except TargetGone:
            continue  # exited between listing and reading: simply not running any more
        except AccessDenied:
            continue  # only without root; such a process could not be traced anyway
    return infos


def _match(spec: TargetSpec, info: ProcInfo) -> bool:
    assert spec.pattern is not None
    return bool(spec.pattern.search(info.comm) or spec.pattern.search(" ".join(info.cmdline)))


def discover(specs: Iterable[TargetSpec], proc_root: Path = PROC, *, own_pid: int | None = None,
             problems: dict[str, str] | None = None, stat: StatFn = os.lstat,
             readlink: Callable[[str], str] = os.readlink,
             trusted_uids: frozenset[int] | None = None) -> list[Target]:
    """The processes that the specs select right now, in spec order.

    A spec that selects nothing leaves one line in `problems[spec.name]` (pidfile missing or untrusted,
    pid gone, no regex match) so the status page can say why. A regex that matches one process names it
    after the spec; several are named `name#pid`. The agent (`own_pid`) never matches; a process already
    claimed by an earlier spec is not claimed again.
    """
    own = os.getpid() if own_pid is None else own_pid
    found: list[Target] = []
    claimed: dict[int, str] = {}
    scanned: list[ProcInfo] | None = None

    def note(spec: TargetSpec, why: str) -> None:
        if problems is not None:
            problems[spec.name] = why

    for spec in specs:
        infos: list[ProcInfo] = []
        if spec.process_regex is not None:
            if scanned is None:
                scanned = [i for i in _scan(proc_root) if _live(i) and i.pid != own]
            infos = [i for i in scanned if _match(spec, i)]
            if not infos:
                note(spec, f"no process matches process_regex {spec.process_regex!r}")
        else:
            try:
                pid = spec.pid if spec.pid is not None else read_pidfile(
                    spec.pidfile, stat=stat, readlink=readlink, trusted_uids=trusted_uids)
                info = read_proc(pid, proc_root)
            except (ConfigError, TargetGone, AccessDenied) as exc:
                note(spec, str(exc))
                continue
            if not _live(info):
                note(spec, f"process {pid} has exited (state {info.state})")
                continue
            infos = [info]
        taken = [i for i in infos if i.pid in claimed]
        infos = [i for i in infos if i.pid not in claimed]
        if taken and not infos:
            note(spec, f"process {taken[0].pid} is already watched as target {claimed[taken[0].pid]!r}")
        for info in infos:
            name = spec.name if len(infos) == 1 else f"{spec.name}#{info.pid}"
            claimed[info.pid] = name
            found.append(Target(name=name, pid=info.pid, start_time=info.start_time, cmdline=info.cmdline,
                                spec=spec))
    return found


def diff_targets(old: Iterable[Target], new: Iterable[Target]) -> TargetDiff:
    """Compare two discoveries by (pid, start_time), so a reused pid reads as removed + added."""
    old_by = {t.key: t for t in old}
    new_by = {t.key: t for t in new}
    return TargetDiff(added=tuple(t for k, t in new_by.items() if k not in old_by),
                      removed=tuple(t for k, t in old_by.items() if k not in new_by),
                      same=tuple(t for k, t in new_by.items() if k in old_by))

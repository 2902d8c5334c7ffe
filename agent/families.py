"""Process families: which processes make one target, from parentage, a cgroup, a systemd unit, a container or
a listening port (docs/config.md, "Families"). Re-read every window; agent.targets turns them into members."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.sources.listener import Listener, listeners

PROC = Path("/proc")
MOUNTINFO = Path("/proc/self/mountinfo")
PF_KTHREAD = 0x00200000  # include/linux/sched.h
# A role is shown on the page and used as a bounded metric label: a title longer than this is cut.
ROLE_MAX_CHARS = 64
COMM_CHARS = 15  # TASK_COMM_LEN - 1: the kernel cuts comm there
# Where systemd puts system services unless a unit says Slice= (systemd.special(7)): tried before a scan.
SYSTEM_SLICE = "system.slice"

# One path component of a container's cgroup, by runtime: Docker with the systemd driver (docker-ID.scope) or
# cgroupfs (/docker/ID), containerd's CRI plugin (cri-containerd-ID.scope, or /kubepods/.../ID), CRI-O
# (crio-ID.scope) and Podman (libpod-ID.scope). The runtimes' conmon scopes (crio-conmon-ID, libpod-conmon-ID)
# are not the container and do not match.
_CONTAINER_ID = re.compile(r"(?:docker-|cri-containerd-|crio-|libpod-)?([0-9a-f]{64})(?:\.scope)?")
# Runtimes that name the cgroup after the container's name: systemd-nspawn/machined, LXC.
_CONTAINER_NAME = re.compile(r"machine-(.+)\.scope|lxc\.payload\.(.+)")


NO_CGROUP_V2 = ("no cgroup v2 hierarchy is mounted (no cgroup2 line in /proc/self/mountinfo); cgroup, systemd_unit "
                "and container targets need it")


class FamilyNotFound(Exception):
    """The selector finds no process right now; the message is the one line for the target's problems."""


@dataclass(frozen=True)
class ProcStat:
    """What one read of /proc/PID/stat says of a process: enough to place it in its family."""

    pid: int
    ppid: int
    start_time: int
    comm: str
    state: str
    kernel_thread: bool

    @property
    def live(self) -> bool:
        """Not a zombie and not a kernel thread: a process that can be traced."""
        return self.state not in ("Z", "X") and not self.kernel_thread


def read_stat(pid: int, proc_root: Path = PROC) -> ProcStat | None:
    """The process's stat, or None when it has exited (or its stat cannot be parsed)."""
    try:
        fd = os.open(f"{proc_root}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 4096).decode(errors="replace")
        finally:
            os.close(fd)
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm may hold ')' and spaces: it ends at the last ')'.
    open_paren, close_paren = text.find("("), text.rfind(")")
    rest = text[close_paren + 1:].split()
    if open_paren < 0 or close_paren < 0 or len(rest) < 20:
        return None
    return ProcStat(pid=pid, ppid=int(rest[1]), start_time=int(rest[19]), comm=text[open_paren + 1:close_paren],
                    state=rest[0], kernel_thread=bool(int(rest[6]) & PF_KTHREAD))


@dataclass
class ProcTable:
    """One pass over /proc/*/stat: every process's parent. Built once per discovery and shared by its specs."""

    stats: dict[int, ProcStat]
    children: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def scan(cls, proc_root: Path = PROC) -> ProcTable:
        stats = {}
        for name in os.listdir(proc_root):
            if name.isdigit() and (st := read_stat(int(name), proc_root)) is not None:
                stats[st.pid] = st
        table = cls(stats=stats)
        for st in stats.values():
            table.children.setdefault(st.ppid, []).append(st.pid)
        return table

    def descendants(self, pid: int) -> list[int]:
        """Every process below `pid` (not `pid` itself), by pid."""
        found: list[int] = []
        todo = list(self.children.get(pid, ()))
        while todo:
            child = todo.pop()
            found.append(child)
            todo.extend(self.children.get(child, ()))
        return sorted(found)

    def ancestors(self, pid: int) -> Iterable[int]:
        """`pid`'s parent, its parent, ... up to init (a cycle cannot happen, but a bound keeps it so)."""
        seen = 0
        st = self.stats.get(pid)
        while st is not None and st.ppid > 0 and seen < 4096:
            yield st.ppid
            st = self.stats.get(st.ppid)
            seen += 1


def topmost(pids: Iterable[int], table: ProcTable) -> dict[int, int]:
    """Each of `pids` -> the highest of `pids` among its ancestors (itself when none is): how a regex that
    matches a parent and its child folds them into one family led by the parent."""
    chosen = set(pids)
    out = {}
    for pid in chosen:
        top = pid
        for up in table.ancestors(pid):
            if up in chosen:
                top = up
        out[pid] = top
    return out


def roots_first(stats: Iterable[ProcStat]) -> list[ProcStat]:
    """A cgroup family's leader candidates: members whose parent is outside the family (what the service manager
    or the container runtime started), oldest first; then the others, oldest first."""
    stats = list(stats)
    inside = {st.pid for st in stats}
    return sorted(stats, key=lambda st: (st.ppid in inside, st.start_time, st.pid))


# ---- roles -----------------------------------------------------------------------------------------------------

def role_of(comm: str, raw_cmdline: bytes) -> str:
    """What operators call the process: its title when it set one, else its executable's name.

    A title is argv[0] when the process rewrote its command line: setproctitle (vLLM's `VLLM::EngineCore`,
    SGLang's `sglang::scheduler_TP0`, gunicorn's `gunicorn: worker [app]`) writes the title over the argv area
    and pads it with NULs, so /proc/PID/cmdline is one string and empty arguments; a title written in place
    (nginx, postgres) is one string holding spaces; `exec -a TITLE` makes argv[0] a word that names neither
    comm nor a path. Otherwise it is comm, or argv[0]'s file name where comm is that name cut to 15
    characters (`triton_python_backend_stub`)."""
    args = raw_cmdline.split(b"\0")
    if args and args[-1] == b"":
        args.pop()
    if not args or not args[0]:
        return _clean(comm)
    first = args[0].decode(errors="replace")
    padded = len(args) > 1 and not any(args[1:])
    if padded or (len(args) == 1 and any(c.isspace() for c in first.strip())):
        return _clean(first)
    name = first.rsplit("/", 1)[-1].lstrip("-")
    if "/" not in first and name and not (name.startswith(comm) or comm.startswith(name)):
        return _clean(first)
    if len(comm) == COMM_CHARS and name.startswith(comm) and len(name) > len(comm):
        return _clean(name)
    if _INTERPRETER.fullmatch(comm) and (program := _python_program(args[1:])):
        # Every Python server's comm is `python3`: the module or script it runs is what tells them apart.
        return _clean(f"{comm} {program}")
    return _clean(comm)


_INTERPRETER = re.compile(r"python[0-9.]*")


def _python_program(args: list[bytes]) -> str | None:
    """`-m MODULE` or the script's file name from a Python interpreter's arguments; None for `-c` and the REPL."""
    words = [a.decode(errors="replace") for a in args]
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words):
            return f"-m {words[i + 1]}"
        if word.startswith("-m") and len(word) > 2:
            return f"-m {word[2:]}"
        if word == "-c" or word.startswith("-c"):
            return None
        if not word.startswith("-"):
            return word.rsplit("/", 1)[-1]
    return None


def _clean(text: str) -> str:
    printable = "".join(c if c.isprintable() else "?" for c in text.strip())
    return printable[:ROLE_MAX_CHARS] or "?"


# ---- cgroups ---------------------------------------------------------------------------------------------------

def _unescape_mount(text: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes (proc(5)).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def cgroup_v2_mount(mountinfo: Path = MOUNTINFO) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a
    hybrid one (systemd's v1 layout beside v2). The first cgroup2 mount of the whole hierarchy (root `/`)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and right.split()[:1] == ["cgroup2"] and len(fields) >= 5 and fields[3] == "/":
            return Path(_unescape_mount(fields[4]))
    return None


def cgroup_dir(value: str, mount: Path | None) -> Path:
    """The directory a `cgroup` selector names: a path under the v2 mount as it is, any other path relative to the
    v2 root (`system.slice/x.service`, or `/system.slice/x.service` as /proc/PID/cgroup writes it)."""
    if mount is None:
        raise FamilyNotFound(NO_CGROUP_V2)
    path = Path(value)
    if path.is_absolute() and path.is_relative_to(mount):
        return path
    if path.is_absolute() and path.is_dir() and not (mount / value.lstrip("/")).is_dir():
        raise FamilyNotFound(f"{value!r} is not in the cgroup v2 hierarchy (mounted at {mount}); a cgroup v1 "
                             f"directory does not list a service's processes in one tree")
    return mount / value.lstrip("/")


def cgroup_procs(path: Path) -> tuple[list[int], list[str]]:
    """Every pid in cgroup `path` and the cgroups below it (cgroup.procs, in the agent's pid namespace: host
    pids), and a line for each cgroup that could not be read. FamilyNotFound when `path` is not a cgroup."""
    if not (path / "cgroup.procs").is_file():
        raise FamilyNotFound(f"cgroup {str(path)!r} does not exist (no cgroup.procs there)")
    pids: list[int] = []
    problems: list[str] = []
    for folder, _dirs, _files in os.walk(path):
        try:
            with open(os.path.join(folder, "cgroup.procs"), "rb") as fh:
                pids.extend(int(line) for line in fh.read().split())
        except FileNotFoundError:
            continue  # removed while walked: its processes left or moved
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                continue  # a threaded cgroup: its processes are listed by its domain cgroup, above
            problems.append(f"cannot read {folder}/cgroup.procs: {exc.strerror or exc}")
    return sorted(set(pids)), problems


def _v2_path(pid: int, proc_root: Path) -> str | None:
    """The process's cgroup v2 path (the `0::` line of /proc/PID/cgroup), None when it has none or exited."""
    try:
        with open(f"{proc_root}/{pid}/cgroup", "rb") as fh:
            text = fh.read(65536).decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def _host_cgroups(proc_root: Path) -> set[str]:
    """The distinct cgroup v2 paths of the host's processes: one small read per process."""
    found = set()
    for name in os.listdir(proc_root):
        if name.isdigit() and (path := _v2_path(int(name), proc_root)):
            found.add(path)
    return found


def _unescape_unit(text: str) -> str:
    # systemd escapes a machine name's '-' and other bytes as \xNN in unit names (systemd-escape(1)).
    return re.sub(r"\\x([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


def find_unit_cgroup(unit: str, paths: Iterable[str]) -> str:
    """The cgroup of systemd unit `unit` among the host's cgroup v2 paths: the prefix of a path that ends at a
    component named `unit` (a service that made sub-cgroups below its own is still found)."""
    found = set()
    for path in paths:
        parts = path.strip("/").split("/")
        if unit in parts:
            found.add("/".join(parts[:parts.index(unit) + 1]))
    if not found:
        raise FamilyNotFound(f"no process runs in systemd unit {unit!r} (no cgroup v2 path of a host process "
                             f"names it: the unit is stopped, or not a unit of this host's systemd)")
    if len(found) > 1:
        raise FamilyNotFound(f"systemd unit {unit!r} is in {len(found)} cgroups ({', '.join(sorted(found)[:3])}): "
                             f"several service managers run one; select it by cgroup instead")
    return found.pop()


def find_container_cgroup(prefix: str, paths: Iterable[str]) -> str:
    """The cgroup of the one container whose id (or, where the runtime puts it in the path, name) starts with
    `prefix`, among the host's cgroup v2 paths."""
    by_id: dict[str, str] = {}
    for path in paths:
        parts = path.strip("/").split("/")
        for i, part in enumerate(parts):
            ident = None
            if m := _CONTAINER_ID.fullmatch(part):
                ident = m.group(1)
                matched = ident.startswith(prefix.lower())
            elif m := _CONTAINER_NAME.fullmatch(part):
                ident = _unescape_unit(m.group(1) or m.group(2))
                matched = ident.startswith(prefix)
            elif i > 0 and parts[i - 1] == "lxc":
                ident = part
                matched = ident.startswith(prefix)
            if ident is not None and matched:
                by_id.setdefault(ident, "/".join(parts[:i + 1]))
                break
    if not by_id:
        raise FamilyNotFound(f"no container matches {prefix!r} (no host process's cgroup v2 path holds a "
                             f"container id or name starting so): it is stopped, or runs elsewhere")
    if len(by_id) > 1:
        ids = ", ".join(sorted(i[:12] for i in by_id)[:3])
        raise FamilyNotFound(f"container prefix {prefix!r} matches {len(by_id)} containers ({ids}); give more of "
                             f"its id")
    return next(iter(by_id.values()))


# ---- ports -----------------------------------------------------------------------------------------------------

def _holds(pid: int, inodes: set[int], proc_root: Path) -> bool:
    try:
        with os.scandir(f"{proc_root}/{pid}/fd") as fds:
            for fd in fds:
                try:
                    link = os.readlink(fd.path)
                except OSError:
                    continue  # closed since the listing
                if link.startswith("socket:[") and int(link[8:-1]) in inodes:
                    return True
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return False
    return False


# ---- the finder ----------------------------------------------------------------------------------------------

class Families:
    """Finds the processes of family targets for one discovery after another.

    What is costly to find is remembered between windows and checked cheaply before reuse: a unit's or a
    container's cgroup path (found by reading every host process's /proc/PID/cgroup; reused while the directory
    exists) and the process that holds a port's listening socket (found by listing every process's fds; reused
    while that process, same start time, still holds one of the port's listening sockets)."""

    def __init__(self, proc_root: Path = PROC, mountinfo: Path = MOUNTINFO,
                 list_listeners: Callable[[int], list[Listener]] = listeners) -> None:
        self.proc_root = proc_root
        self._mountinfo = mountinfo
        self._listeners = list_listeners
        self._mount: Path | None = None
        self._table: ProcTable | None = None
        self._cgroup_cache: dict[tuple[str, str], str] = {}
        self._port_cache: dict[int, tuple[int, int]] = {}

    def begin(self) -> None:
        """A new discovery: the process table is read again when first needed."""
        self._table = None

    @property
    def table(self) -> ProcTable:
        if self._table is None:
            self._table = ProcTable.scan(self.proc_root)
        return self._table

    def stat(self, pid: int) -> ProcStat | None:
        """One process's stat: from this discovery's table when it was read, else read now (a cgroup family
        reads only its own members, not the whole of /proc)."""
        if self._table is not None:
            return self._table.stats.get(pid)
        return read_stat(pid, self.proc_root)

    @property
    def mount(self) -> Path | None:
        if self._mount is None:
            self._mount = cgroup_v2_mount(self._mountinfo)
        return self._mount

    def cgroup_of(self, selector: str, value: str) -> Path:
        """The cgroup directory of a cgroup, systemd_unit or container selector; FamilyNotFound if none."""
        if selector == "cgroup":
            return cgroup_dir(value, self.mount)
        mount = self.mount
        if mount is None:
            raise FamilyNotFound(NO_CGROUP_V2)
        cached = self._cgroup_cache.get((selector, value))
        if cached is not None and (mount / cached / "cgroup.procs").is_file():
            return mount / cached
        if selector == "systemd_unit" and (mount / SYSTEM_SLICE / value / "cgroup.procs").is_file():
            rel = f"{SYSTEM_SLICE}/{value}"
        else:
            paths = _host_cgroups(self.proc_root)
            rel = find_unit_cgroup(value, paths) if selector == "systemd_unit" else find_container_cgroup(value, paths)
        self._cgroup_cache[(selector, value)] = rel
        return mount / rel

    def port_holder(self, port: int) -> ProcStat:
        """The topmost process that holds a TCP socket listening on `port` (IPv4 or IPv6) in the agent's network
        namespace: with pre-fork servers (gunicorn) master and workers all hold it, and the master leads."""
        inodes = {li.inode for li in self._listeners(port)}
        if not inodes:
            raise FamilyNotFound(f"nothing listens on TCP port {port} in the agent's network namespace")
        table = self.table
        cached = self._port_cache.get(port)
        holder = None
        if cached is not None and (st := table.stats.get(cached[0])) is not None and st.start_time == cached[1] \
                and _holds(st.pid, inodes, self.proc_root):
            holder = st.pid
        if holder is None:
            holder = next((pid for pid in sorted(table.stats) if table.stats[pid].live
                           and _holds(pid, inodes, self.proc_root)), None)
        if holder is None:
            raise FamilyNotFound(f"TCP port {port} is listened on, but no process of this host's pid namespace "
                                 f"holds the socket (a process in another network namespace, or it just exited)")
        top = holder
        for up in table.ancestors(holder):
            if _holds(up, inodes, self.proc_root):
                top = up
            else:
                break
        self._port_cache[port] = (top, table.stats[top].start_time)
        return table.stats[top]

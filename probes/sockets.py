"""Which TCP endpoints a process holds: fd links -> socket inodes -> the namespace's TCP sockets, from sock_diag
(probes/sock_diag.py) in the agent's own network namespace, else from /proc/PID/net/tcp{,6}."""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import AccessDenied, TargetGone
from analysis.window import TcpFlow
from probes import sock_diag

TCP_LISTEN = 10


def normalize_ip(packed: bytes) -> str:
    """Text form of a 4- or 16-byte address; an IPv4-mapped IPv6 address becomes plain IPv4."""
    addr = ipaddress.ip_address(packed)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


@dataclass(frozen=True)
class Endpoint:
    """A TCP socket's local address and port; `listening` sockets also own connections they accepted."""

    addr: str
    port: int
    listening: bool = False


def _parse_proc_addr(text: str) -> tuple[str, int]:
    # /proc/net/tcp prints each 32-bit word of the address in host (little-endian) order.
    hex_addr, _, hex_port = text.partition(":")
    raw = bytes.fromhex(hex_addr)
    packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return normalize_ip(packed), int(hex_port, 16)


def parse_proc_net_tcp(text: str, only: set[int] | None = None) -> dict[int, Endpoint]:
    """Socket inode -> local endpoint, from the text of /proc/PID/net/tcp or tcp6; `only` these inodes if given.

    The table lists the whole network namespace (a load generator's TIME_WAIT sockets included): decoding
    only the target's own lines is most of the cost saved (3.3 ms -> well under 1 ms per window, 160 lines)."""
    sockets: dict[int, Endpoint] = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10:
            continue
        inode = int(parts[9])
        if only is not None and inode not in only:
            continue
        addr, port = _parse_proc_addr(parts[1])
        if inode:
            sockets[inode] = Endpoint(addr, port, listening=int(parts[3], 16) == TCP_LISTEN)
    return sockets


# Reading /proc/PID/net/tcp walks every bucket of the kernel's TCP hash tables, however few sockets they hold: ~5 ms
# of CPU per read on this 24 GiB host (262,144 established buckets), as much for a tcp6 table with no socket in it.
# Read by two probes, for each member of a family, for both tables, it was most of the agent's own CPU past warm-up
# (docs/BENCHMARKS.md, "Where the agent's own CPU went"). So a table is read at most once per network namespace per
# TABLE_TTL_SECONDS (the probes of one window read within milliseconds of each other; the next window reads afresh),
# and not at all where the namespace holds no TCP socket of that family (/proc/PID/net/sockstat{,6}: one line, ~25 µs).
TABLE_TTL_SECONDS = 0.5
TABLES = (("tcp", "sockstat", "TCP:"), ("tcp6", "sockstat6", "TCP6:"))


def sockets_in_use(sockstat: str, prefix: str) -> int | None:
    """TCP sockets hashed in the namespace (listening and connected; TIME_WAIT not included) from a sockstat text,
    None where the line is missing."""
    for line in sockstat.splitlines():
        if line.startswith(prefix):
            fields = line.split()
            if len(fields) >= 3 and fields[1] == "inuse":
                return int(fields[2])
    return None


@dataclass(frozen=True)
class _Table:
    """One namespace's table of one family: the text of /proc/PID/net/tcp{,6}, or sock_diag's sockets by inode."""

    text: str | None = None
    by_inode: dict[int, Endpoint] | None = None

    def select(self, inodes: set[int]) -> Iterable[Endpoint]:
        if self.by_inode is not None:
            return [self.by_inode[i] for i in inodes if i in self.by_inode]
        return parse_proc_net_tcp(self.text or "", only=inodes).values()


EMPTY = _Table(by_inode={})
FAMILIES = {"tcp": socket.AF_INET, "tcp6": socket.AF_INET6}


def _own_netns() -> int | None:
    try:
        return os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return None


class ProcSockets:
    """Local TCP endpoints of a process (root injectable for tests: a fake /proc is always read as files).

    `sock_diag` (default: on for the real /proc) reads the tables of the agent's own network namespace through
    NETLINK_SOCK_DIAG; a target in another namespace is read from its /proc/PID/net/tcp{,6}, and so is everything
    once the kernel refuses a dump (no tcp_diag), with the reason kept in `sock_diag_off`."""

    def __init__(self, proc_root: Path = Path("/proc"), ttl: float = TABLE_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, sock_diag: bool | None = None) -> None:
        self.proc_root = proc_root
        self.ttl = ttl
        self.clock = clock
        if sock_diag is None:
            sock_diag = Path(proc_root) == Path("/proc")
        self.sock_diag_off: str | None = None
        self._own_netns = _own_netns() if sock_diag else None  # None: every table from /proc
        # (network namespace inode, table) -> (read at, table): shared by every pid of one namespace.
        self._tables: dict[tuple[int, str], tuple[float, _Table]] = {}
        self._lock = threading.Lock()  # the probes of one agent share an instance (`shared`)
        self.table_reads = 0  # tables read from /proc: what the cache saves is measured against the calls
        self.diag_dumps = 0  # tables read through sock_diag

    def socket_inodes(self, pid: int) -> set[int]:
        fd_dir = self.proc_root / str(pid) / "fd"
        inodes: set[int] = set()
        try:
            names = os.listdir(fd_dir)
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise TargetGone(f"process {pid} is gone ({fd_dir} is missing)") from exc
        except PermissionError as exc:
            raise AccessDenied(f"cannot list {fd_dir}: {exc}") from exc
        for name in names:
            try:
                link = os.readlink(fd_dir / name)
            except FileNotFoundError:
                continue  # closed while we listed: not a socket of this window any more
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
        return inodes

    def endpoints(self, pid: int) -> set[Endpoint]:
        """Local endpoints of the TCP sockets `pid` holds, as seen in its network namespace."""
        inodes = self.socket_inodes(pid)
        if not inodes:
            return set()
        found: set[Endpoint] = set()
        netns = self.netns(pid)
        now = self.clock()
        for table, sockstat, prefix in TABLES:
            view = self._table(pid, netns, table, sockstat, prefix, now)
            if view is not None:
                found.update(view.select(inodes))
        return found

    def netns(self, pid: int) -> int | None:
        """The inode of `pid`'s network namespace (the kernel's `net->ns.inum`); None where /proc does not show it
        (then none of its tables is shared)."""
        try:
            return os.stat(self.proc_root / str(pid) / "ns" / "net").st_ino
        except OSError:
            return None

    def _table(self, pid: int, netns: int | None, table: str, sockstat: str, prefix: str,
               now: float) -> _Table | None:
        """`pid`'s namespace's table, from this namespace's read of the last `ttl` seconds if there is one;
        None where the table does not exist (no IPv6)."""
        key = (netns, table) if netns is not None else None
        with self._lock:
            kept = self._tables.get(key) if key is not None else None
        if kept is not None and now - kept[0] < self.ttl:
            return kept[1]
        net = self.proc_root / str(pid) / "net"
        # No sockstat (IPv6 off, or a test's /proc): read the table to know.
        stat = _read_proc(pid, net / sockstat)
        view: _Table | None = EMPTY
        if stat is None or sockets_in_use(stat, prefix) != 0:
            view = self._dump(table) if netns is not None and netns == self._own_netns else None
            if view is None:
                text = _read_proc(pid, net / table)  # None: no IPv6 in this kernel or namespace
                view = None if text is None else _Table(text=text)
                if text is not None:
                    self.table_reads += 1
        if key is not None and view is not None:
            with self._lock:
                self._tables = {k: v for k, v in self._tables.items() if now - v[0] < self.ttl}  # live namespaces only
                self._tables[key] = (now, view)
        return view

    def _dump(self, table: str) -> _Table | None:
        """The agent's own namespace's table through sock_diag; None (and /proc from then on) where refused."""
        if self.sock_diag_off is not None:
            return None
        try:
            sockets = sock_diag.tcp_sockets(FAMILIES[table])
        except OSError as exc:
            self.sock_diag_off = f"sock_diag refused ({exc}): TCP tables are read from /proc"
            return None
        self.diag_dumps += 1
        return _Table(by_inode={s.inode: Endpoint(normalize_ip(s.address), s.port, listening=s.state == TCP_LISTEN)
                                for s in sockets})


def _read_proc(pid: int, path: Path) -> str | None:
    """The text of a file under /proc/PID, None where it does not exist; a gone or unreadable process raises."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except ProcessLookupError as exc:
        raise TargetGone(f"process {pid} is gone (reading {path})") from exc
    except PermissionError as exc:
        raise AccessDenied(f"cannot read {path}: {exc}") from exc


def shared(proc_root: Path = Path("/proc")) -> ProcSockets:
    """The one ProcSockets of this process for `proc_root`: the probes that resolve endpoints share its table reads."""
    return _shared(Path(proc_root))


@functools.cache
def _shared(proc_root: Path) -> ProcSockets:
    return ProcSockets(proc_root)


def owns(endpoints: Iterable[Endpoint], flow: TcpFlow) -> bool:
    """Whether `flow`'s local side is one of `endpoints` (a wildcard listener matches any local address)."""
    for ep in endpoints:
        if ep.port != flow.sport:
            continue
        if ep.addr == flow.saddr or (ep.listening and ipaddress.ip_address(ep.addr).is_unspecified):
            return True
    return False

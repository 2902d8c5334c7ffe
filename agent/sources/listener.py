"""Whose socket answers a loopback URL: the port's listening sockets (sock_diag) among the target's fds.

While a target restarts its port is free, and any local user may bind it: root would then read (and show, and
judge) whatever that user's server says, and send it the URL's credentials. For a loopback URL the check is
exact and cheap: the kernel lists the listening sockets of the agent's network namespace with their inodes
(netlink sock_diag, as `ss -ltn` asks; /proc/net/tcp and tcp6 where that is not to be had), and a process's
open sockets are its `/proc/PID/fd/*` links to `socket:[inode]`. A URL on another host cannot be checked from
here, and says so.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from analysis.errors import ReadingError
from probes import sock_diag

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_V4_LOOPBACK, _V6_LOOPBACK = ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")


class NotTheTarget(ReadingError):
    """The port is held by a socket that none of the target's processes has open."""


@dataclass(frozen=True)
class Listener:
    address: Address
    uid: int
    inode: int


def _diag_listeners(family: int) -> list[tuple[int, Address, int, int]]:
    """(port, address, uid, inode) of every TCP socket listening in `family`, from the kernel's sock_diag: only the
    listening table is walked, however many connections the host has."""
    return [(s.port, ipaddress.ip_address(s.address), s.uid, s.inode)
            for s in sock_diag.tcp_sockets(family, 1 << sock_diag.TCP_LISTEN)]


def _proc_address(hex_text: bytes) -> Address:
    """An address as /proc/net/tcp* writes it: 32-bit words, each in the host's byte order."""
    raw = b"".join(int(hex_text[i:i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hex_text), 8))
    return ipaddress.ip_address(raw)


def proc_listeners(port: int, net_dir: Path = Path("/proc/self/net")) -> list[Listener]:
    """The same from /proc/net/tcp and tcp6: every socket of the namespace is listed there, so reading them costs
    ~10 ms per thousand connections on the host; used where sock_diag is not to be had."""
    # Only LISTEN lines (state 0A, no remote end) on this port.
    pattern = re.compile(rb"^ *\d+: ([0-9A-F]+):%04X [0-9A-F]+:0000 0A \S+ \S+ \S+ +(\d+) +\d+ +(\d+)" % port,
                         re.MULTILINE)
    found = []
    for name in ("tcp", "tcp6"):
        try:
            text = (net_dir / name).read_bytes()
        except FileNotFoundError:  # a kernel without IPv6
            continue
        for m in pattern.finditer(text):
            found.append(Listener(address=_proc_address(m.group(1)), uid=int(m.group(2)), inode=int(m.group(3))))
    return found


def listeners(port: int) -> list[Listener]:
    """Every TCP socket listening on `port` in this process's network namespace, IPv4 and IPv6."""
    try:
        return [Listener(address=address, uid=uid, inode=inode)
                for family in (socket.AF_INET, socket.AF_INET6)
                for sport, address, uid, inode in _diag_listeners(family) if sport == port]
    except OSError:  # no sock_diag here (a kernel without it, a sandbox that forbids netlink)
        return proc_listeners(port)


def _reaches(listener: Address, host: Address) -> bool:
    """Whether a connection to `host` can be accepted by a socket listening on `listener` (same port)."""
    if listener == host or listener.is_unspecified:
        return True  # `::` takes IPv4 too unless IPV6_V6ONLY, which /proc does not show: counted as reaching
    return isinstance(listener, ipaddress.IPv6Address) and listener.ipv4_mapped == host


def socket_inodes(pids: Iterable[int], wanted: set[int], proc_root: Path = Path("/proc")) -> set[int]:
    """Which of the socket inodes `wanted` the processes `pids` hold open (stops as soon as all are found)."""
    found: set[int] = set()
    for pid in pids:
        try:
            with os.scandir(proc_root / str(pid) / "fd") as fds:
                for fd in fds:
                    try:
                        link = os.readlink(fd.path)
                    except OSError:
                        continue  # closed since the listing
                    if link.startswith("socket:[") and int(link[8:-1]) in wanted:
                        found.add(int(link[8:-1]))
                        if found == wanted:
                            return found
        except (FileNotFoundError, ProcessLookupError):
            continue  # that process exited: it holds nothing
    return found


def descendants(pids: Iterable[int], proc_root: Path = Path("/proc")) -> set[int]:
    """Every process below `pids`, from the kernel's per-thread `children` lists (not the pids themselves)."""
    found: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        try:
            tasks = list((proc_root / str(pid) / "task").iterdir())
        except (FileNotFoundError, ProcessLookupError):
            continue
        for task in tasks:
            try:
                children = (task / "children").read_text().split()
            except (FileNotFoundError, ProcessLookupError):
                continue  # that thread exited
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


class ListenerCheck:
    """Before each scrape of a loopback URL: every socket that could accept the connection must be open in one of
    `pids()` (the target process today; a target family's processes when targets are families) or their
    descendants (a launcher whose child server binds the port: TGI's launcher and router).

    `check()` returns the health line ("checked: …" or "not checked: …") and raises NotTheTarget when another
    process holds the port. A listening socket once found among the family's fds is remembered with the family:
    while the port's listening inodes and `pids()` stay the same, no fd is listed again (the inode names that
    socket for as long as it exists). Descendants are looked at only when `pids()` themselves do not hold it."""

    def __init__(self, url: str, pids: Callable[[], Iterable[int]], proc_root: Path = Path("/proc")) -> None:
        parts = urlsplit(url)
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._pids, self._proc_root = pids, proc_root
        host = (parts.hostname or "").lower()
        self.hosts: tuple[Address, ...] = ()
        self.skipped: str | None = None
        if host == "localhost":
            self.hosts = (_V4_LOOPBACK, _V6_LOOPBACK)
        else:
            try:
                address = ipaddress.ip_address(host)
            except ValueError:
                self.skipped = f"not checked: {host!r} is a name, not a loopback address"
            else:
                if address.is_loopback:
                    self.hosts = (address,)
                else:
                    self.skipped = f"not checked: {host} is not a loopback address"
        self._verified: tuple[frozenset[int], frozenset[int]] | None = None
        self.last = self.skipped or "not checked yet"
        # At the last check, no socket could take a connection to the URL: the port is closed here, not blocked.
        self.nothing_listens = False

    def check(self) -> str:
        if self.skipped is not None:
            return self.skipped
        reaching = [li for li in listeners(self.port)
                    if any(_reaches(li.address, host) for host in self.hosts)]
        self.nothing_listens = not reaching
        if not reaching:
            # Refused at connect, or reached through NAT (a container's published port): no owner to check here.
            self.last = f"not checked: nothing listens on port {self.port} in the agent's network namespace"
            return self.last
        pids = frozenset(self._pids())
        inodes = frozenset(li.inode for li in reaching)
        if self._verified != (pids, inodes):
            try:
                foreign = set(inodes) - socket_inodes(sorted(pids), set(inodes), self._proc_root)
                if foreign:
                    below = descendants(pids, self._proc_root) - pids
                    foreign -= socket_inodes(sorted(below), foreign, self._proc_root)
            except PermissionError as exc:
                # An agent run without root reads only its own user's fds.
                self.last = f"not checked: cannot list the target's fds ({exc.strerror})"
                return self.last
            if foreign:
                holders = sorted({li.uid for li in reaching if li.inode in foreign})
                self._verified = None
                self.last = (f"refused: port {self.port} is held by a socket (uid {', '.join(map(str, holders))}) "
                             f"that the target (pid {', '.join(map(str, sorted(pids)))}) and its descendants do not "
                             f"have open")
                raise NotTheTarget(f"latency endpoint port {self.port} is not the target's: it is held by a socket "
                                   f"of uid {', '.join(map(str, holders))} that neither the target nor its "
                                   f"descendants have open "
                                   f"(another process bound the port?); its answer is not used")
            self._verified = (pids, inodes)
        self.last = f"checked: port {self.port} is listened on by the target (pid {', '.join(map(str, sorted(pids)))})"
        return self.last

"""One `make demo` per folder, and what an earlier, killed one left behind: its children (stopped, they are ours)
and busy ports."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from agent.targets import read_proc
from analysis.errors import AccessDenied, TargetGone
from analysis.redact import redact_cmdline

PIDS_FILE = "demo.pids"
LOCK_FILE = "demo.lock"
_PR_SET_PDEATHSIG = 1


class DemoRunning(RuntimeError):
    """Another demo runs in this folder; the message is one line naming it and what to do."""


class DemoLock:
    """Held for a demo's whole life: an flock on `var/demo.lock`, which the kernel drops when the demo exits,
    even by kill -9. A second demo in the same folder finds it held and stops before touching anything (before,
    it stopped the first one's server and load as 'left behind', then failed on the busy port)."""

    def __init__(self, var: Path) -> None:
        self.path = var / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, page_url: str) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 200).decode(errors="replace").split()
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            pid = holder[0] if holder and holder[0].isdecimal() else "?"
            page = f", status page {holder[1]}" if len(holder) > 1 else ""
            raise DemoRunning(f"a demo is already running in {str(self.path.parent)!r} (pid {pid}{page}); stop it "
                              f"with Ctrl-C in its terminal or `kill {pid}`, or give this one its own --var, "
                              f"--port and --listen") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {page_url}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class Child:
    pid: int
    start_time: int
    name: str


def die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGTERM to the child when the demo dies, even by kill -9."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def record_children(var: Path, children: list[tuple[int, str]]) -> None:
    """Write pid, start time and name of each child, so a later demo knows exactly which processes are its."""
    lines = []
    for pid, name in children:
        try:
            lines.append(f"{pid} {read_proc(pid).start_time} {name}\n")
        except (TargetGone, AccessDenied):
            continue
    (var / PIDS_FILE).write_text("".join(lines))


def _recorded(var: Path) -> list[Child]:
    try:
        text = (var / PIDS_FILE).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].isdecimal() and parts[1].isdecimal():
            out.append(Child(int(parts[0]), int(parts[1]), parts[2]))
    return out


def stop_stale(var: Path, timeout: float = 10.0) -> list[str]:
    """Stop the children an earlier demo recorded that still run (same pid *and* start time, so never a
    stranger that reused the pid); one line per process stopped."""
    said = []
    for child in _recorded(var):
        try:
            if read_proc(child.pid).start_time != child.start_time:
                continue
        except (TargetGone, AccessDenied):
            continue
        os.kill(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(child):
            time.sleep(0.1)
        if _alive(child):
            os.kill(child.pid, signal.SIGKILL)
        said.append(f"stopped the {child.name} (pid {child.pid}) left running by an earlier demo")
    (var / PIDS_FILE).unlink(missing_ok=True)
    return said


def _alive(child: Child) -> bool:
    try:
        info = read_proc(child.pid)
    except (TargetGone, AccessDenied):
        return False
    return info.start_time == child.start_time and info.state not in ("Z", "X")


def port_in_use(host: str, port: int) -> str | None:
    """None when `host:port` can be bound now; else one line naming the port and, when known, its holder."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return None
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return f"cannot use {host}:{port}: {exc.strerror}"
    return f"port {port} on {host} is already in use{_holder(port)}"


def _holder(port: int) -> str:
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, OSError):
        return ""
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            try:
                cmd = redact_cmdline(psutil.Process(c.pid).cmdline())[:120]
            except psutil.Error:
                cmd = "?"
            return f" by pid {c.pid} ({cmd})"
    return ""

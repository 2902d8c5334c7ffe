"""A process held by a pidfd: while it lives, its pid names it and no other process."""

from __future__ import annotations

import errno
import os
import select
import threading
from collections.abc import Callable
from pathlib import Path

from analysis.errors import AccessDenied, ProbeUnavailable, TargetGone

PROC = Path("/proc")


def _read_small(path: str) -> bytes:
    # Plain os calls: discovery reads these for many processes every window, and buffered I/O costs ~2x.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 16384)
    finally:
        os.close(fd)


def read_start_time(pid: int, proc_root: Path = PROC) -> int:
    """Clock ticks after boot when `pid` started (field 22 of /proc/PID/stat); TargetGone when it has no entry."""
    try:
        text = _read_small(f"{proc_root}/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        raise TargetGone(f"process {pid} does not exist (no {proc_root}/{pid}/stat)") from None
    # comm may hold ')' and spaces: the fields after it start at the last ')'.
    rest = text[text.rfind(b")") + 1:].split()
    if len(rest) < 20 or not rest[19].isdigit():
        raise TargetGone(f"process {pid}: unparsable {proc_root}/{pid}/stat")
    return int(rest[19])


def read_uids(pid: int, proc_root: Path = PROC) -> tuple[int, ...]:
    """Real, effective, saved and filesystem uid from /proc/PID/status.

    Not the owner of the files under /proc/PID: a process that makes itself non-dumpable shows them as root's.
    """
    try:
        text = _read_small(f"{proc_root}/{pid}/status").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        raise TargetGone(f"process {pid} does not exist (no {proc_root}/{pid}/status)") from None
    except PermissionError as exc:
        raise AccessDenied(f"cannot read {proc_root}/{pid}/status: {exc.strerror}") from None
    for line in text.splitlines():
        if line.startswith("Uid:"):
            return tuple(int(v) for v in line.split()[1:])
    raise TargetGone(f"process {pid}: no Uid line in {proc_root}/{pid}/status")


class ProcessHandle:
    """One process held by a pidfd (Linux >= 5.3).

    The kernel never gives a live process's pid to another one (a zombie keeps it until it is reaped), so
    while `alive()` is true the pid names this process. Check it right before acting on the pid (a uprobe
    attach, an exec of py-spy) and again right after: whatever acted by pid in between acted on this process.
    The pidfd turns readable the moment the process exits; `fileno()` lets a poller wait on it.
    """

    def __init__(self, pid: int, start_time: int, fd: int, proc_root: Path = PROC) -> None:
        self.pid = pid
        self.start_time = start_time
        self._fd = fd
        self._proc_root = proc_root

    @classmethod
    def open(cls, pid: int, start_time: int | None = None, proc_root: Path = PROC) -> ProcessHandle:
        """Hold `pid`; with `start_time`, only if the process holding the pid now is the one that started then.

        TargetGone when the process has exited, is a zombie, or its pid now names another process.
        """
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise TargetGone(f"process {pid} does not exist") from None
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise TargetGone(f"pid {pid} is not a process (a thread, or out of range)") from None
            raise ProbeUnavailable(f"pidfd_open({pid}) failed: {exc.strerror or exc}") from None
        try:
            # Read after the pidfd is held: if the process is still alive below, this was its stat.
            seen = read_start_time(pid, proc_root)
            if start_time is not None and seen != start_time:
                raise TargetGone(f"pid {pid} now names another process (started at tick {seen}, "
                                 f"not {start_time})")
            handle = cls(pid, seen, fd, proc_root)
            if not handle.alive():
                raise TargetGone(f"process {pid} has exited")
        except BaseException:
            os.close(fd)
            raise
        return handle

    def fileno(self) -> int:
        return self._fd

    def alive(self) -> bool:
        """False once the process has exited (its pidfd is readable), or after close()."""
        if self._fd < 0:
            return False
        # poll, not select: the agent raises its open-file limit and select() cannot take a descriptor above 1,023.
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return not poller.poll(0)

    def check(self) -> None:
        """Raise TargetGone unless the process is alive and its pid still shows the start time it had."""
        if not self.alive():
            raise TargetGone(f"process {self.pid} has exited")
        seen = read_start_time(self.pid, self._proc_root)
        if seen != self.start_time or not self.alive():
            raise TargetGone(f"pid {self.pid} now names another process (started at tick {seen}, "
                             f"not {self.start_time})")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __repr__(self) -> str:
        return f"ProcessHandle(pid={self.pid}, start_time={self.start_time}, fd={self._fd})"


class ExitWatcher:
    """Calls `on_exit(handle)` from its own thread as soon as a watched process exits.

    `on_exit` runs outside the watcher's lock and must not raise; it may be called for a handle that was
    unwatched a moment before (the exit and the unwatch raced), so it checks that the handle is still its own.
    """

    def __init__(self, on_exit: Callable[[ProcessHandle], None], name: str = "pidfd-exit") -> None:
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._epoll = select.epoll()
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._epoll.register(self._wake, select.EPOLLIN)
        self._watched: dict[int, ProcessHandle] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def watch(self, handle: ProcessHandle) -> None:
        with self._lock:
            self._watched[handle.fileno()] = handle
            # One-shot: an exited process stays readable; it is reported once, then left for unwatch().
            self._epoll.register(handle.fileno(), select.EPOLLIN | select.EPOLLONESHOT)

    def unwatch(self, handle: ProcessHandle) -> None:
        """Stop watching; call before closing the handle (a closed descriptor's number is soon reused)."""
        with self._lock:
            if self._watched.get(handle.fileno()) is handle:
                del self._watched[handle.fileno()]
                self._epoll.unregister(handle.fileno())

    def close(self) -> None:
        with self._lock:
            self._stopping = True
        os.eventfd_write(self._wake, 1)
        self._thread.join(timeout=10)
        self._epoll.close()
        os.close(self._wake)

    def _run(self) -> None:
        while True:
            events = self._epoll.poll()
            with self._lock:
                if self._stopping:
                    return
                # A descriptor number may have been unwatched, closed and reused since the event: only a
                # handle registered under it now, and exited now, is reported.
                fired = [h for fd, _ in events if (h := self._watched.get(fd)) is not None and not h.alive()]
            for handle in fired:
                self._on_exit(handle)

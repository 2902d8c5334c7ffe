"""The fault switches: each is a named on/off with a measurable effect on the server."""

import gc
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from workload.cpuhog import CpuHog
from workload.engine import Engine
from workload.netloss import Netloss
from workload.scheduler import Scheduler, StepHook

FAULT_NAMES = ("gc", "lock", "syscall", "netloss", "cpuhog", "nocache", "io")


class UnknownFault(KeyError):
    """A fault name that is not one of FAULT_NAMES."""


class Fault(Protocol):
    def on(self) -> None: ...
    def off(self) -> None: ...


@dataclass
class FaultTuning:
    """How hard each fault pushes; defaults give >= 1.5x p99 at the default load (docs/BENCHMARKS.md)."""

    gc_cycles_per_sequence: int = 4000
    lock_hold_s: float = 0.040
    lock_period_s: float = 0.060
    syscalls_per_sequence: int = 8000  # per running sequence per decode step
    netloss_percent: int = 10
    cpuhog_per_cpu: int = 2
    io_writes_per_sequence: int = 1  # per running sequence per decode step; 4 saturated the server (p99 0.5 -> 5.7 s)
    io_write_bytes: int = 65536
    # A real disk, not tmpfs: fsync on tmpfs returns at once and nothing would block.
    io_dir: str = "/var/tmp"


class GcChurn:
    """Builds reference cycles on every decode step, so the cyclic collector runs in the request path."""

    def __init__(self, cycles_per_step: int) -> None:
        self.cycles_per_step = cycles_per_step
        self.active = False

    def on(self) -> None:
        self.active = True

    def off(self) -> None:
        self.active = False

    def hook(self, batch_size: int) -> None:
        if not self.active:
            return
        for _ in range(self.cycles_per_step * batch_size):
            a: dict = {}
            b = {"a": a, "pad": [a]}
            a["b"] = b  # a cycle: only the cyclic collector can free it


class SyscallStorm:
    """Many one-byte reads of /dev/zero per decode step and sequence: each one a pread64(2) syscall."""

    def __init__(self, per_sequence: int) -> None:
        self.per_sequence = per_sequence
        self.active = False
        self._fd: int | None = None

    def on(self) -> None:
        if self._fd is None:
            self._fd = os.open("/dev/zero", os.O_RDONLY | os.O_CLOEXEC)
        self.active = True

    def off(self) -> None:
        self.active = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def hook(self, batch_size: int) -> None:
        fd = self._fd
        if not self.active or fd is None:
            return
        for _ in range(self.per_sequence * batch_size):
            os.pread(fd, 1, 0)


class LockHolder:
    """A background thread that takes the serving lock and sleeps holding it, periodically."""

    def __init__(self, lock: threading.Lock, hold_s: float, period_s: float) -> None:
        if not 0 < hold_s < period_s:
            raise ValueError(f"need 0 < hold_s < period_s, got hold_s={hold_s!r} period_s={period_s!r}")
        self.lock = lock
        self.hold_s = hold_s
        self.period_s = period_s
        self.holds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="fault-lock", daemon=True)
        self._thread.start()

    def off(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                self.holds += 1
                self._stop.wait(self.hold_s)
            self._stop.wait(self.period_s - self.hold_s)


class DiskSync:
    """Appends to a scratch file and fsyncs it per decode step and sequence: requests block on the disk."""

    # The file is cut back to empty past this size, so a long fault never fills the disk.
    MAX_FILE_BYTES = 64 << 20

    def __init__(self, writes_per_sequence: int, write_bytes: int, directory: str) -> None:
        if writes_per_sequence <= 0 or write_bytes <= 0:
            raise ValueError(f"need positive writes and bytes, got {writes_per_sequence!r}, {write_bytes!r}")
        self.writes_per_sequence = writes_per_sequence
        self.directory = directory
        self.active = False
        self.syncs = 0
        self._payload = os.urandom(write_bytes)
        self._fd: int | None = None
        self._size = 0

    def on(self) -> None:
        if self._fd is None:
            fd, path = tempfile.mkstemp(prefix="workload-io-", dir=self.directory)
            os.unlink(path)  # nothing to clean up if the server dies: the inode goes with the fd
            self._fd, self._size = fd, 0
        self.active = True

    def off(self) -> None:
        self.active = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def hook(self, batch_size: int) -> None:
        fd = self._fd
        if not self.active or fd is None:
            return
        for _ in range(self.writes_per_sequence * batch_size):
            if self._size >= self.MAX_FILE_BYTES:
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                self._size = 0
            self._size += os.write(fd, self._payload)
            os.fsync(fd)
            self.syncs += 1


class NoCache:
    """Turns the engine's KV cache off, as a bad deploy would."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def on(self) -> None:
        self.engine.use_cache = False

    def off(self) -> None:
        self.engine.use_cache = True


@dataclass
class FaultSet:
    """All switches of one server; `set` is the only way they change."""

    faults: dict[str, Fault]
    on_change: Callable[[str, bool], None] = lambda name, active: None
    state: dict[str, bool] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, name: str, active: bool) -> None:
        if name not in self.faults:
            raise UnknownFault(f"unknown fault {name!r}; choose one of {list(self.faults)}")
        with self._lock:
            if active:
                self.faults[name].on()
            else:
                self.faults[name].off()
            self.state[name] = active
        self.on_change(name, active)

    def active(self) -> dict[str, bool]:
        return {name: self.state.get(name, False) for name in self.faults}

    def all_off(self) -> None:
        for name in self.faults:
            if self.state.get(name):
                self.set(name, False)


def build_faults(scheduler: Scheduler, port: int, tuning: FaultTuning,
                 on_change: Callable[[str, bool], None]) -> FaultSet:
    return build_faults_at(scheduler.step_hooks, scheduler.serving_lock, scheduler.engine, port, tuning, on_change)


def build_faults_at(step_hooks: list[StepHook], lock: threading.Lock, engine: Engine | None, port: int,
                    tuning: FaultTuning, on_change: Callable[[str, bool], None]) -> FaultSet:
    """The switches over any step loop: the scheduler's, or the API process's output loop (`--in api`), which has
    no engine and so no `nocache`."""
    churn = GcChurn(tuning.gc_cycles_per_sequence)
    storm = SyscallStorm(tuning.syscalls_per_sequence)
    disk = DiskSync(tuning.io_writes_per_sequence, tuning.io_write_bytes, tuning.io_dir)
    step_hooks.extend([churn.hook, storm.hook, disk.hook])
    faults: dict[str, Fault] = {
        "gc": churn,
        "lock": LockHolder(lock, tuning.lock_hold_s, tuning.lock_period_s),
        "syscall": storm,
        "netloss": Netloss(port, tuning.netloss_percent),
        "cpuhog": CpuHog(tuning.cpuhog_per_cpu),
        "nocache": NoCache(engine) if engine is not None else None,
        "io": disk,
    }
    return FaultSet(faults={name: f for name, f in faults.items() if f is not None}, on_change=on_change)


def gc_debug() -> dict:
    """The collector's own counts: ground truth for the gc fault."""
    return {"collections": [s["collections"] for s in gc.get_stats()],
            "collected": [s["collected"] for s in gc.get_stats()]}

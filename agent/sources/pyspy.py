"""Continuous py-spy sampling of one process: one recorder, a low steady rate, bursts on demand."""

from __future__ import annotations

import atexit
import enum
import logging
import os
import select
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.sources.folded import DEFAULT_STACK_LIMITS, StackBudget, StackCuts, StackLimits, parse_summary
from agent.sources.thread_split import parse_by_thread, split_by_busy
from analysis.errors import (
    STEADY_RECORDING_RUNNING,
    AccessDenied,
    ProbeError,
    ReadingError,
    SourceUnavailable,
    TargetGone,
)
from analysis.health import Health
from analysis.window import StackReading
from probes.pidfd import ProcessHandle, read_uids

log = logging.getLogger("infersight.pyspy")

Runner = Callable[..., subprocess.Popen]


class BurstAsk(enum.IntEnum):
    """What a burst trigger answers: falsy for the steady rate; True (HELD) for the burst rate and
    `burst_hold_segments` segments more after it stops asking; UNHELD for the burst rate with no hold after it,
    for a trigger that decides every segment itself (agent.burst: a rise that has opened no episode yet, whose
    burst should end the segment its evidence does)."""

    NO = 0
    HELD = 1
    UNHELD = 2


WantsBurst = Callable[[], "bool | BurstAsk"]

# Defaults measured in docs/BENCHMARKS.md ("Stack sampling"): py-spy costs ~0.13% of a core per Hz on the
# 35-thread demo server (~0.4% loaded) plus ~15 ms of CPU per attach.
DEFAULT_RATE_HZ = 3
DEFAULT_BURST_RATE_HZ = 49
DEFAULT_SEGMENT_SECONDS = 5
# Steady (non-burst) recordings run longer: each attach costs ~15 ms of CPU, a third of the steady cost at 5 s
# (docs/BENCHMARKS.md "Steady segments of 15 s, bursts of 5 s"). A burst trigger cuts a steady recording short.
# Three windows: a third of the attaches. The detector reads the latest recording's lock signal for the windows
# between (analysis.steady_stacks) and its profile shift at one window's share of its samples (analysis.baseline),
# so replayed as 15 s recordings the recorded scenarios name the same causes (docs/BENCHMARKS.md); its lock signal is
# read net of the kernel's blocked waits over the windows it spanned (analysis.steady_stacks.lock_waits), so idle stacks
# taken while threads stalled on page faults are not carried on as a lock.
DEFAULT_STEADY_SEGMENT_SECONDS = 15
# How often a steady recording longer than a burst segment asks the burst trigger whether to end early.
TRIGGER_POLL_SECONDS = 1.0
DEFAULT_BURST_HOLD_SEGMENTS = 3

_BANNER = b"Sampling process"

# py-spy's privileges and limits, measured (docs/security.md, "py-spy: least privilege"). It reads the target's
# memory (process_vm_readv, /proc/PID/mem): that takes CAP_SYS_PTRACE even for a root target, whose capabilities
# a tracer without it lacks. It also parses the target's executable (through /proc/PID/exe) and libpython (by
# its path): one that root without CAP_DAC_READ_SEARCH cannot read (a venv or conda in a 0700 home) takes that
# capability too, granted to that target only (`_read_cap_needed`).
PTRACE_CAP = "sys_ptrace"
READ_CAP = "dac_read_search"
_CAP_BITS = {"dac_read_search": 2, "sys_ptrace": 19}
# Address space: py-spy 0.4.3's VmPeak was 32 MiB on the 35-thread demo server at 3-1000 Hz and 5-60 s segments,
# and it recorded at 40 MiB; a target with kilobyte function names in 600-frame stacks grew it to 2 GB in 5 s.
ADDRESS_SPACE_BYTES = 512 << 20
# Output file: the largest healthy one measured was 0.29 MB (1000 Hz for 60 s); the same bound is checked before
# the file is read.
OUTPUT_MAX_BYTES = 32 << 20
# A recorder not done this long after its segment should have ended is killed as hung.
HANG_SECONDS = 10


def cpu_limit_seconds(segment_seconds: int) -> int:
    """py-spy's CPU time limit: its two busy threads running flat out until it is killed as hung. A healthy
    recording used at most one core for its wall time (56.9 s of CPU for 60 s at 1000 Hz)."""
    return 2 * (segment_seconds + HANG_SECONDS)


def find_pyspy(executable: str = sys.executable) -> str | None:
    """The py-spy installed beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def confined(argv: list[str], *, setpriv: str, prlimit: str, caps: tuple[str, ...], segment_seconds: int) -> list[str]:
    """`argv` run with only `caps` (no inheritable, ambient or bounding ones besides; no new privileges),
    under py-spy's resource limits, and killed with the agent (even by `kill -9`)."""
    cpu = cpu_limit_seconds(segment_seconds)
    return [setpriv, "--pdeathsig", "KILL", "--no-new-privs", "--inh-caps=-all", "--ambient-caps=-all",
            "--bounding-set=-all," + ",".join(f"+{c}" for c in caps), "--",
            # The soft CPU limit sends SIGXCPU (a reason that says so), the hard one SIGKILL; no core file: it
            # would hold what py-spy read of the target's memory.
            prlimit, f"--as={ADDRESS_SPACE_BYTES}", f"--cpu={cpu}:{cpu + 5}", f"--fsize={OUTPUT_MAX_BYTES}",
            "--core=0", "--", *argv]


@dataclass
class _Segment:
    """One py-spy process recording every thread (`--idle --threads`) for `segment_seconds`."""

    launched_at: float
    rate_hz: int
    burst: bool
    proc: subprocess.Popen
    output: Path
    duration: int
    stdout: bytes = b""
    attached_at: float | None = None
    # When a burst trigger interrupted it (SIGINT: py-spy writes what it recorded so far); None if it ran its length.
    cut_at: float | None = None
    # Each thread's runnable nanoseconds (on CPU + in the run queue) when the recording began.
    runnable_before: dict[int, int] = field(default_factory=dict)

    def done(self) -> bool:
        return self.proc.poll() is not None


class SegmentFailed(Exception):
    """A py-spy process of a segment exited badly; carries its stderr's reason."""


class PySpySampler:
    """Samples `pid` with py-spy in back-to-back segments of `segment_seconds`, one recorder at a time.

    py-spy 0.4.3 writes folded output only when a recording ends and never marks a sample idle.
    Its cost is reading every thread on every tick, so one recorder reads all of them (`--idle
    --threads`) and the active/idle split comes from the kernel instead: each thread's runnable
    time over the segment (`/proc/PID/task/TID/schedstat`) says how many of its samples were
    active, its leaf frames say which (`thread_split`). The steady rate is low; while
    `wants_burst()` says so (a regression opening, the detector's score rising) segments run at
    `burst_rate_hz`, and `burst_hold_segments` more after it stops saying so. Steady segments last
    `steady_segment_seconds` (at least `segment_seconds`): fewer attaches, stacks that come with the
    window the recording ends in. While one records, the trigger is asked every second; when it fires,
    the steady recorder is interrupted (py-spy writes what it recorded) and the burst starts at once.
    The next segment is launched one attach-time before the current one stops sampling, so
    windows see no gap beyond what `health().detail['gap_seconds']` reports.

    py-spy takes a pid, and a pid can name another process once the target has exited. The sampler holds
    the target by a pidfd from `start()`: with `start_time` (discovery's), only the process that started then;
    before each launch it checks the pidfd (alive, same start time) and, with `allowed_uids`, the target's uids;
    after py-spy attached and after it exited it checks the pidfd again, and drops a recording the target did
    not outlive. The moment the pidfd reports the exit, every recorder is killed and the sampler stops.
    """

    name = "stacks"
    MAX_PENDING = 2

    def __init__(self, pid: int, rate_hz: int = DEFAULT_RATE_HZ, nonblocking: bool = True,
                 segment_seconds: int = DEFAULT_SEGMENT_SECONDS, burst_rate_hz: int = DEFAULT_BURST_RATE_HZ,
                 wants_burst: WantsBurst | None = None, burst_hold_segments: int = DEFAULT_BURST_HOLD_SEGMENTS,
                 runner: Runner = subprocess.Popen, pyspy_path: str | None = None,
                 clock: Callable[[], float] = time.monotonic, proc_root: Path = Path("/proc"),
                 backoff_initial: float = 0.5, backoff_max: float = 30.0, by_function: bool = True,
                 autostart: bool = True, start_time: int | None = None,
                 allowed_uids: frozenset[int] | None = None,
                 stack_limits: StackLimits = DEFAULT_STACK_LIMITS,
                 steady_segment_seconds: int | None = None) -> None:
        if pid <= 0:
            raise ValueError(f"pid must be positive, got {pid!r}")
        for key, value in (("rate_hz", rate_hz), ("burst_rate_hz", burst_rate_hz)):
            if not isinstance(value, int) or not 1 <= value <= 1000:
                raise ValueError(f"{key} must be a whole number within 1..1000, got {value!r}")
        if not isinstance(segment_seconds, int) or not 1 <= segment_seconds <= 60:
            # py-spy's --duration accepts whole seconds only.
            raise ValueError(f"segment_seconds must be a whole number within 1..60, got {segment_seconds!r}")
        steady = segment_seconds if steady_segment_seconds is None else steady_segment_seconds
        if not isinstance(steady, int) or not segment_seconds <= steady <= 60:
            raise ValueError(f"steady_segment_seconds must be a whole number within segment_seconds "
                             f"({segment_seconds})..60, got {steady!r}")
        if not isinstance(burst_hold_segments, int) or not 0 <= burst_hold_segments <= 1000:
            raise ValueError(f"burst_hold_segments must be a whole number within 0..1000, got {burst_hold_segments!r}")
        self.pid = pid
        self.rate_hz = rate_hz
        self.burst_rate_hz = burst_rate_hz
        self.nonblocking = nonblocking
        self.segment_seconds = segment_seconds
        self.steady_segment_seconds = steady
        self.burst_hold_segments = burst_hold_segments
        self.by_function = by_function
        self._wants_burst = wants_burst
        self._runner = runner
        self._pyspy = pyspy_path if pyspy_path is not None else find_pyspy()
        # util-linux: setpriv drops py-spy's capabilities and sets its death signal, prlimit its resource limits.
        self._setpriv = shutil.which("setpriv")
        self._prlimit = shutil.which("prlimit")
        self._expected_start = start_time
        self._allowed_uids = allowed_uids
        self._limits = stack_limits
        self._caps: tuple[str, ...] | None = None  # decided at the first launch
        self._handle: ProcessHandle | None = None
        # Wakes the supervising thread's waits at close(); the target's pidfd wakes them at its exit.
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._cuts = StackCuts()
        self._budget = StackBudget(stack_limits, self._cuts)
        self._clock = clock
        self._proc_root = proc_root
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max

        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._workdir: Path | None = None
        self._live: list[subprocess.Popen] = []
        self._active: Counter[str] = Counter()
        self._idle: Counter[str] = Counter()
        self._terminal: ProbeError | None = None
        self._counter = 0
        self._hold = 0
        # The trigger fired during a steady recording (its answer): the next segment bursts.
        self._triggered = BurstAsk.NO
        self._last_rate: int | None = None
        # Recent attach times: the next segment starts the slowest of them early, since a
        # gap loses samples for good while an overlap is only counted (both are in health).
        self._attach_recent: deque[float] = deque([0.05], maxlen=5)
        self._last_end: float | None = None
        self._recording_steady = False
        self._stats: dict[str, Any] = {"segments": 0, "burst_segments": 0, "restarts": 0, "gap_seconds": 0.0,
                                       "overlap_seconds": 0.0, "lost_seconds": 0, "pyspy_sample_errors": 0,
                                       "backoff_seconds": 0.0, "last_attach_seconds": None,
                                       "threads_split_by_leaf": 0, "rate_hz_now": None,
                                       "last_effective_rate_hz": None, "capabilities": None,
                                       "dropped_after_exit": 0, "steady_cut_for_burst": 0}
        self._errors = 0
        self._last_error: str | None = None
        self._error_since_read: str | None = None
        self._ticks = 0
        self._started_at: float | None = None
        self._last_read_at: float | None = None
        if autostart:
            self.start()

    # -- public -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        if self._pyspy is None:
            self._terminal = SourceUnavailable("py-spy is not installed beside the interpreter nor on PATH "
                                               "(pip install py-spy==0.4.3)")
            return
        if not os.access(self._pyspy, os.X_OK):
            self._terminal = SourceUnavailable(f"py-spy path {self._pyspy!r} is not an executable file")
            return
        if self._setpriv is None or self._prlimit is None:
            self._terminal = SourceUnavailable("setpriv and prlimit (util-linux) are needed to run py-spy with "
                                               "CAP_SYS_PTRACE only and under resource limits; install util-linux")
            return
        try:
            self._handle = ProcessHandle.open(self.pid, self._expected_start, self._proc_root)
        except ProbeError as exc:
            self._terminal = exc
            return
        self._started_at = self._clock()
        self._workdir = Path(tempfile.mkdtemp(prefix=f"infersight-pyspy-{self.pid}-"))
        self._thread = threading.Thread(target=self._supervise, name=f"pyspy-{self.pid}", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def read(self) -> StackReading:
        """Stacks of every segment finished since the previous read; raises once the target is gone."""
        with self._lock:
            if self._terminal is not None:
                raise type(self._terminal)(str(self._terminal))
            active, idle = self._active, self._idle
            self._active, self._idle = Counter(), Counter()
            self._budget = StackBudget(self._limits, self._cuts)
            now = self._clock()
            # Ticks actually merged per wall second since the last read: below the rate when py-spy
            # lagged (a starved CPU stretches a recording) or segments were lost or gapped.
            since = now - (self._last_read_at if self._last_read_at is not None else self._started_at or now)
            self._stats["last_effective_rate_hz"] = round(self._ticks / since, 2) if since > 0 else None
            ticks, self._ticks, self._last_read_at = self._ticks, 0, now
            failure, self._error_since_read = self._error_since_read, None
            rate = self._last_rate if self._last_rate is not None else self.rate_hz
            recording = self._recording_steady
        if ticks == 0:
            # Nothing sampled is not "no stacks": the window has no reading, with the reason.
            if failure:
                raise ReadingError(f"py-spy sampled nothing since the last read: {failure}")
            # Only a recording meant to span windows says so: the detector then reads the latest one's stacks for this
            # window (analysis.steady_stacks); a one-window recording running late is a gap like any other.
            if recording and self.steady_segment_seconds > self.segment_seconds:
                raise ReadingError(f"py-spy's steady recording ({self.steady_segment_seconds} s) is still running: "
                                   + STEADY_RECORDING_RUNNING)
            raise ReadingError("py-spy finished no recording since the last read")
        return StackReading(active=dict(active), idle=dict(idle), rate_hz=float(rate), samples=ticks)

    def close(self) -> None:
        self._stop.set()
        if self._wake >= 0:
            os.eventfd_write(self._wake, 1)
        if self._thread is not None:
            self._thread.join(timeout=self.steady_segment_seconds + 15)
        self._kill_live()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        if self._thread is None or not self._thread.is_alive():
            # Only once the supervising thread is done with them: a descriptor number closed under it is reused.
            if self._handle is not None:
                self._handle.close()
            if self._wake >= 0:
                os.close(self._wake)
                self._wake = -1
        atexit.unregister(self.close)

    def health(self) -> Health:
        with self._lock:
            detail = dict(self._stats)
            detail["children"] = [p.pid for p in self._live]
            detail["stack_limits_cut"] = asdict(self._cuts)
            if self._terminal is not None:
                state = "unsupported" if isinstance(self._terminal, SourceUnavailable) else "failed"
                reason: str | None = str(self._terminal)
            else:
                state, reason = "running", self._last_error
            return Health(name=self.name, state=state, reason=reason, error_count=self._errors, detail=detail)

    def child_pids(self) -> list[int]:
        """The py-spy processes running now (for tests and the status page)."""
        with self._lock:
            return [p.pid for p in self._live if p.poll() is None]

    # -- supervision ------------------------------------------------------------------------

    def _supervise(self) -> None:
        failures = 0
        # Segments still recording (or still exiting), oldest first. They are settled as they
        # finish, never waited for on schedule: on a starved CPU py-spy falls behind and a
        # "5 s" recording can take longer, which must not stall the next launch.
        pending: deque[_Segment] = deque()

        def settle(block: bool) -> None:
            nonlocal failures
            while pending and (block or pending[0].done()):
                failures = 0 if self._finish(pending.popleft()) else failures + 1
                block = False

        try:
            while not self._stop.is_set() and self._terminal is None:
                if failures:
                    self._pause(min(self._backoff_initial * 2 ** (failures - 1), self._backoff_max))
                    if self._stop.is_set() or self._terminal is not None:
                        break
                if len(pending) >= self.MAX_PENDING:
                    settle(block=True)  # backpressure: more recorders would only slow py-spy further
                    continue
                try:
                    current = self._launch()
                except SegmentFailed as exc:
                    self._record_error(str(exc), restart=True)
                    failures += 1
                    continue
                except (TargetGone, AccessDenied) as exc:  # the check right before the launch
                    self._set_terminal(exc)
                    break
                attached = self._await_attach(current)
                settle(block=False)
                if self._terminal is not None:
                    self._abandon(current)
                    break
                if not attached:
                    failure = self._abandon(current)
                    if self._stop.is_set() or self._target_state(failure):
                        break
                    self._record_error(f"py-spy failed to attach to pid {self.pid}: {failure}", restart=True)
                    failures += 1
                    continue
                self._account_gap(current)
                pending.append(current)
                watch = not current.burst and current.duration > self.segment_seconds and self._wants_burst is not None
                with self._lock:
                    self._recording_steady = not current.burst
                wake = current.attached_at + current.duration - max(self._attach_recent)  # type: ignore[operator]
                ask = self._clock() + TRIGGER_POLL_SECONDS
                while not self._stop.is_set() and self._terminal is None and self._clock() < wake:
                    # Sleep until the oldest recording is due to end, then poll it every 0.1 s: a
                    # fixed 0.1 s poll woke this thread 50 times per segment for nothing.
                    now = self._clock()
                    due = pending[0].attached_at + pending[0].duration if pending else wake  # type: ignore[operator]
                    until = min(wake - now, max(0.1, due - now))
                    if watch:
                        until = min(until, max(0.0, ask - now))
                    self._sleep(max(0.0, until))
                    if self._terminal is None:
                        settle(block=False)
                    if watch and self._clock() >= ask:
                        ask = self._clock() + TRIGGER_POLL_SECONDS
                        if answer := self._trigger_fired():
                            self._cut(current, answer)
                            break
            # Stopping, or the target is gone: the recordings still running are cut short and dropped.
            for segment in pending:
                self._abandon(segment)
        finally:
            self._kill_live()

    def _sleep(self, seconds: float) -> None:
        """Wait up to `seconds`; close() ends the wait, and so does the target's exit, which stops sampling."""
        assert self._handle is not None
        poller = select.poll()
        poller.register(self._wake, select.POLLIN)
        poller.register(self._handle.fileno(), select.POLLIN)
        if any(fd == self._handle.fileno() for fd, _ in poller.poll(seconds * 1000)):
            self._target_exited()

    def _target_exited(self) -> None:
        """The pidfd reports the exit: once the target is reaped its pid may name another process, which
        py-spy (reading by pid) must not read, so every recorder is killed now, not at its segment's end."""
        self._kill_live()
        self._set_terminal(TargetGone(f"target pid {self.pid} exited"))

    def _trigger_fired(self) -> BurstAsk:
        """The trigger's answer (falsy: no burst); True or BurstAsk.HELD asks for the hold after it, UNHELD not."""
        if self._wants_burst is None:
            return BurstAsk.NO
        try:
            answer = self._wants_burst()
        except Exception as exc:  # the trigger is the daemon's code: a fault there costs the burst, not sampling
            self._record_error(f"burst trigger failed: {exc!r}", restart=False)
            return BurstAsk.NO
        if not answer:
            return BurstAsk.NO
        return BurstAsk.UNHELD if answer is BurstAsk.UNHELD else BurstAsk.HELD

    def _cut(self, segment: _Segment, answer: BurstAsk = BurstAsk.HELD) -> None:
        """End a steady recording early for a burst: on SIGINT py-spy stops sampling and writes what it
        recorded, so its samples reach the next read and the burst starts now, not at the segment's end."""
        if segment.proc.poll() is not None:
            return
        segment.cut_at = self._clock()
        segment.proc.send_signal(signal.SIGINT)
        self._triggered = answer
        with self._lock:
            self._stats["steady_cut_for_burst"] += 1
            # The next segment is launched at once: the cut one ends here, not at its planned end.
            self._last_end = segment.cut_at

    def _burst_now(self) -> bool:
        """Decided once per segment: the trigger, or the hold left over from its last firing. An UNHELD answer
        adds no hold (a hold an earlier HELD answer left still runs out after it)."""
        wanted, self._triggered = self._triggered or self._trigger_fired(), BurstAsk.NO
        if wanted:
            if wanted is not BurstAsk.UNHELD:
                self._hold = self.burst_hold_segments
            return True
        if self._hold > 0:
            self._hold -= 1
            return True
        return False

    def _launch(self) -> _Segment:
        self._check_target()
        if self._caps is None:
            self._caps = (PTRACE_CAP, READ_CAP) if self._read_cap_needed() else (PTRACE_CAP,)
        self._counter += 1
        burst = self._burst_now()
        rate = self.burst_rate_hz if burst else self.rate_hz
        duration = self.segment_seconds if burst else self.steady_segment_seconds
        assert self._workdir is not None
        output = self._workdir / f"seg{self._counter}.txt"
        argv = [self._pyspy, "record", "--pid", str(self.pid), "--rate", str(rate),
                "--duration", str(duration), "--format", "raw", "--threads", "--idle",
                "--output", str(output)]
        if self.nonblocking:
            argv.append("--nonblocking")
        if self.by_function:
            # Keys by a function's first line: stable across segments and windows.
            argv.append("--function")
        assert self._setpriv is not None and self._prlimit is not None
        # setpriv and prlimit set the privileges and limits and exec py-spy, so Popen can vfork: a preexec_fn
        # forces a full fork that copies the agent's page tables (7.2 -> 2.1 ms of CPU per launch, measured).
        assert self._caps is not None
        launch = confined(argv, setpriv=self._setpriv, prlimit=self._prlimit, caps=self._caps,
                          segment_seconds=duration)
        try:
            proc = self._runner(launch, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            raise SegmentFailed(f"cannot run {self._pyspy}: {exc}") from exc
        with self._lock:
            self._live.append(proc)
            self._stats["rate_hz_now"] = rate
        return _Segment(launched_at=self._clock(), rate_hz=rate, burst=burst, proc=proc, output=output,
                        duration=duration)

    def _read_cap_needed(self) -> bool:
        """Whether py-spy, confined to CAP_SYS_PTRACE, would be refused the target's interpreter files: tried
        by opening them the way py-spy does (the executable through /proc/PID/exe, libpython by its path
        under /proc/PID/root) from a process confined the same way. py-spy's own error does not always say so."""
        files = [f"/proc/{self.pid}/exe"]
        try:
            with open(f"/proc/{self.pid}/maps", "rb") as fh:
                mapped = {parts[5].strip() for line in fh if len(parts := line.split(maxsplit=5)) == 6}
        except OSError:
            return False  # gone: the launch's own check says so
        for path in sorted(p for p in mapped if p.startswith(b"/") and b"libpython" in p.rsplit(b"/", 1)[-1]):
            full = f"/proc/{self.pid}/root" + path.decode(errors="surrogateescape")
            try:
                if stat.S_ISREG(os.stat(full).st_mode):  # the target names it: no FIFO or device is opened
                    files.append(full)
            except OSError:
                continue
        assert self._setpriv is not None and self._prlimit is not None
        # dd opens without blocking and reads nothing: the open is the test.
        script = 'for f do dd if="$f" of=/dev/null count=0 iflag=nonblock status=none || exit 1; done'
        argv = confined(["sh", "-c", script, "sh", *files], setpriv=self._setpriv, prlimit=self._prlimit,
                        caps=(PTRACE_CAP,), segment_seconds=1)
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=10).returncode != 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _check_target(self) -> None:
        """Right before a launch: the pid still names the process held since start() (alive, same start time),
        and every one of its uids is still allowed (a root target may have switched to another user)."""
        assert self._handle is not None
        self._handle.check()
        if self._allowed_uids is None:
            return
        uids = read_uids(self.pid, self._proc_root)
        if not self._handle.alive():
            raise TargetGone(f"target pid {self.pid} exited")
        if bad := [u for u in uids if u not in self._allowed_uids]:
            raise AccessDenied(f"target pid {self.pid} now runs as uid {bad[0]}, not root or a user in "
                               "allowed_users: py-spy is not run on it")

    def _await_attach(self, segment: _Segment, timeout: float = 10.0) -> bool:
        """Wait until the recorder printed its banner (printed once attached); False if it died."""
        deadline = self._clock() + timeout
        stdout = segment.proc.stdout
        assert stdout is not None and self._handle is not None
        with selectors.DefaultSelector() as sel:
            sel.register(stdout, selectors.EVENT_READ)
            sel.register(self._handle.fileno(), selectors.EVENT_READ)
            while segment.attached_at is None:
                left = deadline - self._clock()
                if left <= 0 or self._stop.is_set():
                    return False
                for key, _ in sel.select(timeout=min(left, 0.5)):
                    if key.fd == self._handle.fileno():
                        return False  # the target exited: whatever py-spy attached to, it is not used
                    chunk = os.read(key.fd, 4096)
                    if not chunk:
                        return False
                    segment.stdout += chunk
                    if _BANNER in segment.stdout:
                        segment.attached_at = self._clock()
        # Alive now: the target held its pid from the check before the launch until after the attach, so the pid
        # py-spy resolved was the target's.
        if not self._handle.alive():
            return False
        self._note_capabilities(segment.proc.pid)
        segment.runnable_before = self._runnable_ns()
        attach = segment.attached_at - segment.launched_at
        self._attach_recent.append(attach)
        with self._lock:
            self._stats["last_attach_seconds"] = round(attach, 4)
        return True

    def _runnable_ns(self) -> dict[int, int]:
        """Each thread's time on a CPU plus in the run queue, in ns (schedstat); {} where unreadable."""
        out: dict[int, int] = {}
        try:
            tids = os.listdir(self._proc_root / str(self.pid) / "task")
        except OSError:
            return out
        for tid in tids:
            try:
                fields = (self._proc_root / str(self.pid) / "task" / tid / "schedstat").read_text().split()
                out[int(tid)] = int(fields[0]) + int(fields[1])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended between listing and reading: it is judged by its leaf frames
        return out

    def _finish(self, segment: _Segment) -> bool:
        """Wait for a segment's recorder, parse its output, split it and add it to the pending reading."""
        assert self._handle is not None
        cuts = StackCuts()
        try:
            out, err = self._wait(segment, timeout=segment.duration + HANG_SECONDS)
            segment.stdout += out
            if not self._handle.alive():
                # py-spy reads by pid on every tick: once the target is reaped another process may hold it.
                with self._lock:
                    self._stats["dropped_after_exit"] += 1
                raise SegmentFailed(f"target pid {self.pid} exited during the recording; the segment is dropped")
            if segment.proc.returncode != 0:
                raise SegmentFailed(_reason(err, segment.proc.returncode))
            ended = self._clock()
            runnable_after = self._runnable_ns()
            summary = parse_summary(segment.stdout.decode(errors="replace"))
            threads = self._parse_output(segment.output, cuts)
        except (SegmentFailed, ValueError, OSError) as exc:
            self._abandon(segment)
            with self._lock:
                self._stats["lost_seconds"] += segment.duration
            if not self._target_state(str(exc)):
                self._record_error(f"py-spy segment lost: {exc}", restart=True)
            return False
        finally:
            segment.output.unlink(missing_ok=True)
        span_ns = max((ended - (segment.attached_at or ended)) * 1e9, 1.0)
        busy = {tid: (runnable_after[tid] - before) / span_ns
                for tid, before in segment.runnable_before.items() if tid in runnable_after}
        active, idle = split_by_busy(threads, busy)
        with self._lock:
            # The reading's own bound: segments merged until the next read() hold no more than one parse may.
            for merged, stacks in ((self._active, active), (self._idle, idle)):
                for stack, count in stacks.items():
                    merged[self._budget.admit(stack, count)] += count
            self._cuts.add(cuts)
            self._stats["segments"] += 1
            self._stats["burst_segments"] += int(segment.burst)
            self._stats["threads_split_by_leaf"] += sum(1 for tid in threads if tid not in busy)
            # py-spy takes rate*duration - 1 ticks per recording (observed with 0.4.3); one cut short, a tick per
            # 1/rate seconds it sampled.
            if segment.cut_at is not None and segment.attached_at is not None:
                self._ticks += max(1, round((segment.cut_at - segment.attached_at) * segment.rate_hz))
            else:
                self._ticks += segment.rate_hz * segment.duration - 1
            self._last_rate = segment.rate_hz
            self._stats["pyspy_sample_errors"] += summary[1] if summary else 0
        return True

    def _parse_output(self, output: Path, cuts: StackCuts) -> dict:
        """py-spy's raw output, its size checked on the open file before a byte is read, parsed within the
        stack limits as it is read; {} when py-spy wrote none."""
        try:
            fd = os.open(output, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise SegmentFailed(f"py-spy's output {output} is not a regular file")
            if info.st_size > OUTPUT_MAX_BYTES:
                raise SegmentFailed(f"py-spy wrote {info.st_size} bytes, over the {OUTPUT_MAX_BYTES >> 20} MiB "
                                    "read bound: not read")
            return parse_by_thread(fh, self._limits, cuts)

    def _note_capabilities(self, pid: int) -> None:
        """Record the capabilities py-spy really runs with (setpriv cannot drop any without CAP_SETPCAP, and
        says nothing then); warn once if it holds more than it was given."""
        try:
            with open(f"/proc/{pid}/status", "rb") as fh:
                line = next(ln for ln in fh if ln.startswith(b"CapEff:"))
        except (OSError, StopIteration):
            return
        held = int(line.split()[1], 16)
        assert self._caps is not None
        wanted = sum(1 << _CAP_BITS[c] for c in self._caps)
        names = ",".join(c for c in self._caps if held & (1 << _CAP_BITS[c]))
        shown = names if held == wanted else f"{held:#x} (more than {','.join(self._caps)}: not reduced)"
        with self._lock:
            first = self._stats["capabilities"] != shown
            self._stats["capabilities"] = shown
        if first and held != wanted:
            log.warning("py-spy for pid %d runs with capabilities %s, not only %s: the agent needs CAP_SETPCAP to "
                        "drop them", self.pid, f"{held:#x}", ",".join(self._caps))

    def _wait(self, segment: _Segment, timeout: float) -> tuple[bytes, bytes]:
        try:
            out, err = segment.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            segment.proc.kill()
            segment.proc.communicate()
            raise SegmentFailed(f"py-spy recorder hung past {timeout:.0f} s") from exc
        finally:
            self._forget(segment.proc)
        return out or b"", err or b""

    def _abandon(self, segment: _Segment) -> str:
        """Kill a segment that will not be used; returns the recorder's error text."""
        ended_by_itself = segment.proc.poll() is not None
        if not ended_by_itself:
            segment.proc.kill()
        _, err = segment.proc.communicate()
        self._forget(segment.proc)
        segment.output.unlink(missing_ok=True)
        # A recorder something else killed (the OOM killer, an operator's kill -9) says so; only our own
        # kill of a recorder that never attached is "stopped before attaching".
        if ended_by_itself and segment.proc.returncode != 0:
            return _reason(err or b"", segment.proc.returncode)
        return "stopped before attaching"

    def _account_gap(self, segment: _Segment) -> None:
        start = segment.attached_at
        assert start is not None
        with self._lock:
            if self._last_end is not None:
                delta = start - self._last_end
                key = "gap_seconds" if delta >= 0 else "overlap_seconds"
                self._stats[key] = round(self._stats[key] + abs(delta), 4)
            self._last_end = start + segment.duration

    def _target_state(self, failure: str) -> bool:
        """Make the failure terminal when the target is gone or refuses us; True if it did."""
        assert self._handle is not None
        terminal: ProbeError | None = None
        if not self._handle.alive():
            terminal = TargetGone(f"target pid {self.pid} is gone")
        elif "permission denied" in failure.lower():
            terminal = AccessDenied(f"py-spy may not read pid {self.pid}: {failure}")
        if terminal is None:
            return False
        self._set_terminal(terminal)
        return True

    def _set_terminal(self, terminal: ProbeError) -> None:
        with self._lock:
            if self._terminal is None:
                self._terminal = terminal
                self._errors += 1

    def _record_error(self, reason: str, restart: bool) -> None:
        with self._lock:
            self._errors += 1
            self._last_error = self._error_since_read = reason
            if restart:
                self._stats["restarts"] += 1

    def _pause(self, seconds: float) -> None:
        with self._lock:
            self._stats["backoff_seconds"] = round(self._stats["backoff_seconds"] + seconds, 3)
        self._stop.wait(seconds)

    # -- children ---------------------------------------------------------------------------

    def _forget(self, proc: subprocess.Popen) -> None:
        with self._lock:
            if proc in self._live:
                self._live.remove(proc)

    def _kill_live(self) -> None:
        with self._lock:
            live, self._live = self._live, []
        for proc in live:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()  # reaps: no zombie, and closes the pipes


def _reason(stderr: bytes, returncode: int | None) -> str:
    text = stderr.decode(errors="replace")
    if returncode == -signal.SIGXFSZ:
        return f"py-spy's output passed its {OUTPUT_MAX_BYTES >> 20} MiB file size limit (killed by SIGXFSZ)"
    if returncode == -signal.SIGXCPU:
        return "py-spy passed its CPU time limit (killed by SIGXCPU)"
    if "memory allocation of" in text:
        return (f"py-spy ran out of its {ADDRESS_SPACE_BYTES >> 20} MiB address space limit "
                f"(exit {returncode}): the target's stacks are too many or too long")
    for line in text.splitlines():
        if line.startswith("Error:") or "Permission Denied" in line or "panicked" in line:
            return f"{line.strip()} (exit {returncode})"
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exit {returncode}: {text.strip()[:200] or 'no message'}"

"""Run the enabled BPF probes together: start what can start, report what cannot, read them all per tick."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from probes.base import Probe, ProbeHealth
from probes.errors import ProbeError, Unsupported

log = logging.getLogger("infersight.probes")


def _syscalls() -> Probe:
    from probes.syscalls import SyscallsProbe

    return SyscallsProbe()


def _offcpu() -> Probe:
    from probes.offcpu import OffCpuProbe

    return OffCpuProbe()


def _gc() -> Probe:
    from probes.gcpause import GcPauseProbe

    return GcPauseProbe()


def _tcp() -> Probe:
    from probes.tcpretrans import TcpRetransProbe

    return TcpRetransProbe()


def _runqueue() -> Probe:
    from probes.runqlat import RunqlatProbe

    return RunqlatProbe()


# Config names (agent.config.ProbesConfig fields) -> constructors; imports are lazy because BCC costs ~76 MB.
PROBE_FACTORIES: dict[str, Callable[[], Probe]] = {
    "syscalls": _syscalls,
    "offcpu": _offcpu,
    "gc": _gc,
    "tcp": _tcp,
    "runqueue": _runqueue,
}


# Probes that split intervals still open at read time (off-CPU time belongs to the window it passes in).
BOUNDARY_FIRST = ("offcpu",)


class ProbeSet:
    """Owns the probes; a probe that fails to start or read is reported in its health, never raised."""

    def __init__(self, enabled: Iterable[str], factories: dict[str, Callable[[], Probe]] | None = None) -> None:
        factories = factories or PROBE_FACTORIES
        self._enabled = list(enabled)
        unknown = [n for n in self._enabled if n not in factories]
        if unknown:
            raise ValueError(f"unknown probe name(s) {unknown!r}; known: {sorted(factories)}")
        self._factories = factories
        self._running: dict[str, Probe] = {}
        self._failed: dict[str, ProbeHealth] = {}
        # Probes that could trace none of the targets so far (gcpause with no Python target): retried
        # whenever the targets change, since the next target may be one they support.
        self._retry: set[str] = set()
        self.read_errors: dict[str, int] = {}
        # Probe name -> why its last set_targets() failed; its new targets then have no reading.
        self._target_errors: dict[str, str] = {}

    def start(self, tgids: Iterable[int]) -> None:
        tgids = list(tgids)
        for name in self._enabled:
            self._start_one(name, tgids)

    def _start_one(self, name: str, tgids: list[int]) -> None:
        probe = None
        try:
            probe = self._factories[name]()
            probe.start(tgids)
        except Unsupported as exc:
            if probe is not None and probe.health().state == "running":
                log.info("probe %s cannot trace some targets: %s", name, exc)
                self._running[name] = probe
                return
            log.info("probe %s supports none of the targets: %s", name, exc)
            self._failed[name] = ProbeHealth(name=name, state="unsupported", reason=str(exc),
                                             unsupported={pid: str(exc) for pid in tgids})
            self._retry.add(name)
        except (ProbeError, ImportError, OSError, ValueError, RuntimeError) as exc:
            log.warning("probe %s unavailable: %s", name, exc)
            self._failed[name] = ProbeHealth(name=name, state="failed", reason=str(exc))
            if probe is not None:
                _stop_quietly(name, probe)
        else:
            self._running[name] = probe

    def set_targets(self, tgids: Iterable[int]) -> None:
        tgids = list(tgids)
        for name, probe in list(self._running.items()):
            self._target_errors.pop(name, None)
            try:
                probe.set_targets(tgids)
            except Unsupported as exc:
                log.info("probe %s cannot trace a new target: %s", name, exc)
            except (ProbeError, ValueError, RuntimeError, OSError) as exc:
                log.warning("probe %s could not change targets: %s", name, exc)
                self.read_errors[name] = self.read_errors.get(name, 0) + 1
                self._target_errors[name] = f"changing its targets failed: {exc}"
        for name in sorted(self._retry):
            self._retry.discard(name)
            del self._failed[name]
            self._start_one(name, tgids)

    def unsupported(self, pid: int) -> dict[str, str]:
        """Probe name -> why it cannot trace `pid` (its window then has no reading from that probe)."""
        out = {name: h.unsupported[pid] for name, h in self._failed.items() if pid in h.unsupported}
        for name, probe in self._running.items():
            reason = probe.health().unsupported.get(pid)
            if reason:
                out[name] = reason
        return out

    def missing_reason(self, name: str, pid: int) -> str:
        """Why probe `name` gave no reading for `pid` when it named no reason of its own."""
        why = self._target_errors.get(name)
        return f"{name} does not measure pid {pid}" + (f" ({why})" if why else "")

    def read(self) -> tuple[dict[str, dict[int, Any]], dict[str, str]]:
        """Readings per probe per tgid, and the error of each probe that failed this read."""
        readings: dict[str, dict[int, Any]] = {}
        errors: dict[str, str] = {}
        # Probes whose read cuts time at the moment it starts go first, so their boundary is the window's.
        order = sorted(self._running.items(), key=lambda item: item[0] not in BOUNDARY_FIRST)
        for name, probe in order:
            try:
                readings[name] = probe.read()
            except (ProbeError, ValueError, RuntimeError, OSError) as exc:
                self.read_errors[name] = self.read_errors.get(name, 0) + 1
                errors[name] = str(exc)
        for name, health in self._failed.items():
            if health.state != "unsupported":  # per-target reasons go through unsupported(pid)
                errors[name] = f"{health.state}: {health.reason}"
        return readings, errors

    def host_tcp(self) -> Any | None:
        """Host-wide TCP retransmits of the last read (the tcp probe keeps them beside the per-target view)."""
        probe = self._running.get("tcp")
        return probe.last_host if probe is not None else None

    def health(self) -> dict[str, dict[str, Any]]:
        out = {name: h.to_dict() for name, h in self._failed.items()}
        for name, probe in self._running.items():
            h = probe.health().to_dict()
            h["read_errors"] = self.read_errors.get(name, 0)
            out[name] = h
        return out

    def stop(self) -> None:
        for name, probe in self._running.items():
            _stop_quietly(name, probe)
        self._running.clear()


def _stop_quietly(name: str, probe: Probe) -> None:
    """Stop a probe; a failure to stop is logged, since the agent is leaving that probe either way."""
    try:
        probe.stop()
    except (ProbeError, ValueError, RuntimeError, OSError) as exc:
        log.warning("probe %s did not stop cleanly: %s", name, exc)

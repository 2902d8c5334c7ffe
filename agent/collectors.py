"""The one registry of collectors: host-wide BPF probes and per-target user-space sources, read alike."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.sources.protocol import Begins, Source
from agent.targets import Member, Target, read_member
from analysis import culprits
from analysis.errors import AccessDenied, NoAnswer, ProbeError, TargetGone, Unsupported
from analysis.family import PER_MEMBER, family_total, member_summary
from analysis.health import Health
from analysis.window import MemberReading
from probes.base import Probe

if TYPE_CHECKING:
    from probes.exits import ExitsProbe
from probes.pidfd import ProcessHandle

log = logging.getLogger("infersight.collectors")

# What a collector may raise on start/read/set_targets without taking the agent down: the domain errors,
# and what probes and libraries raise for bad state or values (counted and shown, never a silent zero).
COLLECTOR_ERRORS = (ProbeError, ValueError, RuntimeError, OSError)


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


def _delivery() -> Probe:
    from probes.delivery import DeliveryProbe

    return DeliveryProbe()


# Window field (= config key = metric label) -> probe constructor; imports are lazy because BCC costs ~76 MB.
PROBE_FACTORIES: dict[str, Callable[[], Probe]] = {
    "syscalls": _syscalls,
    "offcpu": _offcpu,
    "gc": _gc,
    "tcp": _tcp,
    "runqueue": _runqueue,
    "delivery": _delivery,
}

def exits_probe(enabled: bool) -> ExitsProbe | None:
    """The exits probe (how a target's process ended) when `[probes] exits` is on; lazy for the same reason."""
    if not enabled:
        return None
    from probes.exits import ExitsProbe

    return ExitsProbe()


# Probes that split intervals still open at read time (off-CPU time belongs to the window it passes in).
BOUNDARY_FIRST = ("offcpu",)

SourceFactories = dict[str, Callable[[], Source]]
MemberKey = tuple[int, int]


@dataclass
class Collected:
    """One target's share of a read: Window field -> reading, and Window field -> why there is none."""

    readings: dict[str, Any] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    # Of `missing`, the sources whose target did not answer at all (NoAnswer), and of those, the ones that could
    # not even connect, and of those, the ones whose loopback port had no listening socket at all.
    unanswered: set[str] = field(default_factory=set)
    unreachable: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    # A family target's members, each with its own figures; the readings above are then the family's totals.
    members: list[MemberReading] = field(default_factory=list)


@dataclass
class _TargetSources:
    sources: dict[str, Source] = field(default_factory=dict)
    broken: dict[str, Health] = field(default_factory=dict)


class Collectors:
    """Every collector, by the Window field it fills; one that fails to start or read is reported, never raised.

    Probes are host-wide (one instance traces every target); sources are built per target by
    `make_sources` and closed when the target goes. Both answer the same contract: a reading per
    measured target, a reason per target they cannot measure, and `health()`.
    """

    def __init__(self, probes: Iterable[str], make_sources: Callable[[Target], SourceFactories] | None = None,
                 probe_factories: dict[str, Callable[[], Probe]] | None = None,
                 proc_root: Path = Path("/proc"),
                 make_member_sources: Callable[[Target, Member], SourceFactories] | None = None) -> None:
        factories = probe_factories or PROBE_FACTORIES
        self._enabled = list(probes)
        unknown = [n for n in self._enabled if n not in factories]
        if unknown:
            raise ValueError(f"unknown probe name(s) {unknown!r}; known: {sorted(factories)}")
        self._factories = factories
        self._make_sources = make_sources or (lambda target: {})
        self._make_member_sources = make_member_sources or (lambda target, member: {})
        self._proc_root = proc_root
        self._running: dict[str, Probe] = {}
        self._failed: dict[str, Health] = {}
        # Probes that could trace none of the targets so far (gc with no Python target): retried
        # whenever the targets change, since the next target may be one they support.
        self._retry: set[str] = set()
        self._read_errors: dict[str, int] = {}
        # Probe name -> why its last set_targets() failed; its new targets then have no reading.
        self._target_errors: dict[str, str] = {}
        self._targets: dict[tuple[int, int], Target] = {}
        self._sources: dict[tuple[int, int], _TargetSources] = {}
        # A family target's per-process sources (process facts, py-spy), by (target key, member key).
        self._member_sources: dict[tuple[tuple[int, int], MemberKey], _TargetSources] = {}
        # Each measured process (a target's, or each member of a family), held by a pidfd: probes attach by pid
        # only while it is alive (see _pids).
        self._handles: dict[MemberKey, ProcessHandle] = {}
        # Pid -> why probes do not attach to it (it exited, or its pid now names another process).
        self._not_held: dict[int, str] = {}
        # Child process -> parent, of the children probes followed in the kernel (families), as of the last read.
        self._children: dict[int, int] = {}
        self._last_readings: dict[str, dict[int, Any]] = {}
        # Host-wide readings of the last read, by Window field (tcp: every retransmit on the host).
        self.host: dict[str, Any] = {}
        # Running probe -> the targets it said it cannot measure, as of the last read.
        self._probe_unsupported: dict[str, dict[int, str]] = {}

    # -- targets --------------------------------------------------------------------------------

    def start(self, targets: Iterable[Target]) -> None:
        for target in targets:
            self._add(target)
        pids = self._pids()
        for name in self._enabled:
            self._start_probe(name, pids)
        self._drop_exited(pids)

    def set_targets(self, targets: Iterable[Target]) -> None:
        """Build sources for new targets and members, close those of gone ones, and retarget every probe."""
        wanted = {t.key: t for t in targets}
        changed = set(wanted) != set(self._targets)
        for key in [k for k in self._targets if k not in wanted]:
            self._remove(key)
        for key, target in wanted.items():
            if key in self._targets:
                # Renamed (name <-> name#pid) or its family changed: same leader, same target-wide sources.
                old = self._targets[key]
                self._targets[key] = target
                changed |= self._update_members(old, target)
            else:
                self._add(target)
        # Children the kernel followed from a member that discovery does not list (they ended, or left the family:
        # a daemon that reparented itself): the probes let go of them now.
        changed |= bool(set(self._children) - {k[0] for t in self._targets.values() for k in t.member_keys})
        if not changed:
            return
        pids = self._pids()
        for name, probe in list(self._running.items()):
            self._target_errors.pop(name, None)
            try:
                try:
                    probe.set_targets(pids)
                except Unsupported as exc:  # it traces the others, and follows them below
                    log.info("probe %s cannot trace a new target: %s", name, exc)
                self._follow(probe, pids)
            except COLLECTOR_ERRORS as exc:
                log.warning("probe %s could not change targets: %s", name, exc)
                self._count_error(name)
                self._target_errors[name] = f"changing its targets failed: {exc}"
            except Exception as exc:  # one probe's surprise must not stop the others: logged, counted, shown
                self._target_errors[name] = self._unexpected(name, "changing its targets", exc)
        for name in sorted(self._retry):
            self._retry.discard(name)
            del self._failed[name]
            self._start_probe(name, pids)
        self._drop_exited(pids)

    # -- reading --------------------------------------------------------------------------------

    def read(self) -> dict[tuple[int, int], Collected]:
        """Every target's readings and missing reasons; probes first, so their cut is the window's end."""
        for entry in [*self._sources.values(), *self._member_sources.values()]:
            for source in entry.sources.values():
                if isinstance(source, Begins):
                    source.begin()
        probe_readings, probe_errors = self._read_probes()
        out: dict[tuple[int, int], Collected] = {}
        for key, target in self._targets.items():
            collected = Collected()
            if target.members:
                self._family_share(target, probe_readings, probe_errors, collected)
            else:
                self._probe_share(target.pid, probe_readings, probe_errors, collected)
            self._read_sources(self._sources[key], collected)
            out[key] = collected
        return out

    def _forked(self, target: Target, roles: dict[int, str]) -> list[Member]:
        """Children the probes followed in the kernel from the family's members and that discovery has not listed
        (most often: they lived and ended between two windows). A child's role is its own while it lives, else its
        parent's: a fork runs the parent's program until it execs."""
        found: list[Member] = []
        read = {pid for per_pid in self._last_readings.values() for pid in per_pid}
        pending = {c: p for c, p in self._children.items() if c not in roles and c in read}
        while True:
            placed = [(c, p) for c, p in pending.items() if p in roles]
            if not placed:
                return found
            for child, parent in sorted(placed):
                try:
                    member = read_member(child, self._proc_root)  # its own role: it may have exec'd
                except (TargetGone, AccessDenied):
                    member = Member(pid=child, start_time=0, role=roles[parent], cmdline=())
                roles[child] = member.role
                found.append(member)
                del pending[child]

    def _family_share(self, target: Target, readings: dict[str, dict[int, Any]], errors: dict[str, str],
                      out: Collected) -> None:
        """Each member's probe and source readings, kept per member and summed into the family's. A reading the
        family has from none of its members is missing with the leader's reason (or the first member's)."""
        parts: dict[str, list[tuple[str, Any]]] = {}
        reasons: dict[str, str] = {}
        roles = {m.pid: m.role for m in target.members}
        listed = set(roles)
        for member in [*target.members, *self._forked(target, roles)]:
            own = Collected()
            self._probe_share(member.pid, readings, errors, own)
            if (entry := self._member_sources.get((target.key, member.key))) is not None:
                self._read_sources(entry, own)
            elif member.pid not in listed:
                own.missing.setdefault("process", "a child process the kernel followed from its fork; it was not "
                                                  "found by discovery (it ended first), so only the probes saw it")
            for name, reading in own.readings.items():
                parts.setdefault(name, []).append((member.role, reading))
            for name, why in own.missing.items():
                reasons.setdefault(name, f"pid {member.pid} ({member.role}): {why}")
            out.members.append(member_summary(member.pid, member.role, own.readings, own.missing))
        for name in PER_MEMBER:
            if name in parts:
                out.readings[name] = family_total(name, parts[name])
            elif name in reasons:
                out.missing[name] = reasons[name]
        if (runqueue := out.readings.get("runqueue")) is not None:
            runqueue.culprits = culprits.merge([runqueue.culprits], {m.pid for m in out.members})
        for name, why in reasons.items():
            if name not in PER_MEMBER:
                out.missing.setdefault(name, why)  # a probe error that is not a reading (host-wide failures)

    def health(self) -> dict[str, Health]:
        """Probes by name; sources by `name:target` (one instance per target)."""
        out = {name: h.copy() for name, h in self._failed.items()}
        for name, h in out.items():
            h.error_count += self._read_errors.get(name, 0)
        for name, probe in self._running.items():
            h = probe.health()
            h.error_count += self._read_errors.get(name, 0)
            h.reason = h.reason or self._target_errors.get(name)
            out[name] = h
        for key, entry in self._sources.items():
            target = self._targets[key].name
            for name, h in entry.broken.items():
                out[f"{name}:{target}"] = h.copy()
            for name, source in entry.sources.items():
                out[f"{name}:{target}"] = source.health()
        per_family: dict[str, list[tuple[int, Health]]] = {}
        for (key, member), entry in self._member_sources.items():
            target = self._targets[key].name
            for name, h in entry.broken.items():
                per_family.setdefault(f"{name}:{target}", []).append((member[0], h.copy()))
            for name, source in entry.sources.items():
                per_family.setdefault(f"{name}:{target}", []).append((member[0], source.health()))
        # One health per source and family (`stacks:vllm`), as for a single process: a pid in the name would make
        # a series per member on /metrics, without bound as members come and go.
        out.update({where: _family_health(parts) for where, parts in per_family.items()})
        return out

    def stop(self) -> None:
        for key in list(self._targets):
            self._remove(key)
        for name, probe in self._running.items():
            _stop_quietly(name, probe)
        self._running.clear()

    # -- internals ------------------------------------------------------------------------------

    def _pids(self) -> list[int]:
        """The pids probes may attach to: targets' (and family members') processes that are held and alive now.
        A pid whose process exited may already name another user's process, which must not be traced."""
        return sorted({key[0] for t in self._targets.values() for key in t.member_keys
                       if (h := self._handles.get(key)) is not None and h.alive()})

    def _follow(self, probe: Probe, attached: list[int]) -> None:
        """Probes that can follow forks in the kernel follow every family member: a child a member forks is counted
        from its first instruction, even one that lives and ends between two windows."""
        if (set_followed := getattr(probe, "set_followed", None)) is None:
            return
        alive = set(attached)
        set_followed(sorted(m.pid for t in self._targets.values() for m in t.members if m.pid in alive))

    def member_pids(self, key: tuple[int, int]) -> tuple[int, ...]:
        """The current processes of the target with `key` (its members, else its own pid); () once it left."""
        target = self._targets.get(key)
        return tuple(k[0] for k in target.member_keys) if target is not None else ()

    def _drop_exited(self, attached: list[int]) -> None:
        """After probes attached by pid: a target that exited meanwhile may have left its pid to another process
        before the attach, so every probe lets go of it now (alive throughout means the attach was its own)."""
        alive = self._pids()
        if len(alive) == len(attached):
            return
        for name, probe in list(self._running.items()):
            try:
                probe.set_targets(alive)
            except COLLECTOR_ERRORS as exc:
                log.warning("probe %s could not drop an exited target: %s", name, exc)
                self._read_errors[name] = self._read_errors.get(name, 0) + 1

    def _add(self, target: Target) -> None:
        entry = self._build(self._make_sources(target), target.name)
        self._targets[target.key] = target
        self._sources[target.key] = entry
        for key in target.member_keys:
            self._hold(key)
        for member in target.members:
            self._add_member(target, member)

    def _build(self, factories: SourceFactories, label: str) -> _TargetSources:
        entry = _TargetSources()
        for name, factory in factories.items():
            try:
                entry.sources[name] = factory()
            except COLLECTOR_ERRORS as exc:
                log.warning("source %s for %s unavailable: %s", name, label, exc)
                entry.broken[name] = Health(name=name, state="failed", reason=str(exc), error_count=1)
            except Exception as exc:  # one source's surprise must not stop the others: logged, counted, shown
                log.error("source %s for %s: starting raised unexpectedly", name, label, exc_info=exc)
                entry.broken[name] = Health(name=name, state="failed", reason=_unexpected_reason("starting", exc),
                                            error_count=1)
        return entry

    def _add_member(self, target: Target, member: Member) -> None:
        label = f"{target.name} pid {member.pid}"
        self._member_sources[(target.key, member.key)] = self._build(self._make_member_sources(target, member), label)

    def _update_members(self, old: Target, new: Target) -> bool:
        """Hold and build sources for members that joined, release those that left; whether any did."""
        before, after = set(old.member_keys), set(new.member_keys)
        if before == after:
            return False
        for key in before - after:
            self._release(key)
            _close_all(self._member_sources.pop((old.key, key), None))
        for key in after - before:
            self._hold(key)
        for member in new.members:
            if member.key not in before:
                self._add_member(new, member)
        return True

    def _hold(self, key: MemberKey) -> None:
        try:
            self._handles[key] = ProcessHandle.open(key[0], key[1], self._proc_root)
        except ProbeError as exc:
            self._not_held[key[0]] = str(exc)

    def _release(self, key: MemberKey) -> None:
        if (handle := self._handles.pop(key, None)) is not None:
            handle.close()
        self._not_held.pop(key[0], None)

    def _remove(self, key: tuple[int, int]) -> None:
        target = self._targets.pop(key)
        for member_key in target.member_keys:
            self._release(member_key)
            _close_all(self._member_sources.pop((key, member_key), None))
        _close_all(self._sources.pop(key))

    def _start_probe(self, name: str, pids: list[int]) -> None:
        probe = None
        try:
            probe = self._factories[name]()
            probe.start(pids)
            self._follow(probe, pids)
        except Unsupported as exc:
            if probe is not None and probe.health().state == "running":
                log.info("probe %s cannot trace some targets: %s", name, exc)
                self._running[name] = probe
                try:
                    self._follow(probe, pids)  # the targets it could take are followed all the same
                except COLLECTOR_ERRORS as follow_exc:
                    log.warning("probe %s could not follow its targets: %s", name, follow_exc)
                    self._count_error(name)
                return
            log.info("probe %s supports none of the targets: %s", name, exc)
            self._failed[name] = Health(name=name, state="unsupported", reason=str(exc),
                                        unsupported={pid: str(exc) for pid in pids})
            self._retry.add(name)
        except (*COLLECTOR_ERRORS, ImportError) as exc:
            log.warning("probe %s unavailable: %s", name, exc)
            self._failed[name] = Health(name=name, state="failed", reason=str(exc))
            if probe is not None:
                _stop_quietly(name, probe)
        except Exception as exc:  # one probe's surprise must not stop the others: logged, counted, shown
            why = self._unexpected(name, "starting", exc)
            if probe is not None and probe.health().state == "running":
                # It traces the targets it could take; the one that raised is in its health.
                self._running[name] = probe
                self._target_errors[name] = why
                return
            self._failed[name] = Health(name=name, state="failed", reason=why)
            if probe is not None:
                _stop_quietly(name, probe)
            # The target that raised may go; the probe is tried again when the targets change.
            self._retry.add(name)
        else:
            self._running[name] = probe

    def _count_error(self, name: str) -> None:
        self._read_errors[name] = self._read_errors.get(name, 0) + 1

    def _unexpected(self, name: str, doing: str, exc: Exception) -> str:
        """An exception no domain error covers: logged with its traceback, counted in the probe's health."""
        log.error("probe %s: %s raised unexpectedly", name, doing, exc_info=exc)
        self._count_error(name)
        return _unexpected_reason(doing, exc)

    def _read_probes(self) -> tuple[dict[str, dict[int, Any]], dict[str, str]]:
        readings: dict[str, dict[int, Any]] = {}
        errors: dict[str, str] = {}
        self.host = {}
        # Probes whose read cuts time at the moment it starts go first, so their boundary is the window's.
        order = sorted(self._running.items(), key=lambda item: item[0] not in BOUNDARY_FIRST)
        for name, probe in order:
            try:
                readings[name] = probe.read()
            except COLLECTOR_ERRORS as exc:
                self._count_error(name)
                errors[name] = f"failed: {exc}"
                continue
            except Exception as exc:  # one probe's surprise must not stop the others: logged, counted, shown
                errors[name] = f"failed: {self._unexpected(name, 'reading', exc)}"
                continue
            if (host := probe.host()) is not None:
                self.host[name] = host
            self._probe_unsupported[name] = probe.health().unsupported
        self._probe_unsupported = {n: u for n, u in self._probe_unsupported.items() if n in readings}
        self._last_readings = readings
        self._children = {}
        for probe in self._running.values():
            if (children := getattr(probe, "children", None)) is not None:
                self._children.update(children())
        for name, health in self._failed.items():
            if health.state != "unsupported":  # per-target reasons are in health.unsupported
                errors[name] = f"{health.state}: {health.reason}"
        return readings, errors

    def _probe_share(self, pid: int, readings: dict[str, dict[int, Any]], errors: dict[str, str],
                     out: Collected) -> None:
        unsupported = {name: h.unsupported[pid] for name, h in self._failed.items() if pid in h.unsupported}
        for name in readings:
            if why := self._probe_unsupported.get(name, {}).get(pid):
                unsupported[name] = why
        for name in sorted({*readings, *unsupported}):
            per_pid = readings.get(name, {})
            # A probe's reading covers exactly the targets it measures (zero events there is a real zero);
            # a target it left out has no reading, with the reason, never an invented empty one.
            if pid in per_pid and name not in unsupported:
                out.readings[name] = per_pid[pid]
            else:
                why = unsupported.get(name) or self._missing_reason(name, pid)
                out.missing[name] = f"unsupported: {why}"
        out.missing.update(errors)

    def _missing_reason(self, name: str, pid: int) -> str:
        if why := self._not_held.get(pid):
            return f"{name} did not attach to pid {pid}: {why}"
        held = next((h for key, h in self._handles.items() if key[0] == pid), None)
        if (not held.alive()) if held is not None else not (self._proc_root / str(pid)).exists():
            return f"pid {pid} exited before {name} was read; its last counts are lost"
        why = self._target_errors.get(name)
        return f"{name} does not measure pid {pid}" + (f" ({why})" if why else "")

    @staticmethod
    def _read_sources(entry: _TargetSources, out: Collected) -> None:
        for name, source in entry.sources.items():
            try:
                out.readings[name] = source.read()
            except COLLECTOR_ERRORS as exc:
                out.missing[name] = str(exc)
                if isinstance(exc, NoAnswer):
                    out.unanswered.add(name)
                    if exc.stage in ("connect", "closed"):
                        out.unreachable.add(name)
                    if exc.stage == "closed":
                        out.closed.add(name)
        for name, health in entry.broken.items():
            out.missing[name] = f"failed: {health.reason}"


def _family_health(parts: list[tuple[int, Health]]) -> Health:
    """The health of one source over a family's members. Running while it runs for any member, the others' reasons
    in `unsupported` by pid (the vocabulary's per-target gaps: py-spy on a member that is no Python process);
    otherwise the worst state, with the first such member's reason. Counts summed; members per state in `detail`."""
    rank = ("failed", "unsupported", "running", "absent", "stopped")
    running = [pid for pid, h in parts if h.state == "running"]
    worst_pid, worst = min(parts, key=lambda p: (rank.index(p[1].state), p[0]))
    out = Health(name=worst.name, state="running" if running else worst.state,
                 reason=None if running or not worst.reason else f"pid {worst_pid}: {worst.reason}",
                 targets=sum(h.targets for _, h in parts), lost_events=sum(h.lost_events for _, h in parts),
                 failed_stacks=sum(h.failed_stacks for _, h in parts), error_count=sum(h.error_count for _, h in parts))
    for pid, h in parts:
        out.unsupported.update(h.unsupported)
        if h.state != "running" and h.reason:
            out.unsupported.setdefault(pid, f"{h.state}: {h.reason}")
    out.detail["members"] = {state: sum(h.state == state for _, h in parts) for state in rank
                             if any(h.state == state for _, h in parts)}
    return out


def _close_all(entry: _TargetSources | None) -> None:
    for name, source in (entry.sources.items() if entry is not None else ()):
        try:
            source.close()
        except COLLECTOR_ERRORS as exc:
            log.warning("source %s did not close cleanly: %s", name, exc)


def _unexpected_reason(doing: str, exc: Exception) -> str:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{doing} failed unexpectedly: {name}: {exc} (its traceback is in the agent's log)"


def _stop_quietly(name: str, probe: Probe) -> None:
    """Stop a probe; a failure to stop is logged, since the agent is leaving that probe either way."""
    try:
        probe.stop()
    except COLLECTOR_ERRORS as exc:
        log.warning("probe %s did not stop cleanly: %s", name, exc)

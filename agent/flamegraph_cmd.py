"""`infersight flamegraph`: export a live or stored profile, or a differential one, in any format."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from agent.config import Config
from agent.profiles import capture_live
from analysis.flamegraph.export import Exported, export, export_diff
from analysis.flamegraph.stored import from_store


class UsageError(ValueError):
    """A combination of options that cannot work; the message says which."""


class NoSamples(ValueError):
    """The range or process gave nothing to draw; an empty file would look like a result, so it is an error."""


def check_output(output: str | None) -> None:
    """Refuse an -o that cannot be written before anything is captured (a live capture takes minutes)."""
    if output is None or output == "-":
        return
    path = Path(output)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"-o {output!r} is a directory; name a file in it")
    if not parent.is_dir():
        raise UsageError(f"-o {output!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"-o {output!r}: folder {str(parent)!r} is not writable")


def _nonempty(profile, kind: str, what: str):
    if profile.total() == 0:
        raise NoSamples(f"no {kind} samples {what}; nothing written")
    return profile


def _store(config: Config, store_dir: Path | None):
    from agent.store import DB_NAME, Store

    path = store_dir or Path(config.store_dir)
    if not (path / DB_NAME).exists():
        raise UsageError(f"no store at {str(path)!r} (no {DB_NAME}); pass --store DIR or --config FILE")
    return Store.open(path)


def _resolve_target_name(store, pid: int, since: float | None, until: float | None) -> str:
    names = {w.target for w in store.windows(since=since, until=until) if w.pid == pid}
    if len(names) != 1:
        found = "no target" if not names else f"several targets ({', '.join(sorted(names))})"
        raise UsageError(f"pid {pid} matches {found} in the store for that range; use --target NAME")
    return names.pop()


def _live_pid(config: Config, target: str) -> int:
    from agent.targets import discover

    specs = [s for s in config.targets if s.name == target.split("#")[0]]
    if not specs:
        raise UsageError(f"no target named {target!r} in the config (known: {', '.join(s.name for s in config.targets)})")
    problems: dict[str, str] = {}
    found = [t for t in discover(specs, problems=problems) if t.name == target or len(specs) == 1]
    if len(found) != 1:
        why = problems.get(specs[0].name) or f"{len(found)} processes match; name one as NAME#PID or use --pid"
        raise UsageError(f"target {target!r}: {why}")
    return found[0].pid


def build(args, config: Config) -> Exported:
    stored = args.since is not None or args.until is not None
    if args.duration is not None and stored:
        raise UsageError("use either --duration (live) or --from/--to (stored), not both")
    if not stored and args.duration is None:
        raise UsageError("say what to profile: --duration S (live) or --from/--to (stored)")
    baseline = args.baseline_from is not None or args.baseline_to is not None
    if baseline and not stored:
        raise UsageError("a diff compares two stored ranges: --baseline-from/--baseline-to with --from/--to")
    title = f"{args.target or f'pid {args.pid}'} — {args.kind}"

    if not stored:
        pid = args.pid if args.pid is not None else _live_pid(config, args.target)
        profile = _nonempty(capture_live(pid, args.duration, kind=args.kind, rate_hz=config.stacks.burst_rate_hz),
                            args.kind, f"from pid {pid} in {args.duration:g} s (is it a Python process?)")
        return export(profile, args.format, kind=args.kind, title=title, rate_hz=config.stacks.burst_rate_hz)

    store = _store(config, args.store)
    try:
        target = args.target or _resolve_target_name(store, args.pid, args.since, args.until)
        stored_names = ", ".join(t.name for t in store.targets()) or "none"
        current = _nonempty(from_store(store, target, args.since, args.until, args.kind), args.kind,
                            f"for target {target!r} in that range (stored targets: {stored_names})")
        if not baseline:
            return export(current, args.format, kind=args.kind, title=title, rate_hz=config.stacks.rate_hz)
        # Against an empty baseline every function would read as a mover.
        base = _nonempty(from_store(store, target, args.baseline_from, args.baseline_to, args.kind), args.kind,
                         f"for target {target!r} in the baseline range")
        fmt = args.format if args.format in ("svg", "folded") else "json"
        if args.format not in ("svg", "folded", "json"):
            raise UsageError(f"a diff exports as svg, folded or json, not {args.format!r}")
        return export_diff(base, current, fmt, title=f"{title}: baseline vs current")
    finally:
        store.close()


def write(exported: Exported, output: str | None) -> str:
    if output is None or output == "-":
        if exported.mime == "application/octet-stream" and sys.stdout.isatty():
            raise UsageError("pprof is binary: write it to a file with -o FILE.pb.gz")
        sys.stdout.buffer.write(exported.data)
        sys.stdout.flush()
        return "stdout"
    path = Path(output)
    # Write beside the destination and rename, so a reader never sees half a file.
    check_output(output)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(exported.data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)  # never leave a root-owned temporary file behind
        raise
    return str(path)

"""`python -m probes NAME`: run one probe by hand, print its rendered C or one JSON line per window."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProbeEntry:
    module: str
    probe_class: str
    config_class: str
    # Host-wide figures a probe keeps beside its per-target readings (tcp: every flow on the host).
    host: Callable[[Any], dict[str, Any]] | None = None


def _tcp_host(probe: Any) -> dict[str, Any]:
    host = probe.host()
    return {"host": dataclasses.asdict(host) if host is not None else None, "not_sent": probe.last_not_sent,
            "send_failed": probe.last_send_failed, "errors": probe.last_errors}


PROBES: dict[str, ProbeEntry] = {
    "syscalls": ProbeEntry("probes.syscalls", "SyscallsProbe", "SyscallsConfig"),
    "offcpu": ProbeEntry("probes.offcpu", "OffCpuProbe", "OffCpuConfig"),
    "gc": ProbeEntry("probes.gcpause", "GcPauseProbe", "GcPauseConfig"),
    "runqueue": ProbeEntry("probes.runqlat", "RunqlatProbe", "RunqlatConfig"),
    "tcp": ProbeEntry("probes.tcpretrans", "TcpRetransProbe", "TcpRetransConfig", host=_tcp_host),
    "delivery": ProbeEntry("probes.delivery", "DeliveryProbe", "DeliveryConfig"),
}

_PARSERS: dict[str, Callable[[str], Any]] = {
    "bool": lambda text: {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}[text.lower()],
    "int": int,
    "float": float,
    "str": str,
}


def build_config(config_class: type, settings: list[str]) -> Any:
    """The config dataclass with KEY=VALUE overrides, each parsed by its field's declared type."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    values: dict[str, Any] = {}
    for setting in settings:
        key, sep, raw = setting.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--set wants KEY=VALUE with KEY one of {', '.join(fields)}; got {setting!r}")
        kind = str(fields[key].type)
        if kind not in _PARSERS:
            raise ValueError(f"--set cannot set {key!r} (of type {kind}) from the command line")
        try:
            values[key] = _PARSERS[kind](raw)
        except (ValueError, KeyError):
            raise ValueError(f"--set {key} expects a {kind}, got {raw!r}") from None
    return config_class(**values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probes", description=__doc__)
    parser.add_argument("name", choices=sorted(PROBES))
    parser.add_argument("--pid", type=int, action="append", default=[], help="target tgid (repeatable)")
    parser.add_argument("--interval", type=float, default=1.0, help="window length in seconds")
    parser.add_argument("--count", type=int, default=0, help="windows to print; 0 = until interrupted")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config field, e.g. latency=true (syscalls), user_stacks=true (offcpu)")
    parser.add_argument("--print-c", action="store_true", help="print the rendered BPF C text and exit")
    args = parser.parse_args(argv)

    entry = PROBES[args.name]
    module = importlib.import_module(entry.module)
    try:
        config = build_config(getattr(module, entry.config_class), args.set)
    except ValueError as exc:
        parser.error(str(exc))
    if args.print_c:
        print(module.render(config))
        return 0

    from analysis.errors import ProbeError

    probe = getattr(module, entry.probe_class)(config)
    try:
        probe.start(args.pid)
    except ProbeError as exc:
        print(f"python -m probes {args.name}: {exc}", file=sys.stderr)
        return 1
    try:
        n = 0
        while not args.count or n < args.count:
            time.sleep(args.interval)
            line = {"readings": {str(pid): dataclasses.asdict(r) for pid, r in probe.read().items()}}
            if entry.host is not None:
                line.update(entry.host(probe))
            print(json.dumps(line), flush=True)
            n += 1
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a user ends an open-ended run
    finally:
        print(json.dumps({"health": probe.health().to_dict()}), flush=True)
        probe.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The `infersight` command line: one subcommand per user task; bad arguments give one line and exit 2."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path
from typing import NoReturn

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage dump) so it reads well in logs and scripts."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _ranged(kind, lo: float, hi: float):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be within [{lo:g}, {hi:g}], got {text!r}")
        return value

    return parse


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"infersight: {message}", file=sys.stderr)
    return code


def _require_root(command: str) -> int | None:
    if os.geteuid() != 0:
        return _fail(f"{command} must run as root: BPF programs and ptrace (py-spy) need it; try 'sudo infersight "
                     f"{command}'", 1)
    return None


def _load_config(path: str | None):
    from agent.config import ConfigError, load_config

    try:
        return load_config(Path(path) if path else None), None
    except ConfigError as exc:
        return None, _fail(f"config error: {exc}")


def _cmd_doctor(args: argparse.Namespace) -> int:
    from agent import doctor

    return doctor.main(as_json=args.json)


def _cmd_run(args: argparse.Namespace) -> int:
    config, code = _load_config(args.config)
    if config is None:
        return code
    if (code := _require_root("run")) is not None:
        return code
    from agent import daemon
    from agent.config import ConfigError
    from agent.pidlock import AlreadyRunning
    from agent.store import StoreError

    try:
        return daemon.run(config)
    except ConfigError as exc:  # store directory trust is checked when the agent opens it
        return _fail(f"config error: {exc}")
    except (AlreadyRunning, StoreError) as exc:
        return _fail(f"cannot start: {exc}", 1)
    except OSError as exc:
        return _fail(f"cannot start: {exc}", 1)


def _cmd_status(args: argparse.Namespace) -> int:
    config, code = _load_config(args.config)
    if config is None:
        return code
    from agent import status

    return status.main(args.url or f"http://{config.listen}", as_json=args.json)


def _cmd_collect(args: argparse.Namespace) -> int:
    from agent.single_target import SelectorError, selector_spec

    try:
        spec = selector_spec(args)
    except SelectorError as exc:
        return _fail(str(exc))
    assert spec is not None  # the group is required
    if (code := _require_root("collect")) is not None:
        return code
    from agent import collect

    return collect.main(spec=spec, duration=args.duration, interval=args.interval, as_json=args.json,
                        probes=args.probes, stacks=not args.no_pyspy, stacks_rate_hz=args.pyspy_rate)


def _cmd_flamegraph(args: argparse.Namespace) -> int:
    config, code = _load_config(args.config)
    if config is None:
        return code
    from agent import flamegraph_cmd
    from analysis.errors import ProbeError

    if args.duration is not None and (code := _require_root("flamegraph --duration")) is not None:
        return code
    try:
        flamegraph_cmd.check_output(args.output)
        where = flamegraph_cmd.write(flamegraph_cmd.build(args, config), args.output)
    except flamegraph_cmd.NoSamples as exc:
        return _fail(str(exc), 1)
    except (flamegraph_cmd.UsageError, ValueError) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot write {args.output!r}: {exc.strerror or exc}", 1)
    except ProbeError as exc:
        return _fail(f"cannot capture: {exc}", 1)
    if where != "stdout":
        print(f"infersight: wrote {where}", file=sys.stderr)
    return 0


def _cmd_regressions(args: argparse.Namespace) -> int:
    config, code = _load_config(args.config)
    if config is None:
        return code
    from agent import regressions_cmd

    try:
        return regressions_cmd.list_regressions(config, args.store, args.target, args.json, args.limit)
    except regressions_cmd.UsageError as exc:
        return _fail(str(exc))


def _cmd_changes(args: argparse.Namespace) -> int:
    config, code = _load_config(args.config)
    if config is None:
        return code
    from agent import changes_cmd, regressions_cmd

    try:
        if args.report is not None:
            return changes_cmd.report(config, args.store, args.report, args.html, args.json)
        if args.html is not None:
            return _fail("--html writes a report: give --report CHANGE_ID too")
        return changes_cmd.list_changes(config, args.store, args.target, args.json, args.limit)
    except regressions_cmd.UsageError as exc:
        return _fail(str(exc))


def _cmd_baseline_reset(args: argparse.Namespace) -> int:
    config, code = _load_config(args.config)
    if config is None:
        return code
    from agent import regressions_cmd

    try:
        return regressions_cmd.reset_baseline(config, args.store, args.target)
    except regressions_cmd.UsageError as exc:
        return _fail(str(exc))


def _cmd_baseline_accept(args: argparse.Namespace) -> int:
    config, code = _load_config(args.config)
    if config is None:
        return code
    from agent import changes_cmd, regressions_cmd

    try:
        return changes_cmd.accept(config, args.store, args.target)
    except regressions_cmd.UsageError as exc:
        return _fail(str(exc))


def _cmd_alerts(args: argparse.Namespace) -> int:
    config, code = _load_config(args.config)
    if config is None:
        return code
    from agent.alerts import cli as alerts_cli

    return alerts_cli.list_alerts(config, as_json=args.json, store_dir=args.store)


def _cmd_alert_test(args: argparse.Namespace) -> int:
    config, code = _load_config(args.config)
    if config is None:
        return code
    from agent.alerts import cli as alerts_cli

    return alerts_cli.send_test(config, args.receiver, store_dir=args.store)


def _cmd_eval(args: argparse.Namespace) -> int:
    if args.scenarios and (code := _require_root("eval")) is not None:
        return code
    from agent.evaluation import command

    return command.main(scenarios=args.scenarios, replay_files=args.replay or [], record=args.record,
                        as_json=args.json, plot=args.plot, interval=args.interval, record_only=args.record_only,
                        nice=args.nice, bursts=args.bursts)


def _time_arg(text: str) -> float:
    from agent.timespec import parse_time

    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from agent.collectors import PROBE_FACTORIES
    from agent.single_target import add_selector_arguments

    parser = Parser(prog="infersight", description="eBPF + py-spy observability for inference hosts")
    parser.add_argument("--version", action="version", version=f"infersight {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    doctor = sub.add_parser("doctor", help="check this host's requirements, one line each")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(func=_cmd_doctor)

    run = sub.add_parser("run", help="run the agent (root)")
    run.add_argument("--config", metavar="FILE", help="TOML config (default: built-in defaults)")
    run.set_defaults(func=_cmd_run)

    status = sub.add_parser("status", help="ask the running agent how it is doing")
    status.add_argument("--config", metavar="FILE", help="the agent's config, to find its address")
    status.add_argument("--url", help="the agent's address (default: from the config, http://127.0.0.1:9464)")
    status.add_argument("--json", action="store_true", help="print the agent's JSON status")
    status.set_defaults(func=_cmd_status)

    collect = sub.add_parser("collect", help="print windows for one target (a process or a family) without the "
                                             "daemon (root)")
    add_selector_arguments(collect, collect.add_mutually_exclusive_group(required=True), "process to watch")
    collect.add_argument("--duration", type=_ranged(float, 0.1, 86400), default=None,
                         help="seconds to run (default: until Ctrl-C)")
    collect.add_argument("--interval", type=_ranged(float, 0.1, 60), default=5.0, help="window length in seconds")
    collect.add_argument("--json", action="store_true", help="one JSON Window per line (docs/window.md)")
    collect.add_argument("--probes", type=_probe_list(sorted(PROBE_FACTORIES)), default=sorted(PROBE_FACTORIES),
                         help=f"comma-separated subset of {','.join(sorted(PROBE_FACTORIES))}")
    collect.add_argument("--no-pyspy", action="store_true",
                         help="skip Python stack sampling: no stacks reading (the config's stacks.enabled = false)")
    collect.add_argument("--pyspy-rate", type=_ranged(int, 1, 1000), default=49,
                         help="py-spy samples per second (the config's stacks.rate_hz; default 49)")
    collect.set_defaults(func=_cmd_collect)

    flame = sub.add_parser("flamegraph", help="export a flame graph (live, stored, or a diff of two ranges)")
    who = flame.add_mutually_exclusive_group(required=True)
    who.add_argument("--target", help="target name (from the config / the store)")
    who.add_argument("--pid", type=_ranged(int, 1, 2**22), help="process id")
    flame.add_argument("--duration", type=_ranged(float, 1, 3600), help="live: sample this many seconds now")
    flame.add_argument("--from", dest="since", type=_time_arg, help="stored range start: now, -10m, unix s, ISO")
    flame.add_argument("--to", dest="until", type=_time_arg, help="stored range end (default: now)")
    flame.add_argument("--baseline-from", type=_time_arg, help="diff: baseline range start")
    flame.add_argument("--baseline-to", type=_time_arg, help="diff: baseline range end")
    flame.add_argument("--kind", choices=["active", "idle", "offcpu"], default="active",
                       help="Python on-CPU (active), Python waiting (idle), or kernel off-CPU stacks")
    flame.add_argument("--format", choices=["folded", "svg", "speedscope", "pprof", "json"], default="svg",
                       help="export format (json: a diff's movers)")
    flame.add_argument("-o", "--output", help="file to write (default: stdout)")
    flame.add_argument("--config", metavar="FILE", help="agent config (store location, targets)")
    flame.add_argument("--store", type=Path, help="store directory (default: the config's store_dir)")
    flame.set_defaults(func=_cmd_flamegraph)

    regressions = sub.add_parser("regressions", help="list latency regressions the detector found")
    regressions.add_argument("--target", help="only this target")
    regressions.add_argument("--json", action="store_true", help="one JSON object per regression")
    regressions.add_argument("--limit", type=_ranged(int, 1, 10000), default=50, help="newest N (default 50)")
    regressions.add_argument("--config", metavar="FILE", help="agent config (store location)")
    regressions.add_argument("--store", type=Path, help="store directory (default: the config's store_dir)")
    regressions.set_defaults(func=_cmd_regressions)

    changes = sub.add_parser("changes", help="list changes to what a target runs (build, command line, allowlisted "
                                              "environment, distributions, model files)")
    changes.add_argument("--target", help="only this target")
    changes.add_argument("--json", action="store_true", help="one JSON object per change, with both identities")
    changes.add_argument("--limit", type=_ranged(int, 1, 10000), default=50, help="newest N (default 50)")
    changes.add_argument("--report", metavar="CHANGE_ID", help="the change's before/after report (docs/changes.md)")
    changes.add_argument("--html", type=Path, metavar="FILE", help="with --report: also write it as an HTML page")
    changes.add_argument("--config", metavar="FILE", help="agent config (store location)")
    changes.add_argument("--store", type=Path, help="store directory (default: the config's store_dir)")
    changes.set_defaults(func=_cmd_changes)

    baseline = sub.add_parser("baseline", help="manage the detector's learned baselines")
    baseline_sub = baseline.add_subparsers(dest="baseline_command", required=True, metavar="ACTION",
                                           parser_class=Parser)
    reset = baseline_sub.add_parser("reset", help="forget a target's baseline; the agent learns a new one")
    reset.add_argument("target", help="target name")
    reset.add_argument("--config", metavar="FILE", help="agent config (store location)")
    reset.add_argument("--store", type=Path, help="store directory (default: the config's store_dir)")
    reset.set_defaults(func=_cmd_baseline_reset)
    accept = baseline_sub.add_parser("accept", help="accept a target's change as its new normal: its open regression "
                                                    "closes and the baseline is learned again from the new build")
    accept.add_argument("target", help="target name")
    accept.add_argument("--config", metavar="FILE", help="agent config (store location)")
    accept.add_argument("--store", type=Path, help="store directory (default: the config's store_dir)")
    accept.set_defaults(func=_cmd_baseline_accept)

    alerts = sub.add_parser("alerts", help="list alerts and their delivery state (from the store)")
    alerts.add_argument("--json", action="store_true", help="print them as JSON")
    alerts.add_argument("--config", metavar="FILE", help="agent config (store location, receivers)")
    alerts.add_argument("--store", type=Path, help="store directory (default: the config's store_dir)")
    alerts.set_defaults(func=_cmd_alerts)

    alert = sub.add_parser("alert", help="alert tools: 'alert test --receiver NAME'")
    alert_sub = alert.add_subparsers(dest="alert_command", required=True, metavar="ACTION", parser_class=Parser)
    test = alert_sub.add_parser("test", help="send a firing then a resolved test alert to one receiver")
    test.add_argument("--receiver", required=True, metavar="NAME", help="a [[receivers]] name from the config")
    test.add_argument("--config", metavar="FILE", help="agent config (receivers, store location)")
    test.add_argument("--store", type=Path, help="store directory (default: the config's store_dir)")
    test.set_defaults(func=_cmd_alert_test)

    from agent.loadtest.command import add_parser as add_loadtest

    add_loadtest(sub)

    ev = sub.add_parser("eval", help="score the detector on labelled fault scenarios (live, root) or recordings")
    ev.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="scenario TOML files to run live")
    ev.add_argument("--replay", nargs="+", metavar="FILE", help="recorded runs (.jsonl.gz) to re-score offline")
    ev.add_argument("--record", metavar="FILE", help="write the labelled windows here ({name}: the scenario's file name)")
    ev.add_argument("--record-only", action="store_true", help="record without running the detector")
    ev.add_argument("--interval", type=_ranged(float, 1, 60), default=None,
                    help="window seconds (default: the scenario's interval_seconds, else 5)")
    ev.add_argument("--nice", type=_ranged(int, -20, 19), default=0,
                    help="run the server and load at this priority (the suite was recorded at -10 on a shared host)")
    ev.add_argument("--json", action="store_true", help="print the scores as one JSON object on the last line")
    ev.add_argument("--plot", metavar="FILE.png", help="draw latency, the expected band, phases and regressions")
    ev.add_argument("--bursts", action="store_true",
                    help="instead of the scores, the stack sampler's bursts each run would start: false ones per hour")
    ev.set_defaults(func=_cmd_eval)

    from agent import bench_cmd

    bench_cmd.add_parser(sub, Parser, _ranged)
    return parser


def _probe_list(known: list[str]):
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in known]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"unknown probe(s) {bad or text!r}; choose from {','.join(known)}")
        return names

    return parse


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("infersight")
    except PackageNotFoundError:
        return "unknown (not installed: run 'make setup')"


# Options whose value may be a relative time such as -10m, which argparse would take for an option.
_TIME_OPTIONS = frozenset({"--from", "--to", "--baseline-from", "--baseline-to"})
_RELATIVE = re.compile(r"-\d")


def _join_negative_times(argv: list[str]) -> list[str]:
    """`--from -10m` -> `--from=-10m`, so both spellings work."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in _TIME_OPTIONS and i + 1 < len(argv) and _RELATIVE.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    argv = _join_negative_times(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    # SIGTERM stops every command the way Ctrl-C does: `finally` blocks unload probes and stop py-spy.
    # `run` and `collect` install their own handlers, which stop their loops at the next tick.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `infersight collect --json | head` closed the pipe: not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())


"""`infersight loadtest [compare]`: arguments, bad input as one line, and the run / compare / sweep drivers."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from agent.loadtest.schedule import parse_range, parse_schedule, parse_sweep
from agent.single_target import SELECTOR_OPTIONS

DEFAULT_SCHEDULE = "2:15,4:15,6:15,8:15,12:15"
EXIT_USAGE, EXIT_FAIL = 2, 1


class UsageError(ValueError):
    """Bad input: printed as one line, exit 2."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from agent.collectors import PROBE_FACTORIES

    p = sub.add_parser("loadtest", help="stepped load until the SLO breaks; the knee and its bottleneck")
    p.add_argument("--url", help="the server's base URL (OpenAI completions API), e.g. http://127.0.0.1:8000")
    from agent.single_target import add_selector_arguments

    who = p.add_mutually_exclusive_group()
    add_selector_arguments(p, who, "the server's process id (watched with the agent's probes)")
    who.add_argument("--target", help="a target name from the agent's config")
    p.add_argument("--config", metavar="FILE", help="agent config, for --target")
    p.add_argument("--schedule", default=DEFAULT_SCHEDULE, help=f"RATE:SECONDS,... (default {DEFAULT_SCHEDULE})")
    p.add_argument("--slo-p95", type=float, default=1.0, help="SLO: client p95 latency in seconds (default 1.0)")
    p.add_argument("--max-error-rate", type=float, default=0.01, help="SLO: error share allowed (default 0.01)")
    p.add_argument("--prompt-bytes", default="64-256", help="N or MIN-MAX, uniform (default 64-256)")
    p.add_argument("--max-tokens", default="16-48", help="N or MIN-MAX, uniform (default 16-48)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds one request may take (default 30)")
    p.add_argument("--model", help="model name sent with each request (vLLM needs it)")
    p.add_argument("--metrics-url", help="the server's Prometheus endpoint (default URL/metrics)")
    p.add_argument("--probes", default=",".join(sorted(PROBE_FACTORIES)),
                   help=f"BPF probes to load, comma-separated (default all: {','.join(sorted(PROBE_FACTORIES))})")
    p.add_argument("--no-probes", action="store_true", help="no BPF probes (no root needed with --no-pyspy)")
    p.add_argument("--no-pyspy", action="store_true", help="no Python stacks (and no flame graphs)")
    p.add_argument("--pyspy-rate", type=int, default=49, help="py-spy samples per second (default 49)")
    p.add_argument("--seed", type=int, default=0, help="arrival and prompt seed (same seed, same requests)")
    p.add_argument("--repeats", type=int, default=1, help="extra runs of the last good step, for noise (default 1)")
    p.add_argument("--all-steps", action="store_true", help="keep stepping after the first step that fails")
    p.add_argument("--label", default="", help="what this run is (shown by compare and in the report)")
    p.add_argument("--server-max-batch", type=int, metavar="N",
                   help="the server's batch limit (vLLM --max-num-seqs, the bundled server's --max-batch), so a "
                        "full batch can be named as the bottleneck; a max-batch sweep sets it per value")
    p.add_argument("--sweep", help="bundled server only: max-batch=1,2,4,8 or http-threads=... (restarts it per value)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the swept server, repeatable (e.g. --server-arg=--no-cache)")
    p.add_argument("-o", "--output", type=Path, help="write the JSON report here")
    p.add_argument("--html", type=Path, help="write the offline HTML report here")
    p.set_defaults(func=main)
    nested = p.add_subparsers(dest="loadtest_command", metavar="[compare]", parser_class=type(p))
    c = nested.add_parser("compare", help="before/after table of two reports, with run-to-run noise")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.set_defaults(func=compare_main)


def _fail(message: str, code: int) -> int:
    print(f"infersight loadtest: {message}", file=sys.stderr)
    return code


def compare_main(args: argparse.Namespace) -> int:
    from agent.loadtest.report import ReportError, load
    from analysis.capacity_compare import compare, format_table

    try:
        before, after = load(args.before), load(args.after)
    except ReportError as exc:
        return _fail(str(exc), EXIT_USAGE)
    result = compare(before.run(before.label or args.before.stem), after.run(after.label or args.after.stem))
    print(json.dumps(result.to_dict(), indent=1) if args.json else format_table(result))
    return 0


def command_line(args: argparse.Namespace) -> str:
    """The run as one `infersight loadtest` line with every option that shaped it, stored in the report so a
    recorded JSON says how to record it again."""
    parts = ["infersight", "loadtest"]
    if args.sweep:
        parts += ["--sweep", args.sweep, *(f"--server-arg={a}" for a in args.server_arg)]
    else:
        parts += ["--url", args.url or ""]
        if args.target:
            parts += ["--target", args.target, *(["--config", str(args.config)] if args.config else [])]
        else:
            for option in SELECTOR_OPTIONS:
                if getattr(args, option, None) is not None:
                    parts += [f"--{option}", str(getattr(args, option))]
            parts += ["--children"] if getattr(args, "children", False) else []
    parts += ["--schedule", args.schedule, "--slo-p95", f"{args.slo_p95:g}", "--max-error-rate",
              f"{args.max_error_rate:g}", "--prompt-bytes", args.prompt_bytes, "--max-tokens", args.max_tokens,
              "--timeout", f"{args.timeout:g}"]
    parts += ["--model", args.model] if args.model else []
    parts += ["--metrics-url", args.metrics_url] if args.metrics_url else []
    parts += ["--no-probes"] if args.no_probes else ["--probes", args.probes]
    parts += ["--no-pyspy"] if args.no_pyspy else ["--pyspy-rate", str(args.pyspy_rate)]
    parts += ["--seed", str(args.seed), "--repeats", str(args.repeats)]
    parts += ["--all-steps"] if args.all_steps else []
    parts += ["--label", args.label] if args.label else []
    parts += ["--server-max-batch", str(args.server_max_batch)] if args.server_max_batch is not None else []
    parts += ["-o", str(args.output)] if args.output else []
    parts += ["--html", str(args.html)] if args.html else []
    return shlex.join(parts)


def _options(args: argparse.Namespace, url: str, pid: int | None, settings: dict, spec=None,
             members: tuple[int, ...] = ()):
    from agent.loadtest.client import Endpoint, Shape
    from agent.loadtest.runner import Options
    from analysis.capacity import Slo

    try:
        schedule = parse_schedule(args.schedule)
        slo = Slo(args.slo_p95, args.max_error_rate)
        shape = Shape(prompt_bytes=parse_range(args.prompt_bytes, "--prompt-bytes"),
                      max_tokens=parse_range(args.max_tokens, "--max-tokens"), timeout_s=args.timeout,
                      model=args.model)
        Endpoint(url)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 1 <= args.timeout <= 600:
        raise UsageError(f"--timeout must be within [1, 600] seconds, got {args.timeout!r}")
    if not 0 <= args.repeats <= 10:
        raise UsageError(f"--repeats must be within [0, 10], got {args.repeats!r}")
    if not 1 <= args.pyspy_rate <= 1000:
        raise UsageError(f"--pyspy-rate must be within [1, 1000], got {args.pyspy_rate!r}")
    if args.server_max_batch is not None and not 1 <= args.server_max_batch <= 65536:
        raise UsageError(f"--server-max-batch must be within [1, 65536], got {args.server_max_batch!r}")
    probes = [] if args.no_probes else _probe_names(args.probes)
    settings = {**settings, "prompt_bytes": shape.prompt_bytes, "max_tokens": shape.max_tokens, "probes": probes,
                "pyspy": not args.no_pyspy, "seed": args.seed, "command": command_line(args)}
    return Options(url=url, pid=pid, schedule=schedule, schedule_text=args.schedule, slo=slo, shape=shape,
                   metrics_url=args.metrics_url, probes=probes, pyspy=not args.no_pyspy and pid is not None,
                   pyspy_rate=args.pyspy_rate, seed=args.seed, repeats=args.repeats, all_steps=args.all_steps,
                   label=args.label, settings=settings, max_batch=args.server_max_batch, spec=spec,
                   members=members)


def _probe_names(text: str) -> list[str]:
    from agent.collectors import PROBE_FACTORIES

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in PROBE_FACTORIES]
    if bad:
        raise UsageError(f"unknown probe(s) {', '.join(bad)}; choose from {','.join(sorted(PROBE_FACTORIES))}")
    return names


def _resolve_target(args: argparse.Namespace):
    """(leader pid, TargetSpec, member pids) of the server the options select: a plain --pid is watched as
    it is; a family (--pid --children, --unit, --cgroup, --container, --port, a config target) is looked up
    now, so a selector that finds nothing is one line before any load is sent."""
    from agent.config import ConfigError, load_config
    from agent.single_target import SelectorError, selector_spec
    from agent.targets import discover

    if args.target is None:
        try:
            spec = selector_spec(args)
        except SelectorError as exc:
            raise UsageError(str(exc)) from None
        if spec is None or spec.selector == "pid" and not spec.family:
            return args.pid, spec, ()
    else:
        try:
            config = load_config(Path(args.config) if args.config else None)
        except ConfigError as exc:
            raise UsageError(f"config error: {exc}") from None
        spec = next((t for t in config.targets if t.name == args.target), None)
        if spec is None:
            raise UsageError(f"no target {args.target!r} in the config (known: "
                             f"{', '.join(t.name for t in config.targets) or 'none'})")
    problems: dict[str, str] = {}
    found = discover([spec], problems=problems)
    what = f"target {args.target!r}" if args.target else "the server"
    if not found:
        raise UsageError(f"{what} is not running: {problems.get(spec.name, 'no process')}")
    if len(found) > 1:
        raise UsageError(f"{what} matches {len(found)} processes "
                         f"({', '.join(str(t.pid) for t in found[:8])}); choose one with --pid")
    return found[0].pid, spec, tuple(pid for pid, _ in found[0].member_keys)


def _needs_root(options) -> str | None:
    if os.geteuid() != 0 and options.pid is not None and (options.probes or options.pyspy):
        return ("watching the server needs root (BPF probes and py-spy); run with sudo, or add --no-probes "
                "--no-pyspy for the client's and the server's metrics only")
    return None


def _write(report_dict: dict, html: str, args: argparse.Namespace) -> None:
    if args.output:
        args.output.write_text(json.dumps(report_dict, indent=1, sort_keys=True) + "\n")
        print(f"infersight loadtest: wrote {args.output}", file=sys.stderr)
    if args.html:
        args.html.write_text(html)
        print(f"infersight loadtest: wrote {args.html}", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    if args.slo_p95 is not None and args.slo_p95 <= 0:
        return _fail(f"--slo-p95 must be > 0 seconds, got {args.slo_p95!r}", EXIT_USAGE)
    try:
        if args.sweep:
            return _sweep(args)
        if not args.url:
            raise UsageError("--url is required (the server's base URL), or --sweep for the bundled server")
        pid, spec, members = _resolve_target(args)
        options = _options(args, args.url, pid, {}, spec=spec, members=members)
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    if (why := _needs_root(options)) is not None:
        return _fail(why, EXIT_FAIL)
    from agent.loadtest import html
    from agent.loadtest.runner import Runner, TargetError

    try:
        report = Runner(options, sys.stderr).run()
    except TargetError as exc:
        return _fail(str(exc), EXIT_FAIL)
    _write(report.to_dict(), html.render(report), args)
    print(summary(report))
    return 0


def _at_server(report, offered_rps: float) -> str:
    total = report.at_server(offered_rps)
    return "" if total is None else f" (+ background = {total:.2f} req/s at the server)"


def summary(report) -> str:
    knee = report.knee()
    good, bad = report.step(knee.last_good), report.step(knee.first_bad)
    lines = [report.background.text()] if report.background is not None else []
    if knee.found and good and bad:
        lines.append(f"knee: {good.offered_rps:g} req/s offered{_at_server(report, good.offered_rps)} "
                     f"({good.achieved_rps:.2f} req/s, {good.tokens_per_s:.0f} tokens/s, p95 "
                     f"{good.client_p95_s * 1000:.0f} ms); {bad.offered_rps:g} req/s"
                     f"{_at_server(report, bad.offered_rps)} breaks the SLO: {knee.reason}")
    else:
        lines.append(f"no knee: {knee.reason}")
    lines.append(f"bottleneck: {report.bottleneck().summary}")
    noise = {k: v for k, v in report.noise().items() if v is not None}
    if noise:
        lines.append("noise (repeated step): " + ", ".join(f"{k} {v:.1%}" for k, v in noise.items()))
    return "\n".join(lines)


def _sweep(args: argparse.Namespace) -> int:
    from agent.loadtest import sweep_html
    from agent.loadtest.runner import Runner, TargetError
    from agent.loadtest.sweep import ServerStartError, SweepResult, point, start_server

    if args.url or args.target or any(getattr(args, o, None) is not None for o in SELECTOR_OPTIONS):
        raise UsageError("--sweep starts the bundled server itself; drop --url/--pid/--unit/--cgroup/--container/"
                         "--port/--target")
    try:
        spec = parse_sweep(args.sweep)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _options(args, "http://127.0.0.1:1", None, {})  # validates every other argument before a server starts
    result = SweepResult(spec, [], command=command_line(args))
    for value in spec.values:
        server_args = ["--threads", "1", spec.server_flag, str(value), *args.server_arg]
        print(f"infersight loadtest: sweep {spec.setting}={value}: starting the bundled server", file=sys.stderr)
        try:
            server = start_server(server_args)
        except ServerStartError as exc:
            return _fail(str(exc), EXIT_FAIL)
        try:
            options = _options(args, server.url, server.pid, {"sweep": {spec.setting: value},
                                                               "server_args": server_args})
            if (why := _needs_root(options)) is not None:
                return _fail(why, EXIT_FAIL)
            options.label = f"{spec.setting}={value}"
            if spec.setting == "max-batch":
                options.max_batch = value
            report = Runner(options, sys.stderr).run()
        except TargetError as exc:
            return _fail(str(exc), EXIT_FAIL)
        finally:
            server.stop()
        result.points.append(point(value, report))
        result.reports.append(report.to_dict())
        print(summary(report), file=sys.stderr)
    if args.output:
        args.output.write_text(json.dumps(result.to_dict(), indent=1, sort_keys=True) + "\n")
        print(f"infersight loadtest: wrote {args.output}", file=sys.stderr)
    if args.html:
        args.html.write_text(sweep_html.render(result))
        print(f"infersight loadtest: wrote {args.html}", file=sys.stderr)
    print(result.text())
    return 0

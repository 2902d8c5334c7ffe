"""The `infersight` command line: one subcommand per user task, argument errors exit 2."""

from __future__ import annotations

import argparse
import sys


def _cmd_doctor(args: argparse.Namespace) -> int:
    from agent import doctor

    return doctor.main(as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infersight", description="eBPF + py-spy observability for inference hosts")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    doctor = sub.add_parser("doctor", help="check this host's requirements, one line each")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(func=_cmd_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""`python -m workload serve|load|fault|bench`."""

import sys


def main(argv: list[str]) -> int:
    commands = ("serve", "load", "fault", "bench")
    if not argv or argv[0] not in commands:
        print(f"usage: python -m workload {{{'|'.join(commands)}}} [options] (--help on each)", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from workload.serve import main as run
    elif command == "load":
        from workload.loadgen import main as run
    elif command == "fault":
        from workload.client import fault_main as run
    else:
        from workload.bench import main as run
    return run(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

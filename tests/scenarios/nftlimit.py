"""A bandwidth limit on what a TCP port sends, from outside the server: an nftables table dropping the packets from
PORT beyond RATE kbytes/second (root), as a policer on a thin link would. Removed when SECONDS are over or on SIGTERM.

    nftlimit.py PORT SECONDS KBYTES_PER_SECOND
"""

import signal
import subprocess
import sys
import time


def nft(args: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        raise SystemExit(f"nft {' '.join(args)}: {done.stderr.strip()}")


def main(port: int, seconds: float, kbytes: int) -> int:
    if not 0 < kbytes < 10**7:
        raise SystemExit(f"rate must be within 1..9999999 kbytes/second, got {kbytes}")
    table = f"infersight_limit_{port}"
    nft(["-f", "-"], f"table inet {table} {{\n  chain output {{\n    type filter hook output priority -150; "
                     f"policy accept;\n    tcp sport {port} limit rate over {kbytes} kbytes/second drop\n  }}\n}}\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        time.sleep(seconds)
    finally:
        nft(["delete", "table", "inet", table])
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))

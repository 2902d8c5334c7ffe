"""`infersight status`: ask the running agent over HTTP and print what it says."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from analysis.summary import summary_line


def fetch(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/status", timeout=timeout) as resp:
        return json.load(resp)


def format_status(data: dict) -> str:
    lines = [f"agent up {data['uptime_seconds']:.0f} s, {data['windows_written']} windows, "
             f"{data['late_ticks']} late ticks, {data['dropped_windows']} dropped"]
    for t in data["targets"]:
        lines.append(f"target {t['name']}: {t['state']} (pid {t['pid']})")
    for s in data["sources"]:
        reason = f" — {s['reason']}" if s.get("reason") else ""
        lines.append(f"source {s['source']}: {s.get('state')}{reason}")
    for w in data["latest"].values():
        lines.append(f"latest {summary_line(w)}")
    return "\n".join(lines)


def main(url: str, as_json: bool = False) -> int:
    try:
        data = fetch(url)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"infersight: no agent answering at {url}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2) if as_json else format_status(data))
    return 0

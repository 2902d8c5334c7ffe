"""`infersight status`: ask the running agent over HTTP and print what it says."""

from __future__ import annotations

import json
import re
import sys
import unicodedata
import urllib.error
import urllib.request

from analysis.summary import summary_line

# Terminal escape sequences, removed whole so that what is left reads plainly: CSI (ESC [ ... or the C1 byte
# 0x9b), OSC (ESC ] ... or 0x9d, up to BEL or ST: titles, hyperlinks, clipboard writes) and any other ESC pair.
_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                      r"|\x1b[ -~]?")
# Control (C0, C1, DEL), format (bidi overrides and isolates, zero-width), line/paragraph separators, and lone
# surrogates (JSON may hold "\ud800"; printing one raises).
_DROPPED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def printable(text: str) -> str:
    """`text` safe to print on a terminal: reasons and errors come from watched processes (command lines, error
    texts, /metrics answers), and an escape sequence in one must not rewrite the screen or a bidi override
    reverse what the operator reads. Whitespace controls become a space; the rest is dropped."""
    text = _ESCAPES.sub("", text)
    return "".join(" " if ch in "\t\n\r\v\f" else ch for ch in text
                   if ch in "\t\n\r\v\f" or unicodedata.category(ch) not in _DROPPED)


def fetch(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/status", timeout=timeout) as resp:
        return json.load(resp)


def format_status(data: dict) -> str:
    lines = [f"agent up {data['uptime_seconds']:.0f} s, {data['windows_written']} windows, "
             f"{data['late_ticks']} late ticks, {data['dropped_windows']} dropped"]
    for t in data["targets"]:
        # How it ended (or why it serves no one), the reason it waits: the one line an operator needs first.
        why = t.get("down") or (t.get("detail") if t["state"] != "watching" else None)
        family = f", {t['members']} processes" if t.get("members") else ""
        lines.append(f"target {t['name']}: {'down' if t.get('down') else t['state']} (pid {t['pid']}{family})"
                     + (f" — {why}" if why else ""))
        lines.extend(f"target {t['name']}: {problem}" for problem in t.get("problems") or ())
    for s in data["sources"]:
        reason = f" — {s['reason']}" if s.get("reason") else ""
        lines.append(f"source {s['source']}: {s.get('state')}{reason}")
    for w in data["latest"].values():
        lines.append(f"latest {summary_line(w)}")
    return "\n".join(printable(line) for line in lines)


def main(url: str, as_json: bool = False) -> int:
    try:
        data = fetch(url)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(printable(f"infersight: no agent answering at {url}: {exc}"), file=sys.stderr)
        return 1
    # json.dumps escapes every control and non-ASCII character (ensure_ascii), so --json needs no filter.
    print(json.dumps(data, indent=2) if as_json else format_status(data))
    return 0

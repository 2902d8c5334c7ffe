"""`infersight changes`: a target's changes (what it runs, before and after) from the store."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TextIO

from agent.config import Config
from agent.identity import printable
from agent.regressions_cmd import UsageError, open_store
from agent.store.changes import StoredChange


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def format_table(found: list[StoredChange]) -> str:
    """One line per changed part, the first part of each change on its line; text the target chose made printable."""
    if not found:
        return "no changes"
    lines = [f"{'at':19}  {'target':16} {'pid':>7}  {'part':8}  before → after"]
    for c in found:
        for n, part in enumerate(c.diff or [{"part": "-", "before": "", "after": ""}]):
            head = f"{_when(c.at):19}  {printable(c.target, 16):16} {c.pid:>7}" if n == 0 else " " * 45
            lines.append(f"{head}  {part['part']:8}  {printable(part['before'])} → {printable(part['after'])}")
        lines.append(f"{'':45}  id {printable(c.id)}")
    return "\n".join(lines)


def list_changes(config: Config, store_dir: Path | None, target: str | None, as_json: bool, limit: int,
                 out: TextIO | None = None) -> int:
    out = out or sys.stdout
    with open_store(config, store_dir) as store:
        found = store.changes(target, limit=limit)
    if as_json:
        for c in found:
            print(json.dumps(c.to_dict(), sort_keys=True), file=out)
    else:
        print(format_table(found), file=out)
    return 0


def accept(config: Config, store_dir: Path | None, target: str, out: TextIO | None = None) -> int:
    """`infersight baseline accept TARGET`: the new build is the new normal. The detector forgets the old identity's
    baseline (a durable request the running agent takes at its next window), closes the regression measured against
    it, and learns the baseline again from the windows that follow."""
    out = out or sys.stdout
    with open_store(config, store_dir) as store:
        known = {t.name for t in store.targets()}
        if target not in known:
            raise UsageError(f"no target {target!r} in the store (known: {', '.join(sorted(known)) or 'none'})")
        newest = store.changes(target, limit=1)
        store.request_baseline_reset(target)
    since = f" (its change {newest[0].id})" if newest else ""
    print(f"infersight: {target}'s current build accepted{since}; its open regression closes and the agent learns "
          "a new baseline from its next windows", file=out)
    return 0


def report(config: Config, store_dir: Path | None, change_id: str, html: Path | None, as_json: bool,
           out: TextIO | None = None) -> int:
    """`infersight changes --report CHANGE_ID [--html FILE]`: the change's before/after table (analysis.change_report)."""
    from analysis.change_report import SPAN_SECONDS, compare, format_table, sides, to_html

    out = out or sys.stdout
    with open_store(config, store_dir) as store:
        change = store.change(change_id)
        if change is None:
            raise UsageError(f"no change {printable(change_id, 100)!r} in the store (infersight changes lists them)")
        around = store.changes(change.target, since=change.at - SPAN_SECONDS, until=change.at + SPAN_SECONDS,
                               limit=1000)
        previous = max((c.at for c in around if c.at < change.at), default=None)
        following = min((c.at for c in around if c.at > change.at), default=None)
        windows = store.windows(change.target, since=change.at - SPAN_SECONDS, until=change.at + SPAN_SECONDS,
                                with_profiles=False)
    before, after = sides(windows, change.at, change.pid, previous, following)
    result = compare(before, after)
    diff = [f"{d['part']}: {d['before']} → {d['after']}" for d in change.diff]
    if html is not None:
        html.write_text(to_html(result, f"{change.target}: change {change.id}", diff))
        print(f"infersight: wrote {html}", file=sys.stderr)
    if as_json:
        print(json.dumps({"change": change.id, "diff": change.diff, **result.to_dict()}, sort_keys=True), file=out)
    else:
        print(f"{printable(change.target)} {_when(change.at)} (change {printable(change.id)})", file=out)
        for line in diff:
            print(f"  {printable(line)}", file=out)
        print(format_table(result), file=out)
    return 0

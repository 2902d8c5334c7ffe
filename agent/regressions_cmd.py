"""`infersight regressions` and `infersight baseline reset`: the detector's findings from the store."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TextIO

from agent.config import Config
from analysis.regression import Regression, regression_to_dict


class UsageError(ValueError):
    """The store or target named cannot be used; the message says why."""


def open_store(config: Config, store_dir: Path | None):
    from agent.store import DB_NAME, Store

    path = store_dir or Path(config.store_dir)
    if not (path / DB_NAME).exists():
        raise UsageError(f"no store at {str(path)!r} (no {DB_NAME}); pass --store DIR or --config FILE")
    return Store.open(path)


def _when(ts: float | None) -> str:
    return "open" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def format_table(found: list[Regression]) -> str:
    if not found:
        return "no regressions"
    lines = [f"{'opened':19}  {'closed':19}  {'target':16} {'severity':8}  {'cause':14}  evidence"]
    for r in found:
        evidence = r.causes[0].evidence if r.causes else "none of the measured signals moved"
        lines.append(f"{_when(r.opened_at):19}  {_when(r.closed_at):19}  {r.target[:16]:16} {r.severity:8}  "
                     f"{r.top_cause:14}  {evidence}")
        for c in r.causes[1:3]:
            lines.append(f"{'':19}  {'':19}  {'':16} {'':8}  {c.label:14}  {c.evidence}")
    return "\n".join(lines)


def list_regressions(config: Config, store_dir: Path | None, target: str | None, as_json: bool,
                     limit: int, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    with open_store(config, store_dir) as store:
        found = store.regressions(target=target, limit=limit)
    if as_json:
        for r in found:
            print(json.dumps(regression_to_dict(r), sort_keys=True), file=out)
    else:
        print(format_table(found), file=out)
    return 0


def reset_baseline(config: Config, store_dir: Path | None, target: str, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    with open_store(config, store_dir) as store:
        known = {t.name for t in store.targets()}
        if target not in known:
            raise UsageError(f"no target {target!r} in the store (known: {', '.join(sorted(known)) or 'none'})")
        store.request_baseline_reset(target)
    print(f"infersight: baseline of {target} reset; the agent learns a new one from its next windows", file=out)
    return 0

"""`infersight alerts` (alerts and their delivery state) and `infersight alert test` (one receiver, for real)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from agent.alerts.alerter import Alerter
from agent.alerts.delivery import DeliveryCounters, ReceiverWorker
from agent.alerts.secrets import load_secret
from agent.alerts.service import external_url
from agent.alerts.transport import PostResult
from agent.alerts.view import alerts_view
from agent.config import Config, ConfigError
from agent.store import Store, StoreError
from agent.store.alerts import Outbox
from analysis.regression import Cause, Regression

TEST_TARGET = "infersight-test"


def _fail(message: str, code: int) -> int:
    print(f"infersight: {message}", file=sys.stderr)
    return code


def _when(ts: float | None) -> str:
    return "–" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_view(view: dict) -> str:
    lines = []
    for r in view["receivers"]:
        oldest = "" if r["oldest_pending_seconds"] is None else f" (oldest {r['oldest_pending_seconds']:.0f} s)"
        err = f"; last error at {_when(r['last_error_at'])}: {r['last_error']}" if r["last_error"] else ""
        where = f"{r['kind']} {r['url']}" if r["configured"] else "no longer configured"
        lines.append(f"receiver {r['name']} ({where}): {r['pending']} pending{oldest}, {r['sent']} sent, "
                     f"{r['failed']} failed, {r['expired']} expired{err}")
    if not view["receivers"]:
        lines.append("no receivers configured (see docs/alerts.md)")
    for a in view["alerts"]:
        closed = f", closed {_when(a['closed_at'])}" if a["closed_at"] else ""
        lines.append(f"alert {a['regression_id']} on {a['target']}: {a['severity']}, {a['state']}, opened "
                     f"{_when(a['opened_at'])}{closed}, fingerprint {a['fingerprint'] or '–'}")
        for n in a["notifications"]:
            extra = f" after {n['attempts']} attempts" if n["attempts"] > 1 else ""
            err = f" — {n['last_error']}" if n["last_error"] and n["state"] != "sent" else ""
            lines.append(f"  {n['receiver']} {n['status']}: {n['state']}{extra}{err}")
    if not view["alerts"]:
        lines.append("no alerts raised")
    return "\n".join(lines)


def _open_store(config: Config, store_dir: Path | None) -> Store:
    return Store.open(store_dir or config.store_dir)


def list_alerts(config: Config, *, as_json: bool, store_dir: Path | None = None, limit: int = 50) -> int:
    try:
        store = _open_store(config, store_dir)
    except (StoreError, ConfigError) as exc:
        return _fail(str(exc), 1)
    with store:
        view = alerts_view(Outbox(store), config.receivers, time.time(), limit=limit)
    print(json.dumps(view, indent=2) if as_json else format_view(view))
    return 0


def _report(label: str, result: PostResult, key: str) -> str:
    if result.accepted:
        return f"{label}: accepted, HTTP {result.status} in {result.seconds:.2f} s (Idempotency-Key {key})"
    return f"{label}: NOT accepted: {result.error}"


def send_test(config: Config, name: str, *, store_dir: Path | None = None) -> int:
    """A firing and then a resolved test alert, queued in the real outbox under an owner of their own (the
    running agent leaves them alone) and delivered here, one attempt each; 0 only when both were accepted."""
    known = {r.name: r for r in config.receivers}
    if name not in known:
        names = ", ".join(known) or "none configured"
        return _fail(f"no receiver named {name!r} (receivers: {names})", 2)
    # The test alert must reach this receiver whatever its filters say.
    receiver = dataclasses.replace(known[name], targets=(), min_severity="warning")
    try:
        secret = load_secret(receiver)
        store = _open_store(config, store_dir)
    except ConfigError as exc:
        return _fail(f"config error: {exc}", 2)
    except StoreError as exc:
        return _fail(str(exc), 1)
    owner = f"cli-test:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    alerts_config = dataclasses.replace(config.alerts, group_wait_seconds=0.0, resolve=True)
    with store:
        outbox = Outbox(store)
        alerter = Alerter(alerts_config, (receiver,), store, host=config.alerts.host or os.uname().nodename,
                          external_url=external_url(config), owner=owner)
        worker = ReceiverWorker(receiver, secret, outbox, alerts_config, DeliveryCounters(), owner=owner)
        now = time.time()
        reg = Regression(id=f"test-{uuid.uuid4().hex[:12]}", target=TEST_TARGET, pid=os.getpid(), opened_at=now,
                         severity="warning", score=0.0,
                         causes=[Cause("unknown", 1.0, "a test alert from 'infersight alert test'")])
        # An alert references its regression in the store, so the test episode is saved too, marked as a test:
        # it exists for this alert only, and no listing (page, API, `infersight regressions`) shows it.
        store.save_regression(reg, test=True)
        alerter.regression_opened(reg)
        closed = dataclasses.replace(reg, closed_at=time.time())
        store.save_regression(closed, test=True)
        alerter.regression_closed(closed)
        print(f"receiver {receiver.name} ({receiver.kind} {receiver.safe_url}), test alert {reg.id}")
        ok = True
        for label in ("firing", "resolved"):
            n = outbox.next_due(receiver.name, owner, time.time() + 1)
            if n is None or n.status != label:
                ok = False
                print(f"{label}: not sent (the firing was not accepted)")
                break
            result = worker.attempt(n)
            print(_report(label, result, n.idempotency_key))
            if not result.accepted:
                ok = False
                if label == "firing":
                    print("resolved: not sent (the firing was not accepted)")
                break
        outbox.give_up(owner, "not retried: 'alert test' makes one attempt", time.time())
    return 0 if ok else 1

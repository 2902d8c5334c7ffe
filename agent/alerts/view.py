"""The outbox as plain dicts: one shape for the status page, `/api/alerts` and `infersight alerts --json`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from agent.alerts.config import ReceiverConfig
from agent.store.alerts import Outbox


def alerts_view(outbox: Outbox, receivers: tuple[ReceiverConfig, ...], now: float, limit: int = 20) -> dict[str, Any]:
    """Receivers with counts and last error (URLs without credentials), then the newest alerts."""
    known = {r.name: r for r in receivers}
    rows = []
    for s in outbox.summaries(list(known)):
        r = known.get(s.receiver)
        rows.append({
            "name": s.receiver,
            "kind": r.kind if r else None,
            "url": r.safe_url if r else None,
            "configured": r is not None,
            **s.counts,
            "oldest_pending_seconds": None if s.oldest_pending_at is None else round(now - s.oldest_pending_at, 1),
            "last_error": s.last_error,
            "last_error_at": s.last_error_at,
            "last_sent_at": s.last_sent_at,
        })
    return {"receivers": rows, "alerts": [{**asdict(a), "notifications": [
        {k: v for k, v in asdict(n).items()} for n in a.notifications]} for a in outbox.alerts(limit)]}

"""The words a `network` cause carries when the delivery probe measured the window: what the clients lost."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from analysis.cause_signals import BY_NAME

if TYPE_CHECKING:
    from analysis.attribution import SignalStats


def delivery_words(values: Mapping[str, float | None], stats: Mapping[str, SignalStats | None]) -> str | None:
    """"replies delivered 0.42 s later at p99 (x3.1), 18 % of replies retransmitted, RTO stalls 1.6 s/s" from a
    window's delivery signals against the baseline's medians; None when its p99 delivery was not measured."""
    p99, base = values.get("delivery_p99"), stats.get("delivery_p99")
    if p99 is None or base is None:
        return None
    floor = BY_NAME["delivery_p99"].floor
    parts = [f"replies delivered {p99 - base.median:.2g} s later at p99 (x{p99 / max(base.median, floor):.2g})"]
    if (share := values.get("retransmitted_replies")) is not None:
        parts.append(f"{100 * share:.0f} % of replies retransmitted")
    if (stall := values.get("rto_stall")) is not None and stall > 0:
        parts.append(f"RTO stalls {stall:.2g} s/s")
    if (wait := values.get("connect_wait")) is not None and wait > 0:
        parts.append(f"connections waited {wait:.2g} s per request for SYN-ACK retransmits")
    if (late := values.get("request_wait")) is not None and late > 0:
        parts.append(f"first requests arrived {late:.2g} s per request late after the handshake (resent)")
    return ", ".join(parts)

"""Request signatures: HMAC-SHA256 over "timestamp.body", and the receiver-side check docs/alerts.md shows."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

TIMESTAMP_HEADER = "X-Infersight-Timestamp"
SIGNATURE_HEADER = "X-Infersight-Signature"
DEFAULT_MAX_AGE_SECONDS = 300


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def sign_headers(secret: bytes, body: bytes, now: float | None = None) -> dict[str, str]:
    """The two headers for one attempt; each retry is signed afresh so its timestamp stays recent."""
    ts = int(time.time() if now is None else now)
    return {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: signature(secret, ts, body)}


def verify(secret: bytes, headers: Mapping[str, str], body: bytes, *, now: float | None = None,
           max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS) -> bool:
    """True when the signature matches and the timestamp is within max_age_seconds of now (replays of old
    requests fail; a replay inside the window carries the same Idempotency-Key, which receivers dedupe)."""
    ts = headers.get(TIMESTAMP_HEADER, "")
    sig = headers.get(SIGNATURE_HEADER, "")
    if not ts.isdigit() or abs((time.time() if now is None else now) - int(ts)) > max_age_seconds:
        return False
    return hmac.compare_digest(signature(secret, int(ts), body), sig)

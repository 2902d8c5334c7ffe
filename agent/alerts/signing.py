"""Request signatures: HMAC-SHA256 over "timestamp.key.body", and the receiver-side check docs/alerts.md shows."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping

TIMESTAMP_HEADER = "X-Infersight-Timestamp"
SIGNATURE_HEADER = "X-Infersight-Signature"
KEY_HEADER = "Idempotency-Key"
DEFAULT_MAX_AGE_SECONDS = 300
# One spelling per value, ASCII only: str.isdigit() also takes '²' and '١', and int() takes ' 12', '+12', '0_1';
# a form that differs from the signed bytes would be checked against bytes nobody signed. Twelve digits reach
# the year 33658, and a millisecond timestamp (13 digits) is refused instead of read as a date far ahead.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
# uuid4().hex. No '.', so "ts.key.body" splits one way only: no other (key, body) pair signs the same bytes.
_KEY = re.compile(r"[0-9a-f]{32}")
_SIGNATURE = re.compile(r"sha256=[0-9a-f]{64}")


def signed_bytes(timestamp: str, key: str, body: bytes) -> bytes:
    """What the HMAC covers: the timestamp header, the Idempotency-Key header and the raw body, dot-separated.
    The key is inside so a captured request cannot be replayed under a fresh key past a receiver's dedupe."""
    return f"{timestamp}.{key}.".encode("ascii") + body


def signature(secret: bytes, timestamp: int, key: str, body: bytes) -> str:
    if not _KEY.fullmatch(key):
        raise ValueError(f"an idempotency key is 32 lowercase hex characters, got {key[:40]!r}")
    return "sha256=" + hmac.new(secret, signed_bytes(str(timestamp), key, body), hashlib.sha256).hexdigest()


def sign_headers(secret: bytes, key: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """The two headers for one attempt of the notification `key`; each retry is signed afresh so its timestamp
    stays recent (the key and the body stay the same)."""
    ts = int(time.time() if now is None else now)
    return {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: signature(secret, ts, key, body)}


def verify(secret: bytes, headers: Mapping[str, str], body: bytes, *, now: float | None = None,
           max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS) -> bool:
    """True when the signature matches and the timestamp is within max_age_seconds of now (replays of old
    requests fail; a replay inside the window carries the same Idempotency-Key, which receivers dedupe).
    Every header must have its one exact form; anything else is refused, never raised on."""
    ts = headers.get(TIMESTAMP_HEADER, "")
    key = headers.get(KEY_HEADER, "")
    sig = headers.get(SIGNATURE_HEADER, "")
    if not (_TIMESTAMP.fullmatch(ts) and _KEY.fullmatch(key) and _SIGNATURE.fullmatch(sig)):
        return False
    if abs((time.time() if now is None else now) - int(ts)) > max_age_seconds:
        return False
    want = "sha256=" + hmac.new(secret, signed_bytes(ts, key, body), hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, sig)

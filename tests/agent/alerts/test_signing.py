"""HMAC signatures checked on the receiver side by the verifier docs/alerts.md prints: good passes; a tampered
body or key, a wrong secret, a missing header, a malformed timestamp and a replayed old request fail."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
import types
from pathlib import Path

import pytest

from agent.alerts import signing
from agent.alerts.service import AlertService
from agent.config import config_from_dict
from agent.store import Store
from tests.agent.alerts.conftest import say_opened

REPO = Path(__file__).resolve().parents[3]
SECRET = b"0123456789abcdef-receiver-secret"


def documented_verifier(clock_offset: float = 0.0, at: float | None = None):
    """The python block under "Verifying a signature" in docs/alerts.md, run as is (its clock moved by
    `clock_offset`, or stopped at `at`)."""
    text = (REPO / "docs" / "alerts.md").read_text()
    section = text.split("## Verifying a signature", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 12
    ns: dict = {}
    exec(code, ns)
    if at is not None:
        ns["time"] = types.SimpleNamespace(time=lambda: at)
    elif clock_offset:
        ns["time"] = types.SimpleNamespace(time=lambda: time.time() + clock_offset)
    return ns["verify"]


@pytest.fixture
def signed_request(tmp_path: Path, receivers, make_reg):
    r = receivers()
    secret = tmp_path / "ops.secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    conf = config_from_dict({"store_dir": str(tmp_path / "store"), "alerts": {"group_wait_seconds": 0},
                             "receivers": [{"name": "ops", "url": r.url, "hmac_secret_file": str(secret)}]})
    with Store.open(conf.store_dir) as store:
        service = AlertService(conf, store)
        service.start()
        try:
            say_opened(service, make_reg("sig-1"))
            deadline = time.monotonic() + 10
            while not r.accepted() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            service.stop()
    (arrival,) = r.accepted()
    return arrival


def test_documented_verifier_accepts_the_real_request(signed_request) -> None:
    verify = documented_verifier()
    assert signed_request.headers["X-Infersight-Signature"].startswith("sha256=")
    assert verify(SECRET, signed_request.headers, signed_request.body)
    assert signing.verify(SECRET, signed_request.headers, signed_request.body)


def test_tampered_body_wrong_secret_and_missing_header_are_rejected(signed_request) -> None:
    verify = documented_verifier()
    body = signed_request.body
    tampered = body.replace(b'"severity":"warning"', b'"severity":"critical"')
    assert tampered != body
    assert not verify(SECRET, signed_request.headers, tampered)
    assert not verify(b"not-the-secret", signed_request.headers, body)
    headers = {k: v for k, v in signed_request.headers.items() if k != "X-Infersight-Timestamp"}
    assert not verify(SECRET, headers, body)
    # Moving the timestamp without re-signing breaks the signature.
    moved = {**signed_request.headers, "X-Infersight-Timestamp": str(int(time.time()) + 1)}
    assert not verify(SECRET, moved, body)


def test_replayed_old_request_is_rejected(signed_request) -> None:
    # The same bytes, presented again six minutes later.
    assert not documented_verifier(clock_offset=360)(SECRET, signed_request.headers, signed_request.body)
    assert documented_verifier(clock_offset=60)(SECRET, signed_request.headers, signed_request.body)
    # Correctly signed, but with an old timestamp.
    key = signed_request.headers["Idempotency-Key"]
    old = {"Idempotency-Key": key, **signing.sign_headers(SECRET, key, signed_request.body, now=time.time() - 3600)}
    assert not documented_verifier()(SECRET, old, signed_request.body)
    assert not signing.verify(SECRET, old, signed_request.body)


def test_the_idempotency_key_is_signed(signed_request) -> None:
    """A captured request re-sent under a new key (to pass a receiver's de-duplication) fails the check."""
    verify = documented_verifier()
    key = signed_request.headers["Idempotency-Key"]
    other = "0" * 32 if key != "0" * 32 else "1" * 32
    for tampered in (other, key.upper(), key + "0", "", f"{key}.x"):
        headers = {**signed_request.headers, "Idempotency-Key": tampered}
        assert not verify(SECRET, headers, signed_request.body), tampered
        assert not signing.verify(SECRET, headers, signed_request.body), tampered
    # Moving a byte between the key and the body cannot keep the signed bytes either.
    body = signed_request.body
    shifted = {**signed_request.headers, "Idempotency-Key": key[:-1]}
    assert not signing.verify(SECRET, shifted, key[-1:].encode() + body)
    headers = {k: v for k, v in signed_request.headers.items() if k != "Idempotency-Key"}
    assert not verify(SECRET, headers, body) and not signing.verify(SECRET, headers, body)


def raw_signature(ts: str, key: str, body: bytes) -> str:
    """A signature over exactly these header bytes, as a careless or hostile signer would make it."""
    return "sha256=" + hmac.new(SECRET, ts.encode() + b"." + key.encode() + b"." + body, hashlib.sha256).hexdigest()


# (timestamp header, the unix time a lenient parser reads in it). Each is signed over its own bytes and checked
# at that time, so only the form can refuse it. int() accepts the first five; '²' passes isdigit() and then
# makes int() raise; 5,000 digits make int() raise too (CPython's 4,300-digit limit).
MALFORMED_TIMESTAMPS = [
    (" 1700000000", 1_700_000_000), ("+1700000000", 1_700_000_000), ("1700000000\n", 1_700_000_000),
    ("1_700_000_000", 1_700_000_000), ("\u0661\u0667\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660", 1_700_000_000),
    ("1e9", 1e9), ("1700000000.0", 1_700_000_000), ("-5", -5), ("", 0), ("\u00b2", 2),
    ("1700000000000", 1_700_000_000_000), ("9" * 5000, 1e12),
]


@pytest.mark.parametrize(("ts", "at"), MALFORMED_TIMESTAMPS, ids=[repr(t[:14]) for t, _ in MALFORMED_TIMESTAMPS])
def test_timestamp_must_be_one_to_twelve_ascii_digits(ts: str, at: float) -> None:
    body = b'{"status":"firing"}'
    key = "ab" * 16
    headers = {"X-Infersight-Timestamp": ts, "Idempotency-Key": key, "X-Infersight-Signature": raw_signature(ts, key, body)}
    assert not documented_verifier(at=at)(SECRET, headers, body)
    assert not signing.verify(SECRET, headers, body, now=at)


def test_twelve_digits_and_the_canonical_form_pass() -> None:
    body = b"{}"
    key = "cd" * 16
    for ts in ("1700000000", "999999999999"):
        headers = {"Idempotency-Key": key, **signing.sign_headers(SECRET, key, body, now=float(ts))}
        assert headers["X-Infersight-Timestamp"] == ts
        assert documented_verifier(at=float(ts))(SECRET, headers, body)
        assert signing.verify(SECRET, headers, body, now=float(ts))


def test_hostile_signature_header_is_refused_not_raised() -> None:
    """compare_digest raises TypeError on a non-ASCII str: a receiver must refuse the request, not crash."""
    body = b"{}"
    key = "ef" * 16
    good = {"Idempotency-Key": key, **signing.sign_headers(SECRET, key, body, now=1_700_000_000)}
    for sig in ("sha256=\u00e9" + "0" * 63, good["X-Infersight-Signature"].upper(), good["X-Infersight-Signature"] + " ",
                good["X-Infersight-Signature"][7:], "sha1=" + "0" * 40):
        headers = {**good, "X-Infersight-Signature": sig}
        assert not documented_verifier(at=1_700_000_000)(SECRET, headers, body), sig
        assert not signing.verify(SECRET, headers, body, now=1_700_000_000), sig


def test_signer_refuses_a_key_it_would_not_verify() -> None:
    with pytest.raises(ValueError, match="32 lowercase hex"):
        signing.sign_headers(SECRET, "not.a.key", b"{}")

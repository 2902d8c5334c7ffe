"""HMAC signatures checked on the receiver side by the verifier docs/alerts.md prints: good passes; a tampered
body, a wrong secret, a missing header and a replayed old request fail."""

from __future__ import annotations

import re
import time
import types
from pathlib import Path

import pytest

from agent.alerts import signing
from agent.alerts.service import AlertService
from agent.config import config_from_dict
from agent.store import Store

REPO = Path(__file__).resolve().parents[3]
SECRET = b"0123456789abcdef-receiver-secret"


def documented_verifier(clock_offset: float = 0.0):
    """The python block under "Verifying a signature" in docs/alerts.md, run as is."""
    text = (REPO / "docs" / "alerts.md").read_text()
    section = text.split("## Verifying a signature", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    ns: dict = {}
    exec(code, ns)
    if clock_offset:
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
            service.regression_opened(make_reg("sig-1"))
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
    old = signing.sign_headers(SECRET, signed_request.body, now=time.time() - 3600)
    assert not documented_verifier()(SECRET, old, signed_request.body)
    assert not signing.verify(SECRET, old, signed_request.body)

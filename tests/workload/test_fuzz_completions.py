"""A bounded hypothesis fuzz of the workload's /v1/completions on loopback: no 500, no traceback."""

import http.client
import json
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.workload

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=40),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                 max_size=4), max_leaves=12)
# Lone surrogates too: JSON's "\ud800" escape decodes to one, and hypothesis's text() leaves them out.
TEXT = st.text(alphabet=st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=60)
FIELDS = st.fixed_dictionaries({}, optional={
    "prompt": st.one_of(TEXT, st.lists(st.text(max_size=10), max_size=2), JSON),
    "max_tokens": st.one_of(st.integers(-5, 600), JSON),
    "temperature": st.one_of(st.floats(), JSON),
    "seed": st.one_of(st.integers(-1, 2**64), JSON),
    "stream": st.one_of(st.booleans(), JSON),
})


def _encode(value) -> bytes:
    # allow_nan: NaN and Infinity are what a hostile client sends as well.
    return json.dumps(value).encode()


BODIES = st.one_of(FIELDS.map(_encode), JSON.map(_encode), st.binary(max_size=200),
                   st.text(max_size=50).map(lambda t: ('{"prompt": "' + t).encode("utf-8", "surrogatepass")))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES, content_type=st.sampled_from(["application/json", "text/plain", ""]))
def test_completions_never_answer_500(server, body, content_type):
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": content_type} if content_type else {})
        resp = conn.getresponse()
        text = resp.read()
    finally:
        conn.close()
    assert resp.status < 500 or resp.status == 503, (body[:200], resp.status, text[:300])
    assert b"Traceback" not in text, text[:300]

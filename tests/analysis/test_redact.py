"""Credentials inside URLs are hidden wherever a URL is shown."""

import pytest

from analysis.redact import redact_text


@pytest.mark.parametrize("text, shown", [
    ("https://user:pass@host/metrics", "https://***@host/metrics"),
    ("latency endpoint http://admin:s3cr@t@10.0.0.1:9090/m unreachable",
     "latency endpoint http://***@10.0.0.1:9090/m unreachable"),
    ("fetch http://tok@host:8000/x and https://a:b@c/d", "fetch http://***@host:8000/x and https://***@c/d"),
    ("no url here: user@example.com", "no url here: user@example.com"),
    ("http://host/path?next=a@b", "http://host/path?next=a@b"),
])
def test_userinfo_is_hidden(text, shown):
    out = redact_text(text)
    if shown is not None:
        assert out == shown
    assert "pass" not in out and "s3cr" not in out and ":b@" not in out

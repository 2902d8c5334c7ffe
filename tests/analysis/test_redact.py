"""Credentials inside URLs are hidden wherever a URL is shown."""

import pytest

from analysis.redact import redact_text


@pytest.mark.parametrize("text, shown", [
    ("https://user:pass@host/metrics", "https://***@host/metrics"),
    ("latency endpoint http://admin:s3cr@t@10.0.0.1:9090/m unreachable",
     "latency endpoint http://***@10.0.0.1:9090/m unreachable"),
    ("fetch http://tok@host:8000/x and https://a:b@c/d", "fetch http://***@host:8000/x and https://***@c/d"),
    ("no url here: user@example.com", "no url here: user@example.com"),
])
def test_userinfo_is_hidden(text, shown):
    out = redact_text(text)
    if shown is not None:
        assert out == shown
    assert "pass" not in out and "s3cr" not in out and ":b@" not in out


@pytest.mark.parametrize("text, shown", [
    # Tokens travel in queries (`/metrics?token=…`): every query goes, whichever parameter holds the token.
    ("http://127.0.0.1:8000/metrics?token=s3cret", "http://127.0.0.1:8000/metrics?…"),
    ("http://host/path?next=a@b", "http://host/path?…"),
    ("latency endpoint 'http://u:s3cret@h:1/m?k=s3cret&x=1' did not answer", "latency endpoint 'http://***@h:1/m?…' did not answer"),
    ("http://h/m?access_token=s3cret#frag and http://h/?s3cret", "http://h/m?… and http://h/?…"),
    ("<a href=\"http://h/m?t=s3cret\">", "<a href=\"http://h/m?…\">"),
    ("no url: a?b=c", "no url: a?b=c"),
    ("http://h/m#only-a-fragment", "http://h/m#only-a-fragment"),
])
def test_queries_are_hidden(text, shown):
    out = redact_text(text)
    assert out == shown
    assert "s3cret" not in out

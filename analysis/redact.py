"""Hide credentials in text that is shown or stored: `scheme://user:pass@host` becomes `scheme://***@host`."""

from __future__ import annotations

import re

# userinfo runs from "//" to the last "@" before the path, query or fragment (a password may hold "@").
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]+@")


def redact_text(text: str) -> str:
    """`text` with the user-info part of every URL in it replaced by `***`."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


def redact_url(url: str) -> str:
    return redact_text(url)

"""Hide credentials in text that is shown or stored: `scheme://user:pass@host/p?token=x` becomes `scheme://***@host/p?…`."""

from __future__ import annotations

import re

# userinfo runs from "//" to the last "@" before the path, query or fragment (a password may hold "@"); the
# query runs to the first blank, quote or angle bracket, so a URL quoted inside a message keeps its closing quote.
_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#\s]*)(?P<path>[^?#\s\"'<>]*)"
                  r"(?P<query>\?[^\s\"'<>]*)?")


def _hide(match: re.Match[str]) -> str:
    authority = match["authority"]
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    # Tokens travel in queries (`/metrics?token=…`); which parameter holds one cannot be known, so all go.
    return f"{match['scheme']}{authority}{match['path']}{'?…' if match['query'] else ''}"


def redact_text(text: str) -> str:
    """`text` with the user-info part and the query of every URL in it replaced (`***@`, `?…`)."""
    return _URL.sub(_hide, text)


def redact_url(url: str) -> str:
    return redact_text(url)


_SECRET_FLAG = re.compile(r"^--?[\w-]*(token|password|passwd|secret|key|credential)[\w-]*$", re.IGNORECASE)


def redact_cmdline(argv: tuple[str, ...] | list[str]) -> str:
    """The command line for display, with the values of secret-looking flags hidden (`--admin-token ***`)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
        elif "=" in arg and _SECRET_FLAG.match(arg.split("=", 1)[0]):
            out.append(arg.split("=", 1)[0] + "=***")
        else:
            out.append(redact_text(arg))
            hide_next = bool(_SECRET_FLAG.match(arg))
    return " ".join(out)

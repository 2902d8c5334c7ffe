"""Response headers every page and API answer carries: a strict Content-Security-Policy and no sniffing."""

from __future__ import annotations

from flask import Flask, Response

# No inline script or style, nothing from another origin: every script is a file under /static, and
# untrusted strings (frame names, command lines, error texts) can only ever land in text nodes.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")

# The SVG exports carry their own static inline script (click to zoom, search; analysis/flamegraph/svg_script.py)
# with frame names escaped into text nodes. Opened on their own they run sandboxed: a unique origin that can
# reach nothing of the agent's, and load nothing.
SVG_CSP = "sandbox allow-scripts; default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"


def add_headers(resp: Response) -> Response:
    resp.headers.setdefault("Content-Security-Policy", SVG_CSP if resp.mimetype == "image/svg+xml" else CSP)
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Referrer-Policy", "no-referrer")
    resp.headers.setdefault("X-Frame-Options", "DENY")
    return resp


def init_app(app: Flask) -> None:
    app.after_request(add_headers)

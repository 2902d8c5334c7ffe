"""Response headers every page and API answer carries (a strict Content-Security-Policy, no sniffing), and the
refusal of what a browser sends on behalf of another site's page."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

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


# ---- requests a browser makes on another site's behalf ---------------------------------------------------------

# Fetch Metadata: what a browser says about who asked. "none" is the user (typed address, bookmark); "same-site" is
# refused like "cross-site": a site is scheme and host without the port, so every other port of 127.0.0.1 (any
# local user's server, the workload's) is the same site as the agent.
_OWN_SITES = frozenset({"same-origin", "none"})
# What is not a page a person opens: a page elsewhere may link to the agent's pages (an alert's link, a Grafana
# panel), never call these.
_NOT_PAGES = ("/api/", "/debug/", "/static/", "/metrics")


def _origin_of(scheme: str, authority: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(f"{scheme}://{authority}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return scheme, parts.hostname.rstrip("."), port or {"http": 80, "https": 443}.get(scheme, 0)


def _same_origin(origin: str, environ: dict) -> bool:
    scheme, sep, authority = origin.partition("://")
    if not sep or "/" in authority:
        return False  # "null" (a sandboxed frame, a file:// page) or malformed: nobody's we know
    own = _origin_of(environ.get("wsgi.url_scheme", "http"),
                     environ.get("HTTP_HOST") or f"{environ.get('SERVER_NAME', '')}:{environ.get('SERVER_PORT', '')}")
    return own is not None and _origin_of(scheme.lower(), authority) == own


def refusal(environ: dict) -> str | None:
    """Why a request that a browser sends for another site's page is refused, or None to serve it. Requests
    without these headers (curl, Prometheus, urllib) and the page's own (same-origin) are served; a top-level
    navigation to a page (a link clicked elsewhere) is too; everything else another site's page asks is not:
    it could hold the profile slots (`/debug/pprof/profile` sleeps up to 300 s) or, with CORS, read answers."""
    origin = environ.get("HTTP_ORIGIN")
    if origin is not None and not _same_origin(origin, environ):
        return (f"refused: the request comes from the page of another origin (Origin {origin[:100]!r}); "
                f"open the agent's own page or call it from curl")
    site = environ.get("HTTP_SEC_FETCH_SITE")
    if site is None or site in _OWN_SITES:
        return None
    path = environ.get("PATH_INFO", "")
    navigation = (environ.get("HTTP_SEC_FETCH_MODE") == "navigate"
                  and environ.get("HTTP_SEC_FETCH_DEST", "document") == "document"
                  and environ.get("REQUEST_METHOD") in ("GET", "HEAD"))
    if navigation and not path.startswith(_NOT_PAGES):
        return None
    return (f"refused: a {site[:20]} request (Sec-Fetch-Site) made by another site's page; open the agent's "
            f"own page or call it from curl")


class SameOrigin:
    """WSGI middleware around the whole app (pages, API, /metrics): 403 with a one-line reason for what a
    browser sends on behalf of another site's page (`refusal`)."""

    def __init__(self, app: Callable) -> None:
        self._app = app

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        why = refusal(environ)
        if why is None:
            return self._app(environ, start_response)
        body = json.dumps({"error": why}).encode()
        start_response("403 Forbidden", [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                         ("Vary", "Origin, Sec-Fetch-Site"), ("X-Content-Type-Options", "nosniff"),
                                         ("Cache-Control", "no-store")])
        return [body]

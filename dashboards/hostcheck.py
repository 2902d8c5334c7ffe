"""Refuse requests whose Host header is a name that is not this machine's: the DNS-rebinding guard.

A page on the same host's browser can point its own domain at 127.0.0.1 and then read our answers as
same-origin; such a request still carries that domain in Host. IP literals cannot be rebound, so they
pass, as do localhost and this machine's own names.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Callable, Iterable


def own_names() -> frozenset[str]:
    # gethostname() only: getfqdn() asks DNS, which may hang for seconds on a host without it.
    names = {"localhost", "localhost.localdomain", socket.gethostname()}
    return frozenset(n.lower() for n in names if n)


def host_name(header: str) -> str:
    """The name part of a Host header: without port, brackets or a trailing dot, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0].rstrip(".") if header.count(":") == 1 else header.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostCheck:
    """WSGI middleware around the whole app (page, API and /metrics)."""

    def __init__(self, app: Callable, names: Iterable[str] | None = None) -> None:
        self._app = app
        self._names = frozenset(names) if names is not None else own_names()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        raw = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
        name = host_name(raw)
        if name and not _is_ip(name) and name not in self._names:
            body = json.dumps({"error": f"Host {raw[:100]!r} is not this machine; use 127.0.0.1 or its own "
                                        f"name (a guard against DNS rebinding)"}).encode()
            start_response("421 Misdirected Request", [("Content-Type", "application/json"),
                                                       ("Content-Length", str(len(body)))])
            return [body]
        return self._app(environ, start_response)

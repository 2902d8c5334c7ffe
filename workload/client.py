"""HTTP client for the server: streaming completions with timings, admin fault switches."""

import argparse
import http.client
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from workload.api import ADMIN_TOKEN_ENV
from workload.sse import events
from workload.tokenfile import TokenFileError, read_token_file


class ClientError(RuntimeError):
    """The server answered with an error status; `status` keeps the code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass
class CompletionResult:
    """One request as the client saw it; `status` 0 means the connection itself failed."""

    status: int
    latency_s: float
    ttft_s: float | None = None
    token_ids: list[int] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected an http://host:port URL, got {url!r}")
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout), parts.path.rstrip("/")


def complete(url: str, prompt: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None,
             stream: bool = True, timeout: float = 60.0, clock=time.perf_counter,
             headers: dict[str, str] | None = None) -> CompletionResult:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "stream": stream}
    if seed is not None:
        body["seed"] = seed
    start = clock()
    conn, base = _connection(url, timeout)
    try:
        conn.request("POST", f"{base}/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        if response.status != 200:
            return CompletionResult(response.status, clock() - start, error=response.read().decode()[:300])
        if not stream:
            payload = json.loads(response.read())
            elapsed = clock() - start
            return CompletionResult(200, elapsed, elapsed, payload["choices"][0]["token_ids"])
        result = CompletionResult(200, 0.0)
        for chunk in events(response):
            if "error" in chunk:
                result.error = chunk["error"]["message"]
                break
            ids = chunk["choices"][0].get("token_ids") or []
            if ids and result.ttft_s is None:
                result.ttft_s = clock() - start
            result.token_ids.extend(ids)
        result.latency_s = clock() - start
        return result
    except (OSError, http.client.HTTPException) as exc:
        return CompletionResult(0, clock() - start, error=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def admin_call(url: str, method: str, path: str, token: str, body: dict | None = None,
               timeout: float = 30.0) -> dict:
    conn, base = _connection(url, timeout)
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        conn.request(method, f"{base}{path}", json.dumps(body) if body is not None else None, headers)
        response = conn.getresponse()
        payload = response.read().decode()
        if response.status != 200:
            raise ClientError(response.status, payload.strip())
        return json.loads(payload)
    finally:
        conn.close()


def set_fault(url: str, name: str, on: bool, token: str, place: str | None = None) -> dict:
    """`place`: "api" or "engine" on a server started with --engine-process (None: the engine there)."""
    body: dict = {"name": name, "on": on}
    if place is not None:
        body["in"] = place
    return admin_call(url, "POST", "/admin/faults", token, body)


def kill_engine(url: str, token: str) -> dict:
    return admin_call(url, "POST", "/admin/engine/kill", token)


def debug(url: str, token: str) -> dict:
    return admin_call(url, "GET", "/admin/debug", token)


def fault_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m workload fault")
    parser.add_argument("name", help="gc, lock, syscall, netloss, cpuhog, nocache or io")
    parser.add_argument("state", choices=["on", "off"])
    parser.add_argument("--in", dest="place", choices=["api", "engine"], default=None,
                        help="the process the fault runs in, on a server started with --engine-process "
                             "(default there: engine); refused by a single-process server")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token-file", type=Path, help="file (mode 0600) holding the admin token")
    parser.add_argument("--token", default=os.environ.get(ADMIN_TOKEN_ENV),
                        help=f"admin token (default ${ADMIN_TOKEN_ENV}); on the command line every local user "
                             "can read it with ps: prefer --token-file")
    args = parser.parse_args(argv)
    if args.token_file is not None:
        try:
            args.token = read_token_file(args.token_file)
        except TokenFileError as exc:
            parser.error(str(exc))
    if not args.token:
        parser.error(f"an admin token is required: --token-file, ${ADMIN_TOKEN_ENV} or --token")
    try:
        state = set_fault(args.url, args.name, args.state == "on", args.token, args.place)
    except (ClientError, OSError) as exc:
        print(f"fault {args.name} {args.state}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(state, sort_keys=True))
    return 0

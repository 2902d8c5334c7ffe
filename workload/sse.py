"""The streamed completion's wire format (server-sent events, as OpenAI-style servers send them): one reader.

The bundled client and the agent's load test (a client of any such server: the workload, vLLM, TGI) both read
streams through `events`, so a change of framing is made once."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

DONE = b"[DONE]"


def events(lines: Iterable[bytes]) -> Iterator[Any]:
    """The JSON payload of each `data: ` line, in order, until `data: [DONE]` or the stream's end; other lines
    (comments, `event:`, blank separators) are skipped. A payload that is not JSON raises ValueError."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == DONE:
            return
        yield json.loads(data)

"""Request validation for /v1/completions: a clear 400 that quotes the bad value."""

from dataclasses import dataclass
from typing import Any

ADMIN_TOKEN_ENV = "WORKLOAD_ADMIN_TOKEN"


class BadRequest(ValueError):
    """The request cannot be served as sent; the message goes back to the client."""


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    max_tokens: int
    temperature: float
    seed: int | None
    stream: bool


@dataclass(frozen=True)
class Limits:
    max_prompt_bytes: int
    max_seq: int
    # Completions in flight at once (0: unbounded). Below the HTTP thread count, so a burst gets 429
    # at once instead of queueing in the server, and /health and /metrics always find a thread.
    max_inflight: int = 0


def parse_completion(body: Any, limits: Limits) -> CompletionRequest:
    if not isinstance(body, dict):
        raise BadRequest(f"body must be a JSON object, got {type(body).__name__}")
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest(f"'prompt' must be a string, got {type(prompt).__name__}")
    try:
        prompt_bytes = len(prompt.encode("utf-8"))
    except UnicodeEncodeError as exc:
        # JSON's "\ud800" escapes decode to a lone surrogate, which is no character at all.
        raise BadRequest(f"'prompt' is not valid Unicode: lone surrogate at index {exc.start}") from None
    if prompt_bytes > limits.max_prompt_bytes:
        raise BadRequest(f"prompt is {prompt_bytes} bytes; the limit is {limits.max_prompt_bytes}")
    max_tokens = body.get("max_tokens", 16)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise BadRequest(f"'max_tokens' must be an integer, got {max_tokens!r}")
    room = limits.max_seq - 1 - prompt_bytes
    if not 1 <= max_tokens <= room:
        raise BadRequest(f"'max_tokens' must be in 1..{room} for this prompt, got {max_tokens!r}")
    temperature = body.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 10:
        raise BadRequest(f"'temperature' must be a number in 0..10, got {temperature!r}")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise BadRequest(f"'seed' must be a non-negative integer, got {seed!r}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, got {stream!r}")
    return CompletionRequest(prompt, max_tokens, float(temperature), seed, stream)

"""Byte-level tokenizer: one token per UTF-8 byte, plus a BOS token."""

BOS = 256


def encode(text: str) -> list[int]:
    """BOS first, so an empty prompt still has a position to predict from."""
    return [BOS, *text.encode("utf-8")]


def decode(token_ids: list[int]) -> str:
    return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")

"""One decoding iteration for a batch of sequences, with or without the KV cache."""

from dataclasses import dataclass, field

import torch

from workload.config import ModelConfig
from workload.kvcache import KVCachePool
from workload.model import TinyTransformer
from workload.tokenizer import BOS


@dataclass
class Sequence:
    """Decoding state of one request: its tokens so far, KV slot and sampler."""

    tokens: list[int]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    slot: int | None = None
    cache_len: int = 0
    generated: list[int] = field(default_factory=list)
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator()
        if self.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(self.seed)

    @property
    def done(self) -> bool:
        return len(self.generated) >= self.max_tokens


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but torch.cuda.is_available() is False")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {name!r}; choose auto, cpu or cuda")
    return torch.device(name)


class Engine:
    """Model + KV pool; `use_cache=False` recomputes every sequence in full (same tokens, slower)."""

    def __init__(self, config: ModelConfig, n_slots: int, device: torch.device | str = "cpu",
                 use_cache: bool = True) -> None:
        self.config = config
        self.device = torch.device(device)
        self.model = TinyTransformer(config).to(self.device).eval()
        self.pool = KVCachePool(config, n_slots, self.device)
        self.use_cache = use_cache

    def admit(self, seq: Sequence) -> None:
        seq.slot = self.pool.allocate()
        seq.cache_len = 0

    def release(self, seq: Sequence) -> None:
        if seq.slot is not None:
            self.pool.release(seq.slot)
            seq.slot = None

    def step(self, batch: list[Sequence]) -> list[int]:
        """Append one token to every sequence in `batch`; returns the new tokens in order."""
        if not batch:
            return []
        logits = self._logits_cached(batch) if self.use_cache else self._logits_full(batch)
        new_tokens = [self._sample(seq, row) for seq, row in zip(batch, logits.float().cpu())]
        for seq, token in zip(batch, new_tokens):
            seq.tokens.append(token)
            seq.generated.append(token)
        return new_tokens

    def _logits_full(self, batch: list[Sequence]) -> torch.Tensor:
        rows = []
        for seq in batch:
            rows.append(self.model.forward_full(self._tensor([seq.tokens]))[0])
            seq.cache_len = 0  # the cache was bypassed, so it no longer matches the sequence
        return torch.stack(rows)

    def _logits_cached(self, batch: list[Sequence]) -> torch.Tensor:
        # A sequence whose cache lags (new, or decoded while the cache was off) is prefilled whole;
        # the rest share one batched decode step.
        logits: list[torch.Tensor | None] = [None] * len(batch)
        decode_idx = []
        for i, seq in enumerate(batch):
            if seq.slot is None:
                raise ValueError(f"sequence {i} has no KV slot; call admit() first")
            if seq.cache_len == len(seq.tokens) - 1:
                decode_idx.append(i)
            else:
                logits[i] = self.model.prefill(self._tensor([seq.tokens]), self.pool, seq.slot)[0]
                seq.cache_len = len(seq.tokens)
        if decode_idx:
            chosen = [batch[i] for i in decode_idx]
            out = self.model.decode(
                self._tensor([s.tokens[-1] for s in chosen]),
                self._tensor([len(s.tokens) - 1 for s in chosen]),
                self.pool,
                self._tensor([s.slot for s in chosen]),
            )
            for row, i in enumerate(decode_idx):
                logits[i] = out[row]
                batch[i].cache_len += 1
        return torch.stack(logits)

    def _tensor(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> int:
        logits = logits.clone()
        logits[BOS] = float("-inf")
        if seq.temperature <= 0.0:
            return int(torch.argmax(logits))
        # Shifted by the maximum first, so dividing by a tiny temperature (2e-309 reached the API in a fuzz run)
        # gives 0 and -inf, never inf - inf: the softmax tends to argmax as the temperature tends to 0.
        wide = logits.double()
        probs = torch.softmax((wide - wide.max()) / seq.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=seq.generator))


def generate(engine: Engine, prompts: list[list[int]], max_tokens: int, temperature: float = 0.0,
             seed: int | None = None) -> list[list[int]]:
    """Decode `prompts` together as one static batch; a reference path for tests and benchmarks."""
    seqs = [Sequence(list(p), max_tokens, temperature, seed) for p in prompts]
    for seq in seqs:
        engine.admit(seq)
    try:
        while not all(s.done for s in seqs):
            engine.step([s for s in seqs if not s.done])
    finally:
        for seq in seqs:
            engine.release(seq)
    return [s.generated for s in seqs]

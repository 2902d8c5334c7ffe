"""Preallocated KV cache: a pool of per-sequence slots reused across requests."""

import torch

from workload.config import ModelConfig


class PoolExhausted(RuntimeError):
    """No free KV slot; the scheduler keeps the request waiting."""


class KVCachePool:
    """Keys and values for `n_slots` sequences, allocated once at start-up."""

    def __init__(self, config: ModelConfig, n_slots: int, device: torch.device | str = "cpu") -> None:
        if n_slots <= 0:
            raise ValueError(f"n_slots must be positive, got {n_slots!r}")
        shape = (config.n_layers, n_slots, config.n_heads, config.max_seq, config.head_dim)
        self.keys = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.n_slots = n_slots
        self._free = list(range(n_slots - 1, -1, -1))
        self.allocations = 0

    def allocate(self) -> int:
        if not self._free:
            raise PoolExhausted(f"all {self.n_slots} KV slots are in use")
        self.allocations += 1
        return self._free.pop()

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots or slot in self._free:
            raise ValueError(f"slot {slot!r} is not allocated")
        self._free.append(slot)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def nbytes(self) -> int:
        return self.keys.element_size() * self.keys.nelement() * 2

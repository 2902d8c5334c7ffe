"""Decoder-only transformer with full, prefill-into-cache and batched cached-decode paths."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from workload.config import ModelConfig
from workload.kvcache import KVCachePool


class Block(nn.Module):
    """Pre-norm block: causal multi-head attention then an MLP."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.ln1 = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp_in = nn.Linear(config.d_model, config.d_mlp)
        self.mlp_out = nn.Linear(config.d_mlp, config.d_model)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(self.n_heads * self.head_dim, dim=-1)
        return tuple(y.view(b, t, self.n_heads, self.head_dim).transpose(1, 2) for y in (q, k, v))

    def _finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attn.shape
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.ln2(x))))

    def forward_full(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self._split(x)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self._finish(x, attn), k, v

    def forward_decode(self, x: torch.Tensor, layer: int, pool: KVCachePool, slots: torch.Tensor,
                       positions: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(x)
        keys, values = pool.keys[layer], pool.values[layer]
        keys[slots, :, positions] = k[:, :, 0]
        values[slots, :, positions] = v[:, :, 0]
        length = int(positions.max()) + 1
        visible = torch.arange(length, device=x.device)[None, :] <= positions[:, None]
        attn = F.scaled_dot_product_attention(
            q, keys[slots, :, :length], values[slots, :, :length], attn_mask=visible[:, None, None, :])
        return self._finish(x, attn)


class TinyTransformer(nn.Module):
    """Weights come from `config.seed` alone; nothing is downloaded."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(config.seed)
        try:
            self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
            self.pos_emb = nn.Embedding(config.max_seq, config.d_model)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
            self.ln_f = nn.LayerNorm(config.d_model)
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
            nn.init.normal_(self.head.weight, std=config.logit_scale / math.sqrt(config.d_model))
        finally:
            torch.random.set_rng_state(generator_state)

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.tok_emb(tokens) + self.pos_emb(positions)

    @torch.inference_mode()
    def forward_full(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits for the last position of each row of `tokens` [B, T], recomputing everything."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)[None, :]
        x = self._embed(tokens, positions)
        for block in self.blocks:
            x, _, _ = block.forward_full(x)
        return self.head(self.ln_f(x[:, -1]))

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, pool: KVCachePool, slot: int) -> torch.Tensor:
        """Run a whole sequence [1, T], store its keys/values in `slot`, return last-position logits."""
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)[None, :]
        x = self._embed(tokens, positions)
        for layer, block in enumerate(self.blocks):
            x, k, v = block.forward_full(x)
            pool.keys[layer, slot, :, :length] = k[0]
            pool.values[layer, slot, :, :length] = v[0]
        return self.head(self.ln_f(x[:, -1]))

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, pool: KVCachePool,
               slots: torch.Tensor) -> torch.Tensor:
        """One step for B sequences at their own positions: tokens, positions, slots are [B]."""
        x = self._embed(tokens[:, None], positions[:, None])
        for layer, block in enumerate(self.blocks):
            x = block.forward_decode(x, layer, pool, slots, positions)
        return self.head(self.ln_f(x[:, -1]))

"""Seeded model configurations: a small CPU default and a larger GPU preset."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder-only transformer; `seed` fixes every weight."""

    name: str = "infersight-tiny"
    n_layers: int = 4
    d_model: int = 256
    n_heads: int = 4
    d_mlp: int = 1024
    max_seq: int = 512
    vocab_size: int = 257  # 256 bytes + BOS
    seed: int = 1234
    # Spread logits wide so the argmax never hinges on float rounding; the cache-vs-recompute
    # and batched-vs-single paths round differently in the last bits.
    logit_scale: float = 8.0

    def __post_init__(self) -> None:
        for field_name in ("n_layers", "d_model", "n_heads", "d_mlp", "max_seq"):
            value = getattr(self, field_name)
            if value <= 0:
                raise ValueError(f"{field_name} must be positive, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model!r} is not divisible by n_heads {self.n_heads!r}")
        if self.vocab_size < 257:
            raise ValueError(f"vocab_size must hold 256 bytes + BOS, got {self.vocab_size!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "gpu": ModelConfig(name="infersight-gpu", n_layers=12, d_model=768, n_heads=12, d_mlp=3072, max_seq=1024),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}") from None

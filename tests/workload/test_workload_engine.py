"""Engine correctness: cache on/off and batched/unbatched give identical tokens; slots are reused."""

import pytest
import torch

from workload import tokenizer
from workload.config import ModelConfig, preset
from workload.engine import Engine, Sequence, generate
from workload.kvcache import PoolExhausted

PROMPTS = ["", "hello", "the quick brown fox jumps over the lazy dog " * 3, "x" * 200]


@pytest.fixture(scope="module")
def engine() -> Engine:
    torch.set_num_threads(1)
    return Engine(preset("tiny"), n_slots=8)


def encoded() -> list[list[int]]:
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_cache_on_and_off_give_identical_tokens(engine: Engine, temperature: float) -> None:
    engine.use_cache = True
    cached = generate(engine, encoded(), 24, temperature, seed=11)
    engine.use_cache = False
    try:
        recomputed = generate(engine, encoded(), 24, temperature, seed=11)
    finally:
        engine.use_cache = True
    assert cached == recomputed
    assert all(len(t) == 24 for t in cached)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_batched_equals_unbatched_for_same_seed(engine: Engine, temperature: float) -> None:
    batched = generate(engine, encoded(), 24, temperature, seed=5)
    single = [generate(engine, [p], 24, temperature, seed=5)[0] for p in encoded()]
    assert batched == single


def test_cache_switched_mid_sequence_catches_up(engine: Engine) -> None:
    reference = generate(engine, [tokenizer.encode("switch me")], 20, 0.7, seed=3)[0]
    seq = Sequence(tokenizer.encode("switch me"), 20, 0.7, seed=3)
    engine.admit(seq)
    try:
        for step in range(20):
            engine.use_cache = step % 7 < 4
            engine.step([seq])
    finally:
        engine.use_cache = True
        engine.release(seq)
    assert seq.generated == reference


def test_different_seeds_differ_and_greedy_ignores_seed(engine: Engine) -> None:
    prompt = [tokenizer.encode("seeded")]
    assert generate(engine, prompt, 16, 1.0, seed=1) != generate(engine, prompt, 16, 1.0, seed=2)
    assert generate(engine, prompt, 16, 0.0, seed=1) == generate(engine, prompt, 16, 0.0, seed=2)


@pytest.mark.parametrize("temperature", [2.225073858507203e-309, 5e-324, 1e-300])
def test_a_vanishing_temperature_samples_the_greedy_token(engine: Engine, temperature: float) -> None:
    # Found by the completions fuzz test: logits / 2e-309 overflowed to inf and the softmax gave NaN (a 500).
    prompt = [tokenizer.encode("nearly greedy")]
    assert generate(engine, prompt, 16, temperature, seed=1) == generate(engine, prompt, 16, 0.0, seed=1)


def test_kv_slots_are_preallocated_and_reused(engine: Engine) -> None:
    keys_ptr = engine.pool.keys.data_ptr()
    before = engine.pool.allocations
    for _ in range(3):
        generate(engine, encoded(), 4)
    assert engine.pool.keys.data_ptr() == keys_ptr
    assert engine.pool.allocations - before == 3 * len(PROMPTS)
    assert engine.pool.free == engine.pool.n_slots


def test_pool_exhaustion_is_a_domain_error() -> None:
    small = Engine(ModelConfig(n_layers=1, d_model=32, n_heads=2, d_mlp=64, max_seq=16), n_slots=1)
    small.admit(Sequence([256], 2))
    with pytest.raises(PoolExhausted, match="all 1 KV slots"):
        small.admit(Sequence([256], 2))


def test_weights_depend_only_on_seed() -> None:
    config = ModelConfig(n_layers=1, d_model=32, n_heads=2, d_mlp=64, max_seq=16)
    a, b = Engine(config, 1), Engine(config, 1)
    assert torch.equal(a.model.head.weight, b.model.head.weight)
    other = Engine(ModelConfig(n_layers=1, d_model=32, n_heads=2, d_mlp=64, max_seq=16, seed=9), 1)
    assert not torch.equal(a.model.head.weight, other.model.head.weight)


def test_tokenizer_round_trips_utf8() -> None:
    text = "naïve ⚡ bytes"
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.BOS and len(ids) == len(text.encode()) + 1
    assert tokenizer.decode(ids) == text


def test_config_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="not divisible"):
        ModelConfig(d_model=100, n_heads=3)
    with pytest.raises(ValueError, match="'huge'"):
        preset("huge")

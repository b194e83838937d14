import pytest
import torch

from blockdraft.modeling.drafter import DraftCache, visibility
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_drafter, tiny_hf_model


@pytest.fixture
def pair():
    target = TargetModel(tiny_hf_model("qwen3"))
    return target, tiny_drafter(target, layers=3)


def _features(target, n, seed=0, k=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, n, k * target.hidden_size, generator=g, dtype=target.dtype)


def _block(target, start, q=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (1, q), generator=g)
    return target.embedding(ids)


def test_incremental_cache_equals_one_shot(pair):
    target, drafter = pair
    feats = _features(target, 20)
    block = _block(target, 20)
    one = DraftCache(3)
    full = drafter.draft(block, 20, feats, one)
    chunked = DraftCache(3)
    for lo, hi in [(0, 7), (7, 8), (8, 20)]:
        drafter.draft(block, hi, feats[:, lo:hi], chunked)
    again = drafter.draft(block, 20, feats[:, :0], chunked)
    assert torch.allclose(full, again, atol=1e-12)
    assert one.length == chunked.length == 20


def test_cache_grows_past_its_initial_capacity(pair):
    target, drafter = pair
    feats = _features(target, 150)
    cache = DraftCache(3)
    for lo in range(0, 150, 10):
        drafter.draft(_block(target, lo + 10), lo + 10, feats[:, lo:lo + 10], cache)
    ref = DraftCache(3)
    blk = _block(target, 150)
    assert torch.allclose(drafter.draft(blk, 150, feats[:, :0], cache), drafter.draft(blk, 150, feats, ref))


def test_block_is_bidirectional_and_sees_context(pair):
    target, drafter = pair
    feats = _features(target, 10)
    block = _block(target, 10)
    base = drafter.draft(block, 10, feats, DraftCache(3))
    later = block.clone()
    later[:, -1] += 1.0  # change the last block token only
    changed = drafter.draft(later, 10, feats, DraftCache(3))
    assert not torch.allclose(base[:, 0], changed[:, 0])  # earlier slots see later ones
    other_ctx = feats.clone()
    other_ctx[:, 0] += 1.0
    assert not torch.allclose(base, drafter.draft(block, 10, other_ctx, DraftCache(3)))


def test_sliding_layers_are_causal_and_windowed():
    target = TargetModel(tiny_hf_model("qwen3"))
    drafter = tiny_drafter(target, layers=2, sliding_window=4)
    drafter.config.layer_types = ["sliding_attention"] * 2  # every layer windowed for this check
    feats = _features(target, 12, k=2)
    block = _block(target, 12)
    base = drafter.draft(block, 12, feats, DraftCache(2))
    later = block.clone()
    later[:, -1] += 1.0
    out = drafter.draft(later, 12, feats, DraftCache(2))
    assert torch.allclose(base[:, :-1], out[:, :-1])  # causal inside the block
    far = feats.clone()
    far[:, :2] += 1.0  # positions 0, 1: outside every query's 4-token window over 2 layers
    assert torch.allclose(base, drafter.draft(block, 12, far, DraftCache(2)))


def test_visibility_from_positions():
    q = torch.tensor([[5, 6]])
    k = torch.tensor([[0, 1, 2, 3, 4, 5, 6]])
    assert visibility(q, k, causal=False, window=None) is None
    causal = visibility(q, k, causal=True, window=3)[0, 0]
    assert causal.tolist() == [[False, False, False, True, True, True, False],
                               [False, False, False, False, True, True, True]]
    both = visibility(q, k, causal=False, window=2)[0, 0]
    assert both.tolist() == [[False, False, False, False, True, True, True],
                             [False, False, False, False, False, True, True]]


def test_runs_in_bfloat16(pair):
    target, drafter = pair
    d16 = drafter.to(torch.bfloat16)
    out = d16.draft(_block(target, 5).to(torch.bfloat16), 5, _features(target, 5).to(torch.bfloat16), DraftCache(3))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_llama3_rope_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from blockdraft.modeling.drafter import Rotary

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    config = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_scaling=dict(scaling, rope_theta=500000.0),
                         max_position_embeddings=131072)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = Rotary(128, 500000.0, scaling).inv_freq
    assert torch.allclose(ours, expected.float(), rtol=1e-6)


def test_bf16_target_with_fp32_drafter():
    target = TargetModel(tiny_hf_model("qwen3", dtype=torch.bfloat16))
    drafter = tiny_drafter(target).float()
    from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
    from blockdraft.decoding.stats import GenerationStats

    stats = GenerationStats(1)
    out = [t for c in SpeculativeEngine(target, drafter).decode([1, 2, 3], DecodeOptions(max_new_tokens=12), stats)
           for t in c]
    assert len(out) == 12 and stats.drafter_forwards > 0


def test_fused_context_projection_equals_each_layers_own_and_follows_weight_updates():
    target = TargetModel(tiny_hf_model("qwen3"))
    drafter = tiny_drafter(target, layers=3)
    feats = torch.randn(1, 5, drafter.config.hidden_size * len(drafter.config.target_layer_ids), dtype=drafter.dtype)
    pos = torch.arange(5)[None]

    def per_layer():
        ctx = drafter.hidden_norm(drafter.fc(feats))
        cos, sin = drafter.rotary(pos, ctx.dtype)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in drafter.layers]

    with torch.no_grad():
        for _ in range(2):  # the second call uses the cached stacked weight
            for (k, v), (k0, v0) in zip(drafter.context_kv(feats, pos), per_layer()):
                assert torch.allclose(k, k0) and torch.allclose(v, v0)
            drafter.layers[1].self_attn.v_proj.weight.mul_(2.0)  # an in-place update invalidates the cache


def test_windowed_cache_equals_a_drafter_given_only_the_last_tokens(pair):
    """A window of W keeps exactly the last W context tokens (at their absolute positions), through
    compactions, and matches a one-shot cache built from those tokens alone."""
    target, drafter = pair
    feats = _features(target, 150)
    windowed = DraftCache(3, window=40)
    for lo in range(0, 150, 7):
        hi = min(lo + 7, 150)
        drafter.draft(_block(target, hi), hi, feats[:, lo:hi], windowed)
    assert windowed.length == 150 and windowed.offset == 110 and windowed.layer(0)[0].shape[2] == 40
    ref = DraftCache(3)
    ref.append(drafter.context_kv(feats[:, 110:], torch.arange(110, 150)[None]))
    ref.length = 150  # the same 40 tokens at positions 110..149, nothing older
    blk = _block(target, 150)
    assert torch.allclose(drafter.draft(blk, 150, feats[:, :0], windowed), drafter.draft(blk, 150, feats[:, :0], ref))
    with pytest.raises(ValueError, match="window=0"):
        DraftCache(3, window=0)


@pytest.mark.parametrize("sliding", [False, True])
def test_drafting_many_rows_at_once_equals_drafting_each_alone(sliding):
    """Rows with different context lengths (one empty), pending features, block lengths and a windowed
    cache: the padded batched forward gives every row exactly its solo hidden states."""
    target = TargetModel(tiny_hf_model("qwen3"))
    drafter = tiny_drafter(target, layers=2, sliding_window=4 if sliding else None)
    if sliding:
        drafter.config.layer_types = ["sliding_attention", "full_attention"]
    rows = [(0, 0, 5, None), (30, 4, 8, None), (12, 12, 3, None), (50, 3, 6, 20)]  # (start, pending, Q, window)

    def setup():
        caches, pending, blocks, starts = [], [], [], []
        for r, (start, new, q, window) in enumerate(rows):
            feats = _features(target, start, seed=r, k=2)
            cache = DraftCache(2, window)
            if start - new:
                cache.append(drafter.context_kv(feats[:, : start - new], torch.arange(start - new)[None]))
            caches.append(cache)
            pending.append(feats[:, start - new:])
            blocks.append(_block(target, start, q=q, seed=r)[0])
            starts.append(start)
        return blocks, starts, pending, caches

    solo = [drafter.draft(b[None], s, p, c)[0] for b, s, p, c in zip(*setup())]
    batched = drafter.draft_many(*setup())
    for a, b in zip(solo, batched):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-10)

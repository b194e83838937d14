"""Hybrid targets' linear-attention states go back to any committed length after a forward
(`blockdraft.modeling.recurrent`), exactly as if the rolled-back tokens had never been fed."""
from __future__ import annotations

import pytest
import torch

from blockdraft.errors import IncompatibleModelsError
from blockdraft.modeling.memory import linear_state_bytes
from blockdraft.modeling.target import TargetModel
from tests.conftest import HYBRIDS, tiny_family_model


OTHER_PATTERN = ["full_attention", "linear_attention", "full_attention", "linear_attention", "linear_attention"]


@pytest.fixture(params=[*HYBRIDS, "qwen3_5-other-pattern"])
def hybrid(request) -> TargetModel:
    """Each hybrid family with the published pattern (3 linear-attention layers, then full attention), and
    Qwen3.5 with another one (full attention first, linear attention last)."""
    if request.param.endswith("-other-pattern"):
        target = TargetModel(tiny_family_model("qwen3_5", layers=5, kinds=OTHER_PATTERN))
        target.set_feature_layers([0, 4])
    else:
        target = TargetModel(tiny_family_model(request.param, layers=4))
        target.set_feature_layers([0, 3])  # a linear-attention layer and the full-attention one
    return target


def states(cache) -> list[torch.Tensor]:
    """Each linear-attention layer's convolution state (the last kernel-size inputs; the cache records more
    until the next forward starts) and recurrent state."""
    return [t for layer in cache.layers if hasattr(layer, "recurrent_states")
            for t in (layer.conv_states[0][..., -layer.conv_kernel_size[0]:], layer.recurrent_states[0])]


@pytest.mark.parametrize("keep", [0, 1, 3, 6])
def test_rollback_then_extend_matches_a_fresh_run(hybrid, keep):
    """Prompt, a 6-token verify, roll back to keep `keep` of it, go on: logits, features and states equal those
    of one forward over the committed tokens (0: none kept, 6: all). transformers runs the gated delta rule in
    float32 even in a float64 model, so they agree to float32 rounding (~5e-8 measured); without the rollback
    the logits are off by 0.1-0.2."""
    torch.manual_seed(keep)
    a, b, c = torch.randint(0, 96, (1, 7)), torch.randint(0, 96, (1, 6)), torch.randint(0, 96, (1, 4))
    cache = hybrid.new_cache()
    hybrid.forward(a, cache, 0)
    hybrid.forward(b, cache, 7)
    hybrid.rollback(cache, 7 + keep)
    assert cache.get_seq_length() == 7 + keep
    logits, feats = hybrid.forward(c, cache, 7 + keep)
    fresh = hybrid.new_cache()
    fresh_logits, fresh_feats = hybrid.forward(torch.cat([a, b[:, :keep], c], 1), fresh, 0)
    assert torch.allclose(logits, fresh_logits[:, 7 + keep:], atol=1e-6)
    assert torch.allclose(feats, fresh_feats[:, 7 + keep:], atol=1e-6)
    for mine, theirs in zip(states(cache), states(fresh)):
        assert torch.allclose(mine, theirs, atol=1e-6)


def test_rollback_to_zero_resets_and_past_the_last_forward_is_refused(hybrid):
    cache = hybrid.new_cache()
    hybrid.forward(torch.randint(0, 96, (1, 5)), cache, 0)
    hybrid.forward(torch.randint(0, 96, (1, 4)), cache, 5)
    with pytest.raises(ValueError, match="back to 3 tokens: its linear-attention states go back to 5 tokens at most"):
        hybrid.rollback(cache, 3)
    hybrid.rollback(cache, 0)
    ids = torch.randint(0, 96, (1, 6))
    logits, _ = hybrid.forward(ids, cache, 0)
    assert torch.allclose(logits, hybrid.forward(ids, hybrid.new_cache(), 0)[0], atol=1e-12)
    with pytest.raises(ValueError, match="must start at its cache's end \\(6 tokens\\), not at 4"):
        hybrid.forward(ids[:, :1], cache, 4)


def test_state_bytes_are_what_the_cache_holds(hybrid):
    cache = hybrid.new_cache()
    hybrid.forward(torch.randint(0, 96, (1, 9)), cache, 0)
    held = sum(t.numel() * t.element_size() for t in states(cache))
    config = hybrid.config_dict()
    # convolution states in the model's dtype (float64 here), recurrent states in float32
    assert held == linear_state_bytes(config, 8) > 0


def test_a_stateful_family_we_cannot_roll_back_is_refused_in_one_line():
    import transformers as tf

    config = tf.Lfm2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"])
    with pytest.raises(IncompatibleModelsError) as err:
        TargetModel(tf.Lfm2ForCausalLM(config))
    message = str(err.value)
    assert "\n" not in message and message.startswith("target architecture Lfm2ForCausalLM (lfm2) has layers with a "
                                                      "recurrent state (conv)")

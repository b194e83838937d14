import pytest
import torch

from blockdraft.errors import IncompatibleModelsError
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_hf_model


def test_captured_features_are_the_selected_layer_outputs(arch):
    model = tiny_hf_model(arch, layers=6)
    target = TargetModel(model)
    target.set_feature_layers([4, 1, 2])
    ids = torch.randint(0, 96, (1, 11))
    logits, feats = target.forward(ids, target.new_cache(), 0)
    ref = model(ids, output_hidden_states=True)
    expected = torch.cat([ref.hidden_states[i + 1] for i in (4, 1, 2)], dim=-1)
    assert torch.allclose(feats, expected, atol=1e-12)
    assert torch.allclose(logits, ref.logits, atol=1e-12)


def test_last_only_and_no_features():
    target = TargetModel(tiny_hf_model("qwen3"))
    target.set_feature_layers([1])
    ids = torch.randint(0, 96, (1, 7))
    logits, feats = target.forward(ids, target.new_cache(), 0, features=False, last_only=True)
    assert logits.shape == (1, 1, 96) and feats is None


def test_rollback_then_extend_matches_a_fresh_run(arch):
    model = tiny_hf_model(arch)
    target = TargetModel(model)
    target.set_feature_layers([0, 2])
    a, b, c = torch.randint(0, 96, (1, 6)), torch.randint(0, 96, (1, 5)), torch.randint(0, 96, (1, 4))
    cache = target.new_cache()
    target.forward(a, cache, 0)
    target.forward(b, cache, 6)
    target.rollback(cache, 8)  # keep a + the first two of b
    assert cache.get_seq_length() == 8
    logits, feats = target.forward(c, cache, 8)
    fresh_logits, fresh_feats = target.forward(torch.cat([a, b[:, :2], c], 1), target.new_cache(), 0)
    assert torch.allclose(logits, fresh_logits[:, 8:], atol=1e-12)
    assert torch.allclose(feats, fresh_feats[:, 8:], atol=1e-12)
    target.rollback(cache, 100)  # longer than the cache: nothing to drop
    assert cache.get_seq_length() == 12


def test_layer_ids_must_exist():
    target = TargetModel(tiny_hf_model("llama", layers=4))
    with pytest.raises(IncompatibleModelsError, match="target layer id 4 does not exist"):
        target.set_feature_layers([1, 4])


def test_embedding_and_head_are_the_targets_own():
    model = tiny_hf_model("qwen3", tied=True)
    target = TargetModel(model)
    assert target.embedding.weight is model.get_input_embeddings().weight
    assert target.lm_head.weight.data_ptr() == target.embedding.weight.data_ptr()
    assert not any(p.requires_grad for p in model.parameters())


def _sliding_qwen2(window: int | None):
    import transformers as tf

    cfg = tf.Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         use_sliding_window=window is not None, sliding_window=window, max_window_layers=2,
                         rope_theta=10000.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    return tf.Qwen2ForCausalLM(cfg).double().eval()


def test_a_sliding_window_target_decodes_past_its_window_on_the_hf_path():
    """Speculation rolls the cache back every cycle; sliding-window layers must still give generate()'s tokens
    once the context is longer than the window (transformers' sliding cache cannot be cropped there)."""
    from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
    from blockdraft.decoding.stats import GenerationStats
    from blockdraft.modeling.fast_target import supports_fast_path
    from tests.conftest import tiny_drafter

    model = _sliding_qwen2(window=8)
    assert not supports_fast_path(model) and "sliding_attention" in model.config.layer_types
    prompt = [5, 6, 7, 8, 9]
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)[0, len(prompt):].tolist()
    full = _sliding_qwen2(window=None)
    full.load_state_dict(model.state_dict())
    unwindowed = full.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)[0, len(prompt):].tolist()
    assert unwindowed != expected  # the window changes the answer: the comparison below sees it
    target = TargetModel(model)
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=4))
    for options in (DecodeOptions(max_new_tokens=30), DecodeOptions(max_new_tokens=30, no_draft=True)):
        stats = GenerationStats(1)
        assert [t for chunk in engine.decode(prompt, options, stats) for t in chunk] == expected

"""An exported folder against vLLM's DFlash loader, rule by rule (tests/export/engines.py names each source file)."""
import pytest

from blockdraft.modeling.checkpoint import read_config
from blockdraft.modeling.export import engine_problems
from tests.export import engines as E
from tests.export.conftest import read


def test_architecture_is_the_registered_drafter(exported):
    """VLLM_REGISTRY: "DFlashDraftModel" -> qwen3_dflash.DFlashQwen3ForCausalLM; VLLM_SPEC wraps it for
    method "dflash" (we never ship auto_map or remote code)."""
    config, _ = read(exported)
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert "auto_map" not in config


def test_every_tensor_lands_in_a_parameter_of_its_shape(exported):
    """VLLM_MODEL load_weights: 'model.' prefix, q/k/v -> qkv_proj and gate/up -> gate_up_proj stacking; the
    stacked shapes are those DFlashQwen3Model builds, and nothing is missing or left over."""
    config, shapes = read(exported)
    assert E.stack(E.vllm_load(shapes)) == E.vllm_params(E.hf_view(config))


def test_the_aux_layers_are_our_feature_layers_and_fill_fc(exported):
    """VLLM_AUX: target_layer_ids + 1 are captured; VLLM_CAPTURE: as the input of those layers, in layer order;
    the result is our ids in our order, and fc takes layers x hidden inputs."""
    config, _ = read(exported)
    ours = read_config(exported)
    assert E.captured_layers(E.vllm_aux_layers(config), ours.num_target_layers) == ours.target_layer_ids
    assert E.vllm_params(config)["model.fc.weight"] == (ours.hidden_size, ours.num_features * ours.hidden_size)


def test_attention_of_each_layer_is_ours(exported):
    """VLLM_MODEL _resolve_layer_attention / _dflash_layer_causal on the config as transformers loads it."""
    view = E.hf_view(read(exported)[0])
    ours = read_config(exported)
    for i in range(ours.num_hidden_layers):
        assert (E.vllm_layer_window(view, i), E.vllm_layer_causal(view, i)) == (ours.layer_window(i),
                                                                                 ours.layer_causal(i)), i


def test_rope_base_is_found_in_both_spellings(exported, tiny_target):
    """VLLM_ROPE: rope_parameters.rope_theta, else 1e6 (set_default_rope_theta); we write it and rope_theta."""
    ours = read_config(exported)
    assert ours.rope_theta == tiny_target.config.rope_parameters["rope_theta"] != E.DEFAULT_ROPE_THETA
    assert E.rope_bases(read(exported)[0]) == {"rope_parameters": ours.rope_theta, "rope_theta": ours.rope_theta}


def test_mask_and_vocabulary_fit_the_target(exported, tiny_target):
    """VLLM_MODEL: the mask id is dflash_config.mask_token_id; draft_vocab_size (default vocab_size) equal to
    the target's vocabulary means no draft-to-target map (d2t) is expected in the weights."""
    config, shapes = read(exported)
    assert 0 <= config["dflash_config"]["mask_token_id"] < tiny_target.vocab_size
    assert config.get("draft_vocab_size", config["vocab_size"]) == tiny_target.vocab_size
    assert not any(k in name for name in shapes for k in ("d2t", "t2d", "lm_head", "embed_tokens", "mask_hidden"))


@pytest.mark.parametrize("ids, captured", [([2, 0], [0, 2]), ([0, 3], [0])])
def test_the_rules_see_what_export_refuses(exported, ids, captured):
    """Unsorted ids come back sorted; the last target layer has no successor to capture it: vLLM would feed fc
    other features than ours, and engine_problems says so."""
    ours = read_config(exported)
    config = dict(read(exported)[0], dflash_config=dict(read(exported)[0]["dflash_config"], target_layer_ids=ids))
    assert E.captured_layers(E.vllm_aux_layers(config), ours.num_target_layers) == captured != ids
    ours.target_layer_ids = ids
    assert engine_problems(ours, "vllm")

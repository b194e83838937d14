import json

import pytest

from blockdraft.errors import CheckpointError, InvalidArgumentError
from blockdraft.modeling.config import DrafterConfig, default_target_layer_ids

# The shape of the published z-lab Qwen3-8B drafter config.json (values as published, abridged).
PUBLISHED_QWEN3_8B = {
    "architectures": ["DFlashDraftModel"],
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "attention_bias": False, "attention_dropout": 0.0, "block_size": 16,
    "bos_token_id": 151643, "eos_token_id": 151645,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "dtype": "bfloat16", "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288,
    "layer_types": ["full_attention"] * 5, "max_position_embeddings": 40960, "max_window_layers": 5,
    "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 5, "num_key_value_heads": 8,
    "num_target_layers": 36, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_paper_layer_ids():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(36, 1) == [18]
    for depth in range(5, 80):
        for k in range(1, 9):
            ids = default_target_layer_ids(depth, k)
            assert len(ids) == k and all(0 <= i < depth for i in ids) and ids == sorted(ids)


def test_parse_published_config():
    cfg = DrafterConfig.from_dict(PUBLISHED_QWEN3_8B)
    assert cfg.mask_token_id == 151669 and cfg.target_layer_ids == [1, 9, 17, 25, 33]
    assert cfg.block_size == 16 and cfg.num_target_layers == 36 and cfg.num_features == 5
    assert cfg.extra["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    out = cfg.to_dict()
    assert out["architectures"] == ["DFlashDraftModel"] and out["model_type"] == "qwen3"
    assert out["dflash_config"] == {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}
    for key, value in PUBLISHED_QWEN3_8B.items():
        if key != "dtype":  # a property of the saved weights: written by save_drafter
            assert out[key] == value, key
    assert DrafterConfig.from_dict(json.loads(json.dumps(out))) == cfg


def test_sliding_layers_and_causality():
    d = dict(PUBLISHED_QWEN3_8B, layer_types=["sliding_attention"] * 4 + ["full_attention"], sliding_window=2048,
             use_sliding_window=True)
    cfg = DrafterConfig.from_dict(d)
    assert [cfg.layer_window(i) for i in range(5)] == [2048] * 4 + [None]
    assert [cfg.layer_causal(i) for i in range(5)] == [True] * 4 + [False]


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["DFlash2DraftModel"]}, "DFlash2DraftModel"),
    ({"dflash_config": {"target_layer_ids": [1]}}, "mask_token_id"),
    ({"num_target_layers": 30}, "target_layer_ids has 33"),
    ({"vocab_size": 1000}, "mask_token_id=151669"),
    ({"block_size": 1}, "block_size=1"),
    ({"sliding_window": 0, "use_sliding_window": True}, "sliding_window=0"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "yarn"),
])
def test_bad_configs_name_the_value(change, message):
    with pytest.raises((CheckpointError, InvalidArgumentError), match=message):
        DrafterConfig.from_dict(dict(PUBLISHED_QWEN3_8B, **change))


def test_sliding_window_flag_round_trips_for_hf_vllm_sglang():
    d = dict(PUBLISHED_QWEN3_8B, layer_types=["sliding_attention"] * 4 + ["full_attention"], sliding_window=512,
             use_sliding_window=True)
    out = DrafterConfig.from_dict(d).to_dict()
    assert out["use_sliding_window"] is True and out["sliding_window"] == 512
    off = DrafterConfig.from_dict(dict(d, use_sliding_window=False))  # how Qwen3Config reads it: no window
    assert off.layer_window(0) is None and off.layer_causal(0) is True
    assert off.to_dict()["use_sliding_window"] is False


def test_rope_parameters_layout_keeps_its_scaling():
    d = dict(PUBLISHED_QWEN3_8B, rope_scaling=None)
    d.pop("rope_theta")
    d["rope_parameters"] = {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5}
    cfg = DrafterConfig.from_dict(d)
    assert cfg.rope_theta == 5e5 and cfg.rope_scaling == {"rope_type": "linear", "factor": 4.0}

import json

import pytest
import torch
from safetensors.torch import save_file

import blockdraft.modeling.checkpoint as ckpt
from blockdraft.errors import CheckpointError
from blockdraft.modeling.checkpoint import load_drafter, save_drafter
from blockdraft.modeling.config import DrafterConfig
from blockdraft.modeling.drafter import DraftCache, Drafter
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_drafter, tiny_hf_model
from tests.modeling.test_config import PUBLISHED_QWEN3_8B


def _outputs(drafter, target, n=9):
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(1, n, drafter.config.num_features * target.hidden_size, generator=g, dtype=target.dtype)
    block = target.embedding(torch.randint(0, target.vocab_size, (1, drafter.config.block_size), generator=g))
    return drafter.logits(drafter.draft(block, n, feats, DraftCache(len(drafter.layers))), target.lm_head)


def test_round_trip_gives_identical_logits(tmp_path):
    target = TargetModel(tiny_hf_model("llama"))
    drafter = tiny_drafter(target, layers=2)
    save_drafter(drafter, tmp_path / "d")
    loaded = load_drafter(tmp_path / "d", dtype=torch.float64)
    assert loaded.config == drafter.config
    assert torch.equal(_outputs(drafter, target), _outputs(loaded, target))
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["config.json", "model.safetensors"]


def test_loads_a_folder_laid_out_like_the_published_qwen3_8b_drafter(tmp_path):
    """Same config fields and tensor names as z-lab/Qwen3-8B-DFlash-b16, at tiny width."""
    config = dict(PUBLISHED_QWEN3_8B, hidden_size=64, intermediate_size=96, head_dim=16, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=200, num_target_layers=36,
                  dflash_config={"mask_token_id": 199, "target_layer_ids": [1, 9, 17, 25, 33]})
    folder = tmp_path / "z-lab"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(3)
    tensors = {"fc.weight": torch.randn(64, 5 * 64, generator=g), "hidden_norm.weight": torch.randn(64, generator=g),
               "norm.weight": torch.randn(64, generator=g),
               "embed_tokens.weight": torch.randn(200, 64, generator=g)}  # early drafters carried it: ignored
    for i in range(5):
        p = f"layers.{i}."
        for name, shape in [("self_attn.q_proj", (64, 64)), ("self_attn.k_proj", (32, 64)),
                            ("self_attn.v_proj", (32, 64)), ("self_attn.o_proj", (64, 64)),
                            ("mlp.gate_proj", (96, 64)), ("mlp.up_proj", (96, 64)), ("mlp.down_proj", (64, 96))]:
            tensors[p + name + ".weight"] = torch.randn(*shape, generator=g)
        for name in ("self_attn.q_norm", "self_attn.k_norm"):
            tensors[p + name + ".weight"] = torch.randn(16, generator=g)
        for name in ("input_layernorm", "post_attention_layernorm"):
            tensors[p + name + ".weight"] = torch.randn(64, generator=g)
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    drafter = load_drafter(folder, dtype=torch.float32)
    assert drafter.config.target_layer_ids == [1, 9, 17, 25, 33] and drafter.config.block_size == 16
    state = drafter.state_dict()
    assert "embed_tokens.weight" not in state
    assert torch.equal(state["layers.3.self_attn.k_proj.weight"], tensors["layers.3.self_attn.k_proj.weight"]
                       .to(torch.bfloat16).float())
    # ...and we write exactly that layout back.
    save_drafter(drafter, tmp_path / "ours", dtype=torch.bfloat16)
    ours = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert {k: ours[k] for k in config} == dict(config, dtype="bfloat16")
    from safetensors import safe_open
    with safe_open(str(tmp_path / "ours" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(tensors) - {"embed_tokens.weight"}


def test_save_is_atomic(tmp_path, monkeypatch):
    target = TargetModel(tiny_hf_model("qwen3"))
    first = tiny_drafter(target, seed=1)
    save_drafter(first, tmp_path / "d")
    before = (tmp_path / "d" / "model.safetensors").read_bytes()

    def crash(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(ckpt, "save_file", crash)
    with pytest.raises(OSError):
        save_drafter(tiny_drafter(target, seed=2), tmp_path / "d")
    assert (tmp_path / "d" / "model.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temp folder left behind


def _bad_folder(tmp_path, kind):
    target = TargetModel(tiny_hf_model("qwen3"))
    folder = save_drafter(tiny_drafter(target), tmp_path / "d")
    if kind == "no-config":
        (folder / "config.json").unlink()
    elif kind == "bad-json":
        (folder / "config.json").write_text("{not json")
    elif kind == "pickle":
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    elif kind == "truncated":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif kind == "shape":
        cfg = json.loads((folder / "config.json").read_text())
        cfg["intermediate_size"] += 1
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("kind, message", [
    ("no-config", "no config.json"), ("bad-json", "unreadable JSON"), ("pickle", "pickle"),
    ("truncated", "unreadable safetensors"), ("shape", "has shape"),
])
def test_unreadable_checkpoints_are_clear_errors(tmp_path, kind, message):
    with pytest.raises(CheckpointError, match=message):
        load_drafter(_bad_folder(tmp_path, kind))


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_drafter(tmp_path / "nowhere")


def test_config_for_target_follows_the_target():
    target = TargetModel(tiny_hf_model("qwen2", layers=8))
    cfg = DrafterConfig.for_target(target.config_dict(), mask_token_id=5, num_layers=3)
    assert cfg.hidden_size == 32 and cfg.num_target_layers == 8 and cfg.target_layer_ids == [1, 3, 5]
    assert Drafter(cfg).fc.in_features == 3 * 32

import pytest
import torch
from transformers import DynamicCache

from blockdraft.modeling.target import TargetModel
from blockdraft.train.trainer import new_drafter
from tests.conftest import tiny_hf_model


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_drafter_starts_as_the_targets_last_layers(arch):
    model = tiny_hf_model(arch, layers=4)
    target = TargetModel(model)
    drafter = new_drafter(target, num_layers=1, block_size=4, mask_token_id=95, target_layer_ids=[0, 2], seed=0,
                          from_target=True).double()
    last = model.get_decoder().layers[-1]
    assert torch.equal(drafter.layers[0].mlp.down_proj.weight, last.mlp.down_proj.weight)
    assert torch.equal(drafter.norm.weight, model.get_decoder().norm.weight)
    if arch == "llama":  # no per-head norms in the target: they start as identity scales
        assert torch.equal(drafter.layers[0].self_attn.k_norm.weight, torch.ones(8, dtype=torch.float64))
        return
    # the context keys/values the drafter computes from layer 2's output are the target's last layer's own
    ids = torch.randint(0, 96, (1, 9))
    cache = DynamicCache(config=model.config)
    target.set_feature_layers([0, 2])
    with torch.no_grad():
        _, feats = target.forward(ids, cache, 0)
    with torch.no_grad():
        k, v = drafter.context_kv(feats.clone(), torch.arange(9)[None])[0]
    assert torch.allclose(k, cache.layers[-1].keys, atol=1e-10) and torch.allclose(v, cache.layers[-1].values, atol=1e-10)

"""The training forward must compute exactly what the inference engine computes for the same block."""
import pytest
import torch

from blockdraft.modeling.drafter import DraftCache
from blockdraft.modeling.target import TargetModel
from blockdraft.train.data import Sequence
from blockdraft.train.features import OnlineFeatures
from blockdraft.train.trainer import block_logits
from tests.conftest import tiny_drafter, tiny_hf_model


@pytest.mark.parametrize("sliding", [None, 3])
def test_training_block_logits_equal_engine_draft_logits(arch, sliding):
    target = TargetModel(tiny_hf_model(arch, tied=True))
    drafter = tiny_drafter(target, layers=2, block_size=5, sliding_window=sliding)
    target.set_feature_layers(drafter.config.target_layer_ids)
    g = torch.Generator().manual_seed(0)
    seqs = [Sequence("a", torch.randint(0, 95, (23,), generator=g), torch.ones(23, dtype=torch.bool)),
            Sequence("b", torch.randint(0, 95, (15,), generator=g), torch.ones(15, dtype=torch.bool))]
    anchors = [torch.tensor([0, 3, 4, 11, 21]), torch.tensor([2, 13])]  # dense, overlapping, near the end
    feats = [OnlineFeatures(target)(s) for s in seqs]
    train_logits, blocks = block_logits(drafter, target, seqs, feats, anchors)
    B = drafter.config.block_size
    for i, (seq, a) in enumerate(zip(seqs, anchors)):
        for n, p in enumerate(a.tolist()):
            ids = torch.full((1, B), drafter.config.mask_token_id)
            ids[0, 0] = seq.input_ids[p]
            hidden = drafter.draft(target.embedding(ids), p, feats[i][None, :p], DraftCache(2))
            engine = drafter.logits(hidden, target.lm_head)[0]
            assert torch.allclose(train_logits[i, n * B:(n + 1) * B], engine, atol=1e-10), (i, p)


def test_tied_targets_use_their_real_head():
    target = TargetModel(tiny_hf_model("llama", tied=True))
    drafter = tiny_drafter(target)
    hidden = torch.randn(3, target.hidden_size, dtype=torch.float64)
    assert torch.equal(drafter.logits(hidden, target.lm_head), hidden @ target.embedding.weight.T)


@pytest.mark.parametrize("sliding", [None, 3])
@pytest.mark.parametrize("attention", ["flex", "grouped"])
def test_flex_and_grouped_masks_give_the_dense_results(sliding, attention, monkeypatch):
    target = TargetModel(tiny_hf_model("qwen3"))
    drafter = tiny_drafter(target, layers=2, block_size=4, sliding_window=sliding)
    target.set_feature_layers(drafter.config.target_layer_ids)
    g = torch.Generator().manual_seed(1)
    seqs = [Sequence(str(i), torch.randint(0, 95, (n,), generator=g), torch.ones(n, dtype=torch.bool))
            for i, n in enumerate((19, 12))]
    anchors = [torch.tensor([0, 5, 6, 15]), torch.tensor([3, 4])]
    feats = [OnlineFeatures(target)(s) for s in seqs]
    monkeypatch.setattr("blockdraft.train.blocks.GROUPS", 3)  # runs of 1, 2 and 1 blocks
    if attention == "flex":
        with torch.no_grad():  # flex_attention has no CPU backward; on CPU it only serves this check
            dense, _ = block_logits(drafter, target, seqs, feats, anchors, attention="sdpa")
            other, _ = block_logits(drafter, target, seqs, feats, anchors, attention=attention)
        assert torch.allclose(dense, other, atol=1e-8)
        return
    grads = []
    for kind in ("sdpa", attention):
        drafter.zero_grad()
        logits, _ = block_logits(drafter, target, seqs, feats, anchors, attention=kind)
        logits.square().mean().backward()
        grads.append([p.grad.clone() for p in drafter.parameters()])
        if kind == "sdpa":
            dense = logits.detach()
    assert torch.allclose(dense, logits, atol=1e-10)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(*grads))  # the backward too

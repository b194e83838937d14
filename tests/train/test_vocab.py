import pytest
import torch

from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.target import TargetModel
from blockdraft.train.blocks import IGNORE, sample_anchors
from blockdraft.train.data import Sequence
from blockdraft.train.features import OnlineFeatures
from blockdraft.train.trainer import block_logits, new_drafter
from blockdraft.train.vocab import TrainVocab
from tests.conftest import tiny_hf_model


def _seqs() -> list[Sequence]:
    ids = torch.tensor([5, 6, 7, 8, 9, 7, 8, 9, 40, 41])
    mask = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.bool)  # 40, 41 are prompt tokens only
    return [Sequence("a", ids, mask)]


def test_core_is_the_label_tokens_and_negatives_are_drawn_per_step_reproducibly():
    vocab = TrainVocab(_seqs(), vocab_size=96, negatives=10, seed=3)
    assert vocab.core.tolist() == [7, 8, 9]
    r1, r1_again, r2 = vocab.rows(1), TrainVocab(_seqs(), 96, 10, 3).rows(1), vocab.rows(2)
    assert r1.tolist() == r1_again.tolist() and r1.tolist() != r2.tolist()
    assert r1[:3].tolist() == [7, 8, 9] and len(set(r1.tolist())) == 13 and not set(r1[3:].tolist()) & {7, 8, 9}
    assert TrainVocab(_seqs(), 96, 1000, 0).rows(0).numel() == 96  # negatives capped by what is left
    with pytest.raises(InvalidArgumentError, match="vocab negatives=-1: expected >= 0"):
        TrainVocab(_seqs(), 96, -1, 0)


def test_remap_points_into_rows_and_drops_tokens_outside():
    vocab = TrainVocab(_seqs(), vocab_size=96, negatives=0, seed=0)
    rows = vocab.rows(0)
    labels = torch.tensor([[IGNORE, 9, 7, 50, 8]])
    assert vocab.remap(labels, rows).tolist() == [[IGNORE, 2, 0, IGNORE, 1]]


def test_sub_vocabulary_logits_are_columns_of_the_full_logits():
    torch.manual_seed(0)
    target = TargetModel(tiny_hf_model("qwen3", dtype=torch.float32))
    drafter = new_drafter(target, num_layers=1, block_size=4, mask_token_id=95, target_layer_ids=[1], seed=0)
    target.set_feature_layers([1])
    seqs = _seqs()
    feats = [OnlineFeatures(target)(s) for s in seqs]
    anchors = [sample_anchors(s.loss_mask, 4, torch.Generator().manual_seed(0)) for s in seqs]
    rows = TrainVocab(seqs, 96, 5, 0).rows(7)
    with torch.no_grad():
        full, _ = block_logits(drafter, target, seqs, feats, anchors)
        sub, _ = block_logits(drafter, target, seqs, feats, anchors, rows=rows)
    assert sub.shape[-1] == 8
    assert torch.allclose(sub, full[..., rows], atol=1e-5)


def test_extra_ids_join_the_rows_once():
    seqs = [Sequence("a", torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 1, 1]).bool())]
    vocab = TrainVocab(seqs, vocab_size=10, negatives=2, seed=0)
    base = vocab.rows(5)
    rows = vocab.rows(5, torch.tensor([[2, 9], [9, 0]]))
    assert rows[: base.numel()].tolist() == base.tolist()  # the same step's rows first, in order
    assert sorted(rows.tolist()) == sorted(set(rows.tolist())) and {0, 9} <= set(rows.tolist())

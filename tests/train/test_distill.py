import math

import pytest
import torch

from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.target import TargetModel
from blockdraft.train.blocks import IGNORE
from blockdraft.train.data import Sequence
from blockdraft.train.distill import TeacherTopK, block_soft_targets, soft_log_likelihood, teacher_topk
from blockdraft.train.features import CachedFeatures, OnlineFeatures, build_feature_cache
from blockdraft.train.loss import block_loss
from blockdraft.train.trainer import TrainConfig, Trainer, new_drafter
from tests.conftest import tiny_hf_model


def test_teacher_topk_keeps_the_largest_probabilities():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]]))
    top = teacher_topk(logits, 2)
    assert top.ids.tolist() == [[1, 2], [0, 2]]
    assert torch.allclose(top.probs, torch.tensor([[0.6, 0.3], [0.5, 0.3]]))


def test_slot_targets_come_from_the_position_before_the_label():
    probs = torch.arange(5.0)[:, None].expand(5, 2)  # position t holds the value t
    teacher = TeacherTopK(probs, torch.arange(5)[:, None].expand(5, 2))
    positions = torch.tensor([[2, 3, 4, 5]])  # a block anchored at 2, running past the end (T = 5)
    p, ids = block_soft_targets([teacher], positions)
    assert p[0, :, 0].tolist() == [1.0, 2.0, 3.0, 4.0] and ids[0, :, 0].tolist() == [1, 2, 3, 4]


def test_soft_log_likelihood_by_hand_renormalises_over_scored_ids():
    logp = torch.log_softmax(torch.tensor([1.0, 2.0, 0.5]), -1)
    got = soft_log_likelihood(logp, torch.tensor([0.5, 0.3, 0.2]), torch.tensor([1, IGNORE, 2]))
    expected = (0.5 * logp[1] + 0.2 * logp[2]) / 0.7  # the unscored token's mass is dropped, the rest renormalised
    assert math.isclose(got.item(), expected.item(), rel_tol=1e-6)


def test_a_one_hot_teacher_on_the_label_gives_the_hard_loss():
    torch.manual_seed(0)
    logits, labels = torch.randn(1, 8, 7), torch.tensor([[IGNORE, 3, 1, 6, IGNORE, 2, IGNORE, 0]])
    probs = torch.zeros(1, 8, 3)
    probs[..., 0] = 1.0
    ids = torch.stack([labels.clamp_min(0), torch.full_like(labels, 4), torch.full_like(labels, 5)], -1)
    hard = block_loss(logits, labels, 4, gamma=7.0, kind="acceptance")
    for alpha in (0.5, 1.0):
        soft = block_loss(logits, labels, 4, gamma=7.0, kind="acceptance", soft=(probs, ids), alpha=alpha)
        assert torch.allclose(soft.loss, hard.loss)
    spread = probs.clone()
    spread[..., :] = torch.tensor([0.6, 0.2, 0.2])  # the teacher puts mass elsewhere: a different loss
    assert not torch.allclose(block_loss(logits, labels, 4, gamma=7.0, soft=(spread, ids), alpha=0.5).loss,
                              hard.loss)


def test_online_teacher_is_the_targets_own_distribution_once_per_forward():
    target = TargetModel(tiny_hf_model("qwen3", dtype=torch.float32))
    target.set_feature_layers([0, 2])
    seq = Sequence("a", torch.randint(0, 96, (9,)), torch.ones(9, dtype=torch.bool))
    plain, teaching = OnlineFeatures(target), OnlineFeatures(target, teacher_k=5)
    assert torch.equal(plain(seq), teaching(seq))
    top = teaching.teacher(seq)
    logits, _ = target.forward(seq.input_ids[None], target.new_cache(), 0, features=False)
    want = torch.softmax(logits[0], -1).topk(5, -1)
    assert torch.equal(top.ids, want.indices) and torch.allclose(top.probs, want.values)
    with pytest.raises(InvalidArgumentError, match="no teacher distribution for 'a'"):
        teaching.teacher(seq)
    with pytest.raises(InvalidArgumentError, match="teacher top-k=-1"):
        OnlineFeatures(target, teacher_k=-1)


def test_distillation_needs_online_features_with_a_teacher(tmp_path):
    target = TargetModel(tiny_hf_model("llama", dtype=torch.float32))
    drafter = new_drafter(target, num_layers=1, block_size=4, mask_token_id=95, target_layer_ids=[1], seed=0)
    target.set_feature_layers([1])
    seqs = [Sequence(f"s{i}", torch.randint(0, 95, (12,)), torch.ones(12, dtype=torch.bool)) for i in range(2)]
    build_feature_cache(target, seqs, tmp_path / "f")
    cfg = TrainConfig(out=str(tmp_path / "run"), distill=0.5)
    for features in (OnlineFeatures(target), CachedFeatures(tmp_path / "f", [1])):
        with pytest.raises(InvalidArgumentError, match=r"distill=0.5: expected .* \(--features online\)"):
            Trainer(cfg, target, drafter, seqs, features)
    with pytest.raises(InvalidArgumentError, match="distill=1.5"):
        Trainer(TrainConfig(out=str(tmp_path / "run"), distill=1.5, distill_topk=4), target, drafter, seqs,
                OnlineFeatures(target, teacher_k=4))
    with pytest.raises(InvalidArgumentError, match="teacher's top-16"):  # the features keep another k
        Trainer(cfg, target, drafter, seqs, OnlineFeatures(target, teacher_k=4))
    with pytest.raises(InvalidArgumentError, match="top-4 but distill=0"):  # would keep teachers nobody takes
        Trainer(TrainConfig(out=str(tmp_path / "run")), target, drafter, seqs, OnlineFeatures(target, teacher_k=4))

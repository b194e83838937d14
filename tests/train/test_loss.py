import math

import torch

from blockdraft.train.blocks import IGNORE
from blockdraft.train.loss import block_loss, default_gamma, estimated_acceptance_length, slot_weights


def test_paper_gammas_and_weights():
    assert (default_gamma(16), default_gamma(10), default_gamma(8)) == (7.0, 5.0, 4.0)
    w = slot_weights(4, 7.0)
    assert w[0] == 0 and torch.allclose(w[1:], torch.tensor([1.0, math.exp(-1 / 7), math.exp(-2 / 7)]))


def test_weighted_cross_entropy_by_hand():
    logits = torch.randn(1, 4, 5)
    labels = torch.tensor([[IGNORE, 2, IGNORE, 4]])
    out = block_loss(logits, labels, 4, gamma=2.0)
    logp = torch.log_softmax(logits, -1)[0]
    w1, w3 = 1.0, math.exp(-1.0)
    expected = -(w1 * logp[1, 2] + w3 * logp[3, 4]) / (w1 + w3)
    assert torch.allclose(out.loss, expected)


def test_metrics_count_leading_correct_slots():
    labels = torch.tensor([[IGNORE, 1, 2, 3, IGNORE, 1, 2, 3]])
    logits = torch.full((1, 8, 5), -10.0)
    for i, tok in enumerate([0, 1, 2, 0, 0, 1, 4, 3]):  # block 0: right, right, wrong; block 1: right, wrong, right
        logits[0, i, tok] = 10.0
    out = block_loss(logits, labels, 4, gamma=7.0)
    assert out.slot_accuracy.tolist() == [1.0, 0.5, 0.5]
    assert out.accepted_prefix.item() == 3 and out.blocks.item() == 2
    assert estimated_acceptance_length(3, 2) == 2.5


def test_acceptance_loss_moves_weight_to_slots_after_right_ones():
    labels = torch.tensor([[IGNORE, 1, 2, 3]])
    good_first = torch.zeros(1, 4, 5)
    good_first[0, 1, 1] = 20.0  # slot 1 sure and right
    bad_first = torch.zeros(1, 4, 5)
    bad_first[0, 1, 0] = 20.0   # slot 1 sure and wrong
    grad = []
    for base in (good_first, bad_first):
        x = base.clone().requires_grad_(True)
        block_loss(x, labels, 4, gamma=7.0, kind="acceptance").loss.backward()
        grad.append(x.grad[0, 2].abs().sum().item())
    assert grad[0] > 3 * grad[1]  # slot 2 matters only when slot 1 is right

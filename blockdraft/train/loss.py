"""Drafter losses and training metrics over anchored blocks.

`decay` (the paper): cross-entropy of slot k >= 1 weighted by w_k = exp(-(k-1)/gamma), normalised by the
sum of the weights of the supervised slots.
`acceptance` (ours): slot k's weight is also multiplied by the drafter's own (detached) probability that all
earlier slots of the block are right, i.e. by how much slot k can still add to the acceptance length
(a floor keeps late slots learning before early ones are good). It spends the gradient where tokens are
actually accepted.
Either can add a distillation term (`soft`, weight `alpha`): see `blockdraft.train.distill`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from blockdraft.train.blocks import IGNORE
from blockdraft.train.distill import soft_log_likelihood

LOSSES = ("decay", "acceptance")
DEFAULT_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    """The paper's decay: 7 for B=16, 5 for B=10, 4 for B=8 (interpolated elsewhere)."""
    return DEFAULT_GAMMA.get(block_size, max(1.0, 0.45 * block_size))


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """(B,) weights: 0 for the anchor slot, exp(-(k-1)/gamma) for slot k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


@dataclass
class LossOutput:
    loss: torch.Tensor
    slot_accuracy: torch.Tensor    # (B-1,) argmax accuracy of slots 1..B-1 over supervised slots
    slot_counts: torch.Tensor      # (B-1,) supervised slots counted
    accepted_prefix: torch.Tensor  # () sum over blocks of leading correct slots
    blocks: torch.Tensor           # () number of blocks with a supervised slot 1


def block_loss(logits: torch.Tensor, labels: torch.Tensor, block_size: int, *, gamma: float,
               kind: str = "decay", floor: float = 0.1,
               soft: tuple[torch.Tensor, torch.Tensor] | None = None, alpha: float = 0.0) -> LossOutput:
    """logits (b, N*B, V), labels (b, N*B) -> weighted loss and metrics.

    soft: the teacher's (probs, ids), each (b, N*B, k), ids indexing the V logits (< 0: not scored);
    each slot's term is then (1 - alpha) x the label's log-likelihood + alpha x the teacher's.
    """
    b, nb, vocab = logits.shape
    B = block_size
    logits = logits.view(b, nb // B, B, vocab).float()
    labels = labels.view(b, nb // B, B)
    supervised = labels != IGNORE
    safe = labels.clamp_min(0)
    logp = F.log_softmax(logits, dim=-1)
    token_logp = logp.gather(-1, safe[..., None])[..., 0]  # (b, N, B)
    w = slot_weights(B, gamma).to(logits.device).expand_as(token_logp)
    if kind == "acceptance":
        p_right = token_logp.detach().exp() * supervised
        p_right[..., 0] = 1.0  # the anchor slot is given
        before = torch.cumprod(torch.cat([torch.ones_like(p_right[..., :1]), p_right[..., :-1]], -1), -1)
        w = w * (floor + (1 - floor) * before)
    elif kind != "decay":
        raise ValueError(f"loss kind {kind!r}: expected one of {LOSSES}")
    w = w * supervised
    term = token_logp
    if soft is not None and alpha:
        probs, ids = (t.view(b, nb // B, B, -1) for t in soft)
        term = (1 - alpha) * token_logp + alpha * soft_log_likelihood(logp, probs.to(logp.device), ids.to(logp.device))
    loss = -(w * term).sum() / w.sum().clamp_min(1e-9)

    with torch.no_grad():
        correct = (logits.argmax(-1) == labels) & supervised
        counts = supervised[..., 1:].sum((0, 1))
        accuracy = correct[..., 1:].sum((0, 1)) / counts.clamp_min(1)
        has_first = supervised[..., 1]
        prefix = torch.cumprod(correct[..., 1:].int(), dim=-1).sum(-1)  # leading correct slots per block
        accepted = (prefix * has_first).sum()
    return LossOutput(loss, accuracy, counts, accepted, has_first.sum())


def estimated_acceptance_length(accepted_prefix: float, blocks: float) -> float:
    """1 (the bonus) + mean leading-correct slots per block: what the engine would see at T = 0."""
    return 1.0 + accepted_prefix / blocks if blocks else math.nan

"""Distillation targets: the target's own next-token distribution, not only its greedy token.

The regenerated data holds the target's greedy answers, so a hard label is the argmax of the target's
distribution at that prefix. The distribution itself says more (which other tokens were close, how sure
the target was) and costs one LM-head pass over the sequence in the same forward that yields the features.
We keep its top-k per position: slot k of a block anchored at p learns the token at p + k, which the target
predicted at position p + k - 1, so the soft target of that slot is the teacher's top-k at p + k - 1.

    loss term of a slot = (1 - alpha) * -log q(label) + alpha * sum_j p_j * -log q(j)   (j over the top-k,
                                                                                          renormalised)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class TeacherTopK:
    """The target's top-k next-token distribution at every position of one sequence."""

    probs: torch.Tensor  # (T, k) probabilities, descending
    ids: torch.Tensor    # (T, k) vocabulary ids


def teacher_topk(logits: torch.Tensor, k: int) -> TeacherTopK:
    """logits (T, V) of the target over a sequence -> its top-k probabilities per position."""
    probs = F.softmax(logits.float(), dim=-1)
    top = probs.topk(k, dim=-1)
    return TeacherTopK(top.values, top.indices)


def block_soft_targets(teachers: list[TeacherTopK], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft targets of block slots: positions (b, N*B) -> probs, ids (b, N*B, k) from the teacher at pos - 1.

    Slots past a sequence's end get the last position's targets; their labels are ignored anyway."""
    probs, ids = [], []
    for teacher, pos in zip(teachers, positions):
        src = (pos - 1).clamp(0, teacher.probs.shape[0] - 1)
        probs.append(teacher.probs[src])
        ids.append(teacher.ids[src])
    return torch.stack(probs), torch.stack(ids)


def soft_log_likelihood(logp: torch.Tensor, probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """sum_j p_j log q(j) over the teacher's top-k, renormalised over the ids the drafter scores.

    logp (..., V') drafter log-probabilities; probs, ids (..., k) with ids < 0 where a teacher token is
    outside the scored sub-vocabulary (it is dropped)."""
    present = ids >= 0
    p = probs * present
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
    return (logp.gather(-1, ids.clamp_min(0)) * p).sum(-1)

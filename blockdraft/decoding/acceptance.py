"""Acceptance rules for verifying a drafted block against the target. Both are lossless.

Greedy (T = 0): accept the longest prefix where draft == target argmax; the bonus is the target argmax
at the first mismatch (or after the last draft).

Sampling (T > 0), standard speculative sampling: at draft position i with target distribution p_i and
draft distribution q_i (one-hot for greedy drafts), accept draft x_i iff u_i * q_i(x_i) < p_i(x_i),
i.e. with probability min(1, p/q); at the first rejection sample from max(p_i - q_i, 0) (renormalised);
if all are accepted, the bonus is sampled from p at the position after the last draft.
"""
from __future__ import annotations

import torch

from blockdraft.decoding.sampling import sample_index


def accepted_prefix(accept: torch.Tensor) -> int:
    """Length of the leading run of True in a 1-D bool tensor (the one host sync per cycle)."""
    return int(accept.to(torch.int32).cumprod(0).sum().item())


def greedy_verify(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """drafts (n,), target_logits (n+1, V) -> (accepted count a, bonus token)."""
    best = target_logits.argmax(-1)
    a = accepted_prefix(drafts == best[: drafts.shape[0]])
    return a, int(best[a].item())


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Unnormalised residual max(p - q, 0); falls back to p where it is all zero (p == q: never rejected)."""
    r = (p - q).clamp_min(0)
    return r if bool(r.sum() > 0) else p


def speculative_verify(drafts: torch.Tensor, q_draft: torch.Tensor, p: torch.Tensor,
                       u_accept: torch.Tensor, u_sample: torch.Tensor) -> tuple[int, int]:
    """Exact speculative sampling for one sequence.

    drafts (n,), q_draft (n, V) draft distributions (one-hot rows for greedy drafts), p (n+1, V) target
    distributions, u_accept (n,) and u_sample () uniforms in [0, 1). Returns (accepted count a, token),
    where token is the residual sample at the first rejection or the bonus sampled from p[n].
    """
    n = drafts.shape[0]
    idx = drafts[:, None]
    p_x = p[:n].gather(-1, idx)[:, 0]
    q_x = q_draft.gather(-1, idx)[:, 0]
    a = accepted_prefix(u_accept.double() * q_x.double() < p_x.double())  # float64: u near 1 must not round up
    weights = p[n] if a == n else residual(p[a], q_draft[a])
    return a, int(sample_index(weights, u_sample).item())


def one_hot(tokens: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Draft distribution of greedy drafts: rows (n, V) with a single 1."""
    return torch.zeros(tokens.shape[0], vocab, dtype=dtype, device=tokens.device).scatter_(
        -1, tokens[:, None], 1.0)

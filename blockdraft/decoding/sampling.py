"""Sampling parameters and the target/draft distributions they define.

Every random choice is made by inverse-CDF from an explicit uniform number, so the mapping
(probabilities, uniforms) -> token is a plain function that tests can check with exact arithmetic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from blockdraft.errors import InvalidArgumentError

DRAFT_MODES = ("sample", "greedy")
SAMPLERS = ("auto", "gumbel", "rejection")


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy. top_k 0 and top_p 1 disable truncation.

    `sampler` (temperature > 0): "auto" is "gumbel" for a request with a seed and "rejection" without one.
    "gumbel" samples every position by the Gumbel-max trick from noise keyed by
    (seed, absolute position) and accepts a draft iff it is the target's own choice (`blockdraft.decoding.gumbel`):
    with a seed the output is exactly plain decoding's with that seed, whatever the drafts were. "rejection"
    is standard speculative sampling: accept with min(1, p/q), resample from the residual (`acceptance`).
    Both sample exactly from the (truncated) target distribution.
    `draft`: with temperature > 0, "sample" draws drafts from the drafter's own distribution q (after the
    same temperature / top-k / top-p; with the gumbel sampler, from the same noise as the target); "greedy"
    proposes the drafter's argmax. Both are exact; "sample" usually accepts more.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    draft: str = "sample"
    sampler: str = "rejection"  # the engine-level default; the front ends default to "auto" (api.DEFAULT_SAMPLER)

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
            raise InvalidArgumentError(f"temperature={t!r}: expected a finite number >= 0")
        if not (isinstance(k, int) and k >= 0):
            raise InvalidArgumentError(f"top_k={k!r}: expected an integer >= 0 (0 disables it)")
        if not (isinstance(p, (int, float)) and 0 < p <= 1):
            raise InvalidArgumentError(f"top_p={p!r}: expected a number in (0, 1]")
        if self.seed is not None and not isinstance(self.seed, int):
            raise InvalidArgumentError(f"seed={self.seed!r}: expected an integer")
        if self.draft not in DRAFT_MODES:
            raise InvalidArgumentError(f"draft={self.draft!r}: expected one of {DRAFT_MODES}")
        if self.sampler not in SAMPLERS:
            raise InvalidArgumentError(f"sampler={self.sampler!r}: expected one of {SAMPLERS}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def gumbel(self) -> bool:
        """Whether sampling uses the gumbel sampler: asked for, or "auto" with a seed to keep."""
        return not self.greedy and (self.sampler == "gumbel" or (self.sampler == "auto" and self.seed is not None))


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distribution (..., V) after temperature, then top-k, then top-p (smallest set with mass >= top_p).

    Computed in float32 at least; truncated entries are exactly 0. Apply it to target AND draft logits.
    """
    scores = logits.float() / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop_sorted = sorted_p.cumsum(-1) - sorted_p >= params.top_p  # mass before this token already enough
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_index(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from unnormalised non-negative weights (..., V) with uniforms u (...) in [0, 1).

    Returns the first index whose cumulative weight exceeds u * total; zero-weight entries are never chosen.
    """
    cdf = weights.double().cumsum(-1)  # float64, as the uniforms: u near 1 must not round up to the total
    target = (u.double() * cdf[..., -1])[..., None]
    idx = torch.searchsorted(cdf, target, right=True)[..., 0]
    # u * total can round up to total: then fall back to the last token with positive weight, never a zero one
    vocab = weights.shape[-1]
    last_positive = vocab - 1 - (weights > 0).flip(-1).to(torch.int8).argmax(-1)
    return torch.where(idx >= vocab, last_positive, idx)


def new_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def uniforms(n: int, gen: torch.Generator, device: torch.device | str) -> torch.Tensor:
    return torch.rand(n, generator=gen, device=device, dtype=torch.float64)

"""Adaptive verify length: each cycle, verify the draft prefix that maximises committed tokens per second.

On a CPU a verify forward of q tokens costs c(q), which grows with q (OFFLINE.md: c(16) ~ 2.5-4 c(1)),
so verifying the whole block wastes work when later drafts are unlikely to be accepted. With
a_k = estimated probability that draft k is accepted given drafts 1..k-1 were,

    E[committed | verify n] = 1 + sum_{k<=n} prod_{j<=k} a_j,     rate(n) = E[...] / (c(n + 1) + d)

(d = the drafter forward), and n = argmax rate(n) over 0..N. a_k comes from the drafter's own confidence
(the largest probability of its distribution at slot k) through a calibration table learned online from
what the target actually accepted (Beta-smoothed counts per confidence bin).

Before drafting, the same rate with a_k = the recent acceptance rate of slot k (decayed counts over past
cycles) decides how many slots to draft at all: the drafter's cost is only worth paying for slots that may
be verified, and when no draft length beats plain decoding (1 / c(1)) the cycle decodes plainly, drafting
only every `probe_every` cycles to keep learning (the interval doubling, up to 4x, while probes do not pay).

Lossless by construction: n is a function of the drafter's distributions and of past cycles only, never of
the sampled draft tokens, so speculative sampling over the first n drafts is exact for any such n (choosing
n from the drawn tokens would bias sampling); at T = 0 any n gives the same greedy output.
"""
from __future__ import annotations

import torch

from blockdraft.errors import InvalidArgumentError


class AdaptiveVerify:
    def __init__(self, cost: dict[int, float], bins: int = 10, prior: tuple[float, float] = (1.0, 1.0),
                 momentum: float = 0.9, probe_every: int = 8, decay: float = 0.98) -> None:
        if 1 not in cost or any(c <= 0 for c in cost.values()):
            raise InvalidArgumentError(f"cost curve {cost}: expected positive seconds for q = 1..B")
        self.cost = torch.tensor([cost[q] for q in sorted(cost)], dtype=torch.float64)  # cost[q-1] = c(q)
        self.bins = bins
        self.accepted = torch.full((bins,), prior[0], dtype=torch.float64)
        self.tested = torch.full((bins,), prior[0] + prior[1], dtype=torch.float64)
        n = self.max_drafts
        self.slot_passed = torch.full((n,), prior[0], dtype=torch.float64)  # decayed per-slot history
        self.slot_tested = torch.full((n,), prior[0] + prior[1], dtype=torch.float64)
        self.prior, self.decay = prior, decay
        self.momentum, self.probe_every = momentum, probe_every
        self.drafter_s = 0.0
        self.skipped, self.interval = 0, probe_every

    @property
    def max_drafts(self) -> int:
        return self.cost.numel() - 1

    def rates(self, confidence: torch.Tensor) -> torch.Tensor:
        """(N,) estimated acceptance probability of each draft given the earlier ones were accepted."""
        b = (confidence.double().clamp(0, 1) * self.bins).long().clamp_max(self.bins - 1).cpu()
        return self.accepted[b] / self.tested[b]

    def _rate(self, accept: torch.Tensor) -> torch.Tensor:
        """(N + 1,) expected committed tokens per second verifying n = 0..N drafts of acceptance `accept` (N,)."""
        n_max = min(accept.numel(), self.max_drafts)
        reach = torch.cumprod(accept[:n_max], 0)
        committed = 1 + torch.cat([reach.new_zeros(1), torch.cumsum(reach, 0)])
        return committed / (self.cost[: n_max + 1] + self.drafter_s)

    def expected_rate(self, confidence: torch.Tensor) -> torch.Tensor:
        """(N + 1,) expected committed tokens per second when verifying n = 0..N drafts of this block."""
        return self._rate(self.rates(confidence))

    def choose(self, confidence: torch.Tensor) -> int:
        """How many of the drafts (confidence (N,) = the drafter's max probability per slot) to verify."""
        return int(self.expected_rate(confidence).argmax())

    def draft_length(self, limit: int) -> int:
        """How many slots (<= limit) to draft this cycle, from the recent acceptance of each slot; 0 = decode
        plainly. A drafting cycle costs c(n + 1) + d, a plain one c(1)."""
        if limit <= 0:
            return 0
        history = self._rate(self.slot_passed / self.slot_tested)[: limit + 1]
        best = int(history[1:].argmax()) + 1
        if history[best] >= 1.0 / float(self.cost[0]):  # beats a plain step
            self.skipped, self.interval = 0, self.probe_every
            return best
        self.skipped += 1
        if self.skipped >= self.interval:  # a probe: draft anyway, and wait longer before the next one
            self.skipped, self.interval = 0, min(2 * self.interval, 4 * self.probe_every)
            return limit
        return 0

    def update(self, confidence: torch.Tensor, verified: int, accepted: int, drafter_s: float) -> None:
        """Learn from one speculative cycle: drafts 1..verified were tested in order, `accepted` passed."""
        m = self.momentum
        self.drafter_s = drafter_s if self.drafter_s == 0.0 else m * self.drafter_s + (1 - m) * drafter_s
        if not verified:
            return
        tested = min(accepted + 1, verified)  # draft k is tested only if 1..k-1 were accepted
        b = (confidence[:tested].double().clamp(0, 1) * self.bins).long().clamp_max(self.bins - 1).cpu()
        ones = torch.ones(tested, dtype=torch.float64)
        hits = ones.clone()
        hits[accepted:] = 0
        self.tested.index_add_(0, b, ones)
        self.accepted.index_add_(0, b, hits)
        # slot history: decay towards the prior, then count this cycle's tested slots
        for counts, base in ((self.slot_passed, self.prior[0]), (self.slot_tested, sum(self.prior))):
            counts.mul_(self.decay).add_((1 - self.decay) * base)
        self.slot_tested[:tested] += ones
        self.slot_passed[:tested] += hits

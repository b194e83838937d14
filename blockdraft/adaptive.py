"""Adaptive verify length: each cycle, verify the draft prefix that maximises committed tokens per second.

On a CPU a verify forward of q tokens costs c(q), which grows with q (OFFLINE.md: c(16) ~ 2.5-4 c(1)),
so verifying the whole block wastes work when later drafts are unlikely to be accepted. With
a_k = estimated probability that draft k is accepted given drafts 1..k-1 were,

    E[committed | verify n] = 1 + sum_{k<=n} prod_{j<=k} a_j,     rate(n) = E[...] / (c(n + 1) + d)

(d = the drafter forward), and n = the shortest length within `tolerance` (1%) of the best rate over 0..N
(drafts that add less than the cost curve's own timing noise are not worth verifying). a_k comes from the
drafter's own confidence (the largest probability of its distribution at slot k) through a calibration
table learned online from what the target actually accepted (Beta-smoothed counts per confidence bin).

Before drafting, the same rate with a_k = the recent acceptance rate of slot k (decayed counts over past
cycles) decides how many slots to draft at all: the drafter's cost is only worth paying for slots that may
be verified, and when no draft length beats plain decoding (1 / c(1)) the cycle decodes plainly, drafting
only every `probe_every` cycles (a few slots, one row of a batch) to keep learning; the interval doubles,
up to 4x, while probes do not pay. In a batch the verify forward is compute-bound sooner, so the costs are
those of the whole batch's forward per row.

Lossless by construction: n is a function of the drafter's distributions and of past cycles only, never of
the sampled draft tokens, so speculative sampling over the first n drafts is exact for any such n (choosing
n from the drawn tokens would bias sampling); at T = 0 any n gives the same greedy output.
"""
from __future__ import annotations

import torch

from blockdraft.errors import InvalidArgumentError


PROBE_DRAFTS = 4  # a probe drafts this many slots (in a batch, every row's verify is padded to the longest)


class AdaptiveVerify:
    def __init__(self, cost: dict[int, float], bins: int = 10, prior: tuple[float, float] = (1.0, 1.0),
                 momentum: float = 0.9, probe_every: int = 8, decay: float = 0.98, tolerance: float = 0.01) -> None:
        if 1 not in cost or any(c <= 0 for c in cost.values()):
            raise InvalidArgumentError(f"cost curve {cost}: expected positive seconds for q = 1..B")
        self.cost = torch.tensor([cost[q] for q in sorted(cost)], dtype=torch.float64)  # cost[q-1] = c(q)
        self.bins = bins
        self.accepted = torch.full((bins,), prior[0], dtype=torch.float64)
        self.tested = torch.full((bins,), prior[0] + prior[1], dtype=torch.float64)
        n = self.max_drafts
        self.slot_passed = torch.full((n,), prior[0], dtype=torch.float64)  # decayed per-slot history
        self.slot_tested = torch.full((n,), prior[0] + prior[1], dtype=torch.float64)
        self.prior, self.decay, self.tolerance = prior, decay, tolerance
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

    def _rate(self, accept: torch.Tensor, rows: int = 1) -> torch.Tensor:
        """(N + 1,) expected committed tokens per second per row, verifying n = 0..N drafts of acceptance
        `accept` (N,), with `rows` rows sharing the verify forward (each pays c(rows (n + 1)) / rows + d)."""
        n_max = min(accept.numel(), self.max_drafts)
        reach = torch.cumprod(accept[:n_max], 0)
        committed = 1 + torch.cat([reach.new_zeros(1), torch.cumsum(reach, 0)])
        cost = self.cost[: n_max + 1] if rows == 1 else torch.tensor(
            [self.cost_of(rows * (n + 1)) / rows for n in range(n_max + 1)], dtype=torch.float64)
        return committed / (cost + self.drafter_s)

    def expected_rate(self, confidence: torch.Tensor) -> torch.Tensor:
        """(N + 1,) expected committed tokens per second when verifying n = 0..N drafts of this block."""
        return self._rate(self.rates(confidence))

    def choose(self, confidence: torch.Tensor) -> int:
        """How many of the drafts (confidence (N,) = the drafter's max probability per slot) to verify."""
        return self._shortest_near_best(self.expected_rate(confidence))

    def _shortest_near_best(self, rate: torch.Tensor) -> int:
        """The first index whose rate is within `tolerance` of the largest."""
        return int((rate >= rate.max() * (1 - self.tolerance)).nonzero()[0])

    def cost_of(self, tokens: int) -> float:
        """c(tokens), extrapolated linearly past the measured range from the curve's upper half (batched
        verifies of many rows are compute-bound, so their cost grows linearly with the tokens)."""
        q_max = self.cost.numel()
        if tokens <= q_max:
            return float(self.cost[tokens - 1])
        half = max(1, q_max // 2)
        slope = max(0.0, float(self.cost[-1] - self.cost[half - 1]) / max(1, q_max - half))
        return float(self.cost[-1]) + (tokens - q_max) * slope

    def draft_length(self, limit: int, rows: int = 1) -> int:
        """How many slots (<= limit) to draft this cycle, from the recent acceptance of each slot; 0 = decode
        plainly. Per row, with `rows` rows in the verify forward: drafting n costs c(rows (n + 1)) / rows + d,
        a plain step c(rows) / rows (a batch's plain step is already compute-bound, drafts are not free)."""
        if limit <= 0:
            return 0
        history = self._rate(self.slot_passed / self.slot_tested, rows)[1: limit + 1]  # n = 1..limit
        best = self._shortest_near_best(history) + 1
        if history[best - 1] >= rows / self.cost_of(rows):  # beats a plain step
            self.skipped, self.interval = 0, self.probe_every
            return best
        self.skipped += 1 / rows  # counted in cycles: every row of a batch asks once per cycle
        if self.skipped >= self.interval:  # a probe: draft a few slots, and wait longer before the next one
            self.skipped, self.interval = 0, min(2 * self.interval, 4 * self.probe_every)
            return min(limit, PROBE_DRAFTS)
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

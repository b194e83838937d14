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
only every `probe_every` cycles (a few slots) to keep learning; the interval doubles, up to 4x, while
probes do not pay, and is never so short that probing costs more than `probe_budget` (1%) of the plain
decoding time of the probed row (in a batch: its share of the batch's). In a batch the verify forward is
compute-bound sooner and shared: the batch's verify is ragged (`FastTarget.forward(lengths=)`: a row's
drafts cost only their own tokens' work), so a row that verifies n drafts while the others verify none is
priced as c_rows(1 + n), the batch's forward where one row verifies 1 + n tokens and the others 1, and
its rate is the batch's: (rows - 1 + E[committed]) / (c_rows(1 + n) + d), against a plain step's
rows / c_rows(1). (Looked-up drafts of several rows are
planned together and priced by their extra tokens together, c_rows(1 + all of them): `ngram_lengths`.)
c_rows is a curve measured at that batch size when one is given (`set_batch_cost`; `BatchEngine` measures
it once per device and batch size: the first extra token costs most, ~12% of a step on a 2-core CPU at 8
rows, as the batch leaves the one-query kernels; the next ones 4-7% each), else interpolated linearly in
the rows between the nearest known sizes, else extrapolated from the single-row curve by total tokens
(c(rows + n)).

The curve is measured once per device and cached, at one context length; every verify forward is then
compared with it and the policy corrects it online (`observe`, `CostDrift`), so a curve measured under
another job's load, or a request whose context makes attention dearer, does not keep mispricing the lengths.

Lossless by construction: n is a function of the drafter's distributions and of past cycles only, never of
the sampled draft tokens, so speculative sampling over the first n drafts is exact for any such n (choosing
n from the drawn tokens would bias sampling); at T = 0 any n gives the same greedy output.
"""
from __future__ import annotations

import heapq
import math

import torch

from blockdraft.decoding.tree import DraftTree, tested
from blockdraft.errors import InvalidArgumentError

PROBE_DRAFTS = 4  # a probe drafts this many slots
# In a batch, speculation must beat plain decoding by this much: the rates leave out what a speculative row
# costs besides the forwards (its bookkeeping, the attention over the padded rows, the drafter's per-call
# overhead), which one row alone never notices next to its own gains.
BATCH_MARGIN = 0.05
LOOKUP_TRIALS = 8  # looked-up drafts after each match length verified before the rate alone decides
DRAFTER, LOOKUP = "drafter", "lookup"  # kinds of speculative cycle (`CycleOutcomes`); None: a plain one
CHAIN, TREE = "chain", "tree"  # shapes of a cycle with the drafter's drafts: chains only, or some row's tree


class AdaptiveVerify:
    def __init__(self, cost: dict[int, float], bins: int = 10, prior: tuple[float, float] = (1.0, 1.0),
                 momentum: float = 0.9, probe_every: int = 8, decay: float = 0.98, tolerance: float = 0.01,
                 probe_budget: float = 0.01, learn_costs: bool = True) -> None:
        if not probe_budget > 0:
            raise InvalidArgumentError(f"probe_budget={probe_budget}: expected a fraction of the decoding time > 0")
        self.cost = _curve(cost)  # cost[q-1] = c(q), one row
        self.batch_cost: dict[int, torch.Tensor] = {}  # rows -> measured curve of that batch size
        self._per_row: dict[int, torch.Tensor] = {}  # rows -> `_costs`
        self._plan: dict[int, tuple[list[float], float, float]] = {}  # rows -> `_slot_plan`, until `update`
        self.bins = bins
        self.accepted = torch.full((bins,), prior[0], dtype=torch.float64)
        self.tested = torch.full((bins,), prior[0] + prior[1], dtype=torch.float64)
        n = self.max_drafts
        self.slot_passed = torch.full((n,), prior[0], dtype=torch.float64)  # decayed per-slot history
        self.slot_tested = torch.full((n,), prior[0] + prior[1], dtype=torch.float64)
        self.prior, self.decay, self.tolerance = prior, decay, tolerance
        self.momentum, self.probe_every, self.probe_budget = momentum, probe_every, probe_budget
        self.drafter_s = 0.0
        self.skipped, self.interval = 0, probe_every
        # looked-up drafts (blockdraft.decoding.lookup): per match length, how often a draft passed once tested
        self.ngram_passed: dict[int, float] = {}
        self.ngram_tested: dict[int, float] = {}
        self.drift: dict[int, CostDrift] = {}  # rows -> what the verify forwards really took, vs the curve
        self.learn_costs = learn_costs  # False: trust `cost` as given (`observe` does nothing)
        self.outcomes: dict[int, CycleOutcomes] = {}  # rows -> what whole cycles really committed per second
        self.shapes: dict[int, CycleOutcomes] = {}  # rows -> the same for the drafter's cycles, chains vs trees

    @property
    def max_drafts(self) -> int:
        return self.cost.numel() - 1

    @property
    def max_nodes(self) -> int:
        """Most tree nodes the policy prices: the verify cost curve's measured range (past it, `_at` would
        extrapolate a cost the policy has never seen)."""
        return self.max_drafts

    def rates(self, confidence: torch.Tensor) -> torch.Tensor:
        """(N,) estimated acceptance probability of each draft given the earlier ones were accepted."""
        b = (confidence.double().clamp(0, 1) * self.bins).long().clamp_max(self.bins - 1).cpu()
        return self.accepted[b] / self.tested[b]

    def _rate(self, accept: torch.Tensor, rows: int = 1) -> torch.Tensor:
        """(N + 1,) expected committed tokens per second of the batch when one of its `rows` rows verifies
        n = 0..N drafts of acceptance `accept` (N,) and the others none: (rows - 1 + E[committed]) /
        (c_rows(1 + n) + d). One row: E[committed] / (c(1 + n) + d)."""
        n_max = min(accept.numel(), self.max_drafts)
        reach = torch.cumprod(accept[:n_max], 0)
        committed = rows + torch.cat([reach.new_zeros(1), torch.cumsum(reach, 0)])
        return committed / (self._costs(rows)[: n_max + 1] + self.drafter_s)

    def _costs(self, rows: int) -> torch.Tensor:
        """(N + 1,) seconds of a ragged verify of `rows` rows where one verifies n = 0..N drafts and the others
        none (cached per batch size)."""
        if rows not in self._per_row:
            self._per_row[rows] = torch.tensor([self.forward_cost(rows, n + 1)
                                                for n in range(self.max_drafts + 1)], dtype=torch.float64)
        return self._per_row[rows]

    def expected_rate(self, confidence: torch.Tensor, rows: int = 1) -> torch.Tensor:
        """(N + 1,) expected committed tokens per second when verifying n = 0..N drafts of this block (of the
        whole batch when `rows` rows share the verify forward, see `_rate`)."""
        return self._rate(self.rates(confidence), rows)

    def choose(self, confidence: torch.Tensor, rows: int = 1) -> int:
        """How many of the drafts (confidence (N,) = the drafter's max probability per slot) to verify."""
        return self._shortest_near_best(self.expected_rate(confidence, rows).tolist())

    def _shortest_near_best(self, rate: list[float]) -> int:
        """The first index whose rate is within `tolerance` of the largest (plain Python: every row of a batch
        asks every cycle, and a handful of floats is cheaper here than a chain of small tensor ops)."""
        floor = max(rate) * (1 - self.tolerance)
        return next(i for i, r in enumerate(rate) if r >= floor)

    def set_batch_cost(self, rows: int, cost: dict[int, float]) -> None:
        """Use `cost` ({q: seconds of a ragged forward of `rows` rows where one row verifies q tokens and the
        others 1}, q = 1..) for batches of `rows`."""
        if not isinstance(rows, int) or rows < 2:
            raise InvalidArgumentError(f"rows={rows!r}: a batch cost curve is for 2 or more rows")
        self.batch_cost[rows] = _curve(cost)
        self._per_row.clear()
        self._plan.clear()

    def cost_of(self, tokens: int) -> float:
        """c(tokens) of one row, extrapolated past the measured range (see `_at`)."""
        return _at(self.cost, tokens)

    def forward_cost(self, rows: int, q: int) -> float:
        """Seconds of a verify forward of `rows` rows where one verifies q tokens and the others 1 (one row: q
        tokens): the measured curve, corrected by what the forwards of this batch size actually took (`observe`)."""
        drift = self.drift.get(rows)
        return self._curve_cost(rows, q) * (1.0 if drift is None else drift.factor(q))

    def observe(self, tokens: int, seconds: float, rows: int = 1) -> None:
        """Learn from a verify forward of `tokens` real tokens over `rows` rows (>= 1 each; one row: q tokens)
        that took `seconds`. Its extra tokens count as one row's: q = 1 + tokens - rows.

        The curve is measured once, at one context length, and cached; the machine's load, the context the
        requests really have, or a measurement disturbed by another job can make it wrong, and wrong in shape
        (c(4) / c(1) measured 1.47 under a neighbour's load, 1.19 alone). So every forward is compared with
        it, and the log of the ratio is learned as one level for all sizes plus each size's deviation,
        smoothed across neighbouring sizes (`CostDrift`), so the correction also reaches lengths the policy
        does not choose (the curve may price them too high for the policy ever to try them)."""
        if not (self.learn_costs and tokens >= rows >= 1 and seconds > 0):
            return
        drift, q = self.drift.setdefault(rows, CostDrift(self.max_drafts + 1)), 1 + tokens - rows
        if drift.add(q, seconds / self._curve_cost(rows, q)):
            self._per_row.pop(rows, None)
            self._plan.pop(rows, None)

    def _curve_cost(self, rows: int, q: int) -> float:
        if rows == 1 or not self.batch_cost:
            return self.cost_of(rows + q - 1)
        if rows in self.batch_cost:
            return _at(self.batch_cost[rows], q)
        # linear in the rows between the nearest known sizes (one row counts), past the largest along the
        # line through the two largest
        known = [1, *sorted(self.batch_cost)]
        above = next((r for r in known if r > rows), known[-1])
        below = max(r for r in known if r < above)
        lo, hi = (self.cost_of(q) if r == 1 else _at(self.batch_cost[r], q) for r in (below, above))
        return lo + (hi - lo) * (rows - below) / (above - below)

    def draft_length(self, limit: int, rows: int = 1) -> int:
        """How many slots (<= limit) to draft this cycle, from the recent acceptance of each slot; 0 = decode
        plainly. With `rows` rows in the verify forward, the batch's rate with this row's n drafts
        (see `_rate`) against a plain step's (a batch's plain step is already compute-bound, drafts are not free)."""
        if limit <= 0:
            return 0
        if self.plain_cycle(rows, DRAFTER):  # measured to lose at this batch size: no probes either
            return 0
        history, plain, spacing = self._slot_plan(rows)
        history = history[:limit]  # n = 1..limit
        best = self._shortest_near_best(history) + 1
        if history[best - 1] >= self._bar(plain, rows):  # beats a plain step
            self.skipped, self.interval = 0, self.probe_every
            return best
        self.skipped += 1 / rows  # counted in cycles: every row of a batch asks once per cycle
        if self.skipped >= max(self.interval, spacing):
            # a probe: draft a few slots, and wait longer before the next one
            self.skipped, self.interval = 0, min(2 * self.interval, 4 * self.probe_every)
            return min(limit, PROBE_DRAFTS)
        return 0

    def _slot_plan(self, rows: int) -> tuple[list[float], float, float]:
        """For `rows` rows, from the slot history: the rate of drafting n = 1..N, a plain step's rate and the
        probe spacing. The same for every row of a cycle, so computed once until the next `update`."""
        if rows not in self._plan:
            history = self._rate(self.slot_passed / self.slot_tested, rows)[1:].tolist()
            self._plan[rows] = (history, rows / self.forward_cost(rows, 1),
                                self._probe_spacing(rows))
        return self._plan[rows]

    def _probe_spacing(self, rows: int) -> float:
        """Fewest plain cycles between probes for them to cost at most `probe_budget` of the probed row's share
        of the decoding time (a batch's plain step over its rows): a probe pays the drafter and its drafts'
        tokens in the (ragged) verify. Per row, not per batch: the slot history a probe refreshes is shared by
        every batch size, the small ones draft anyway, and a probe costs a batch far more than it costs one
        row alone (the verify is compute-bound, and the row's features since it last drafted are projected
        first). At 16 rows a 1%-of-the-batch budget cost the servers about 1% under load (measured 2026-12-03)."""
        plain = self.forward_cost(rows, 1)
        extra = self.forward_cost(rows, 1 + PROBE_DRAFTS) - plain + self.drafter_s
        return max(0.0, extra) * rows / (self.probe_budget * plain)

    def ngram_rate(self, match: int) -> float:
        """Estimated probability that a looked-up draft after a `match`-token match passes, given the earlier
        ones did (Beta-smoothed counts)."""
        return self.ngram_passed.get(match, self.prior[0]) / self.ngram_tested.get(match, sum(self.prior))

    def ngram_length(self, match: int, limit: int, rows: int = 1) -> int:
        """How many of `limit` looked-up drafts (after a `match`-token match) to verify when this row is the only
        one of its batch of `rows` with looked-up drafts (`ngram_lengths`)."""
        return self.ngram_lengths([(match, limit)], rows)[0]

    def ngram_lengths(self, candidates: list[tuple[int, int]], rows: int = 1) -> list[int]:
        """How many looked-up drafts each of the batch's rows with a match verifies (candidates: (match length,
        drafts available) per such row), planned for the batch at once; all 0 when drafting with the drafter,
        or decoding plainly, is expected to commit more per second.

        A lookup costs no drafter forward, so the plan is priced by the verify alone: its E extra tokens,
        wherever they sit, as the curve's one row verifying E drafts, c_rows(1 + E) (conservative: a lone row
        pads the others' attention most), against the batch's expected tokens, rows + the sum of each verified
        draft's chance of being reached and accepted (the k-th draft after a match of rate r: r^k). For any E
        the best drafts are the E most likely ones of all rows together, so the plan takes drafts in that
        order, up to the curve's measured N, and keeps the shortest E within `tolerance` of the best rate.
        Planning the rows together lets them share what leaving the one-query kernels costs (~12% of a step
        at 8 rows on a 2-core CPU, which one row's drafts rarely recover, while half the rows of a batch that
        repeats itself recover it together). Until a match length's drafts have been tested LOOKUP_TRIALS
        times, a cycle that plans none verifies one of them: at the prior's rate (0.5) no batch plan pays, so a
        server that starts under load would otherwise never learn that its 3-token matches pass 85-90% of the
        time (the default target on MT-Bench)."""
        counts = [0] * len(candidates)
        if self.plain_cycle(rows, LOOKUP):
            return counts
        chances = heapq.nlargest(self.max_drafts, ((self.ngram_rate(m) ** k, i) for i, (m, limit) in
                                                   enumerate(candidates) for k in range(1, limit + 1)))
        if not chances:
            return counts
        costs = self._costs(rows).tolist()
        expected, rate = float(rows), []
        for extra, (chance, _) in enumerate(chances, 1):
            expected += chance
            rate.append(expected / costs[extra])
        history, plain, _ = self._slot_plan(rows)
        longest = max(min(limit, self.max_drafts) for _, limit in candidates)
        extra = self._shortest_near_best(rate) + 1
        if rate[extra - 1] > max(self._bar(plain, rows), max(history[:longest], default=0.0)):
            for _, i in chances[:extra]:
                counts[i] += 1
        else:  # a match length tested too few times to judge has one draft verified: its rate starts at the prior
            unknown = next((i for i, (m, _) in enumerate(candidates)
                            if self.ngram_tested.get(m, sum(self.prior)) < sum(self.prior) + LOOKUP_TRIALS), None)
            if unknown is not None:
                counts[unknown] = 1
        return counts

    def cycle_done(self, rows: int, kind: str | None, committed: int, seconds: float,
                   shape: str | None = None) -> None:
        """Count a whole batch cycle of `rows` rows: its kind (DRAFTER when any row ran the drafter, LOOKUP when
        rows verified looked-up drafts only, None when plain), the tokens all rows committed and its seconds,
        drafting and bookkeeping included (`plain_cycle`); a DRAFTER cycle's `shape` (TREE when any row
        verified a draft tree, else CHAIN) also counts for `chain_cycle`."""
        if rows > 1 and seconds > 0:
            if rows not in self.outcomes:
                self.outcomes[rows] = CycleOutcomes()
            self.outcomes[rows].add(kind, committed, seconds)
            if kind == DRAFTER and shape is not None:
                if rows not in self.shapes:
                    self.shapes[rows] = CycleOutcomes(kinds=(CHAIN, TREE))
                self.shapes[rows].add(shape, committed, seconds)

    def chain_cycle(self, rows: int) -> bool:
        """True when this batch size's next cycle drafts chains for requests that asked for trees: when its
        recent tree cycles committed fewer tokens per second than its chain cycles, or when no chain cycle has
        run for a while (`CycleOutcomes`, chains as the baseline). `tree_size` prices a tree by the cost curve
        and calibrated reach; in a batch a tree's extra nodes are a few percent of the forward, inside that
        model's error, so what whole cycles took decides (measured: trees at 0.97-0.98x chains with 2 and 4
        clients before this). One row alone is left to the model, as in `plain_cycle`."""
        outcome = self.shapes.get(rows)
        return outcome is not None and outcome.use_baseline(TREE)

    def plain_cycle(self, rows: int, kind: str) -> bool:
        """True when this batch size's next cycle does without drafts of `kind` (DRAFTER or LOOKUP) whatever the
        rates say: when its recent cycles with such drafts committed fewer tokens per second than plain ones,
        or when no plain cycle has run for a while (one in `CycleOutcomes.explore` keeps that comparison
        current). The rates above are a model (a cost curve, an acceptance estimate); in a batch, where
        speculation wins or loses by a few percent, a model error of that size decides, so what whole cycles
        really took settles it. A losing kind does not even probe at that batch size until its verdict fades
        (`CycleOutcomes`), then runs as the model plans and is judged again. One row alone never needs this (it
        gains 1.5-2x, or the model already decodes plainly)."""
        outcome = self.outcomes.get(rows)
        return outcome is not None and outcome.use_baseline(kind)

    @staticmethod
    def _bar(plain: float, rows: int) -> float:
        """The rate speculation must reach: a plain step's, raised by BATCH_MARGIN in a batch."""
        return plain if rows == 1 else plain * (1 + BATCH_MARGIN)

    def update_ngram(self, match: int, verified: int, accepted: int) -> None:
        """Learn from a cycle that verified `verified` looked-up drafts after a `match`-token match."""
        if verified:
            self.ngram_tested[match] = self.ngram_tested.get(match, sum(self.prior)) + min(accepted + 1, verified)
            self.ngram_passed[match] = self.ngram_passed.get(match, self.prior[0]) + accepted

    def update(self, confidence: torch.Tensor, verified: int, accepted: int, drafter_s: float) -> None:
        """Learn from one speculative cycle: drafts 1..verified were tested in order, `accepted` passed."""
        self._drafted(drafter_s)
        if not verified:
            return
        tested = min(accepted + 1, verified)  # draft k is tested only if 1..k-1 were accepted
        hits = torch.ones(tested, dtype=torch.float64)
        hits[accepted:] = 0
        self._calibrate(confidence[:tested], hits)
        self._slots(tested, hits)

    def tree_reach(self, tree: DraftTree, match: int = 0) -> torch.Tensor:
        """(N,) estimated probability that each node of `tree` is reached, its whole path accepted: its parent's
        times its own calibrated acceptance (`rates` of the drafter's probability of its token; a looked-up
        node's: the match length's `ngram_rate`)."""
        own = self.rates(torch.tensor(tree.probs, dtype=torch.float64)).tolist()
        if tree.lookup:
            own[: tree.lookup] = [self.ngram_rate(match)] * tree.lookup
        reach = [1.0]  # the root
        for parent, rate in zip(tree.parents, own):
            reach.append(reach[parent] * rate)
        return torch.tensor(reach[1:], dtype=torch.float64)

    def tree_size(self, tree: DraftTree, rows: int = 1, match: int = 0) -> int:
        """How many of the tree's first nodes to verify (0: a plain step): the prefix with the most expected
        committed tokens per second, rows + the sum of its nodes' reach (`tree_reach`) over the verify of its
        1 + n tokens (one of `rows` rows) and the drafter; the shortest within `tolerance` of the best."""
        n_max = min(len(tree), self.max_nodes)
        reach = self.tree_reach(tree.prefix(n_max), match)
        committed = rows + torch.cat([reach.new_zeros(1), torch.cumsum(reach, 0)])
        costs = torch.tensor([self.forward_cost(rows, 1 + n) for n in range(n_max + 1)], dtype=torch.float64)
        return self._shortest_near_best((committed / (costs + self.drafter_s)).tolist())

    def update_tree(self, tree: DraftTree, path: list[int], drafter_s: float) -> None:
        """Learn from a tree cycle whose walk accepted the rows `path`: every node it tested (the children of
        the root and of the accepted rows) calibrates the drafter's probabilities, and the depth it reached
        counts in the slot history as that many accepted drafts of a chain as deep as the tree."""
        self._drafted(drafter_s)
        if not len(tree):
            return
        checked = [(i, hit) for i, hit in tested(tree, path) if i > tree.lookup]
        if checked:
            self._calibrate(torch.tensor([tree.probs[i - 1] for i, _ in checked], dtype=torch.float64),
                            torch.tensor([float(hit) for _, hit in checked], dtype=torch.float64))
        reached = len(path)
        hits = torch.ones(min(reached + 1, tree.depth, self.max_drafts), dtype=torch.float64)
        hits[reached:] = 0
        self._slots(hits.numel(), hits)

    def _drafted(self, drafter_s: float) -> None:
        m = self.momentum
        self._plan.clear()
        self.drafter_s = drafter_s if self.drafter_s == 0.0 else m * self.drafter_s + (1 - m) * drafter_s

    def _calibrate(self, probs: torch.Tensor, hits: torch.Tensor) -> None:
        """Count drafts tested with the drafter's probabilities `probs`, accepted where `hits` is 1."""
        b = (probs.double().clamp(0, 1) * self.bins).long().clamp_max(self.bins - 1).cpu()
        self.tested.index_add_(0, b, torch.ones_like(hits))
        self.accepted.index_add_(0, b, hits)

    def _slots(self, tested: int, hits: torch.Tensor) -> None:
        """Slot history: decay towards the prior, then count this cycle's `tested` slots and their hits."""
        for counts, base in ((self.slot_passed, self.prior[0]), (self.slot_tested, sum(self.prior))):
            counts.mul_(self.decay).add_((1 - self.decay) * base)
        self.slot_tested[:tested] += 1
        self.slot_passed[:tested] += hits


class CycleOutcomes:
    """Decayed tokens and seconds of a batch size's recent cycles of each kind against a baseline kind, the
    first of `kinds`: by default plain (None) against the drafter's drafts (DRAFTER) and looked-up drafts only
    (LOOKUP), so that one kind's losses do not stop the other; or chains (CHAIN) against trees (TREE).

    A cycle counts `decay` less per later cycle of its own kind (~1 / (1 - decay) are remembered) and `forget`
    less per later cycle of another kind, so a kind that stopped running because it lost fades below `least`
    cycles after ~log(n / least) / (1 - forget) cycles of the others (n: its decayed count; ~70 after a bad
    start of 6 cycles, ~500 after a long record); then one cycle as the model plans it brings it back above
    `least` and the verdict is taken again with it. A kind that keeps losing so runs about one cycle in 45,
    and one that lost by a bad start gets another chance (with one verdict for all kinds that never faded, a
    few failed lookups at 2 rows turned the drafter off at that size for good). A verdict needs `least`
    (decayed) cycles of the kind and of baseline ones; after `explore` cycles without a baseline one, the next
    is one."""

    def __init__(self, kinds: tuple[str | None, ...] = (None, DRAFTER, LOOKUP), decay: float = 0.98,
                 forget: float = 0.995, least: float = 4.0, explore: int = 16) -> None:
        self.decay, self.forget, self.least, self.explore = decay, forget, least, explore
        self.baseline = kinds[0]
        # kind -> [cycles, tokens, seconds]
        self.sums: dict[str | None, list[float]] = {k: [0.0, 0.0, 0.0] for k in kinds}
        self.since_baseline = 0

    def add(self, kind: str | None, committed: int, seconds: float) -> None:
        if kind not in self.sums:
            raise InvalidArgumentError(f"cycle kind {kind!r}: expected one of {list(self.sums)}")
        for k, kept in self.sums.items():
            keep = self.decay if k == kind else self.forget
            kept[:] = [x * keep for x in kept]
        own = self.sums[kind]
        own[0], own[1], own[2] = own[0] + 1, own[1] + committed, own[2] + seconds
        self.since_baseline = 0 if kind == self.baseline else self.since_baseline + 1

    def losing(self, kind: str) -> bool:
        """Whether this kind's cycles committed fewer tokens per second than baseline ones (with enough of both)."""
        (n_s, tok_s, sec_s), (n_p, tok_p, sec_p) = self.sums[kind], self.sums[self.baseline]
        return min(n_s, n_p) >= self.least and tok_s * sec_p < tok_p * sec_s

    def use_baseline(self, kind: str) -> bool:
        """Whether the next cycle is a baseline one rather than of `kind` (losing, or time to compare again)."""
        return self.since_baseline >= self.explore or self.losing(kind)


class CostDrift:
    """log(observed / curve) of the verify forwards per verify size q: a level shared by all sizes, plus each
    size's own deviation from it, filled in across neighbouring sizes.

    The level is the mean log ratio of all recent forwards: a machine that runs slower than when the curve
    was measured (another job's load, longer contexts, a batch whose rows are not contiguous in the cache)
    is slower at every size, so the sizes the policy never verifies scale with the ones it does. Correcting
    only the observed sizes would make the others look cheaper by the same factor: a policy that decodes
    plainly, on a machine 50% slower than its curve, would see every verify of drafts 50% cheaper than a
    plain step and start drafting where it loses (measured in the server's batches, 2026-12-02).

    On top of the level, each size keeps decayed sums of its forwards' log ratios (each forward counts
    `decay` less per later one, so ~1 / (1 - decay) are remembered). Its deviation is the mean of its own
    forwards' deviations, plus its neighbours' weighted by a Gaussian in the distance |q - j| (`width`
    sizes) and by their counts up to `prior`, shrunk towards 0 (the curve's shape is right) as if `prior`
    forwards had agreed with it: a size observed often gets its own ratio, its unobserved neighbours part of
    their shape correction, distant sizes the curve's shape at the observed level. Refitted every
    `refit_every` forwards; the factor stays within [1 / limit, limit]."""

    def __init__(self, sizes: int, decay: float = 0.99, prior: float = 2.0, width: float = 2.0,
                 refit_every: int = 8, limit: float = 2.0) -> None:
        self.decay, self.prior, self.refit_every = decay, prior, refit_every
        self.log_limit = math.log(limit)
        self.kernel = [[math.exp(-0.5 * ((q - j) / width) ** 2) for j in range(sizes)] for q in range(sizes)]
        self.weight, self.total = [0.0] * sizes, [0.0] * sizes  # per size: decayed count, sum of log ratios
        self.log_factor = [0.0] * sizes
        self.seen = 0

    def add(self, q: int, ratio: float) -> bool:
        """Count one forward of q tokens (`ratio` = its seconds over the curve's); True when the fit changed."""
        i = min(q, len(self.weight)) - 1
        d = self.decay
        self.weight = [w * d for w in self.weight]
        self.total = [t * d for t in self.total]
        self.weight[i] += 1.0
        self.total[i] += max(-self.log_limit, min(self.log_limit, math.log(ratio)))
        self.seen += 1
        if self.seen % self.refit_every:
            return False
        level = sum(self.total) / sum(self.weight)
        own = [t - w * level for w, t in zip(self.weight, self.total)]  # each size's summed deviation
        # a neighbour counts at most `prior` forwards: it fills in a size with little evidence of its own,
        # but does not pull a well-observed size off its own mean
        capped = [(min(w, self.prior), d / w if w else 0.0) for w, d in zip(self.weight, own)]
        self.log_factor = []
        for q, row in enumerate(self.kernel):
            near = [(k * c, k * c * m) for j, (k, (c, m)) in enumerate(zip(row, capped)) if j != q]
            deviation = (own[q] + sum(v for _, v in near)) / (self.prior + self.weight[q] + sum(w for w, _ in near))
            self.log_factor.append(max(-self.log_limit, min(self.log_limit, level + deviation)))
        return True

    def factor(self, q: int) -> float:
        return math.exp(self.log_factor[min(q, len(self.log_factor)) - 1])


def _curve(cost: dict[int, float]) -> torch.Tensor:
    """{q: seconds} for q = 1..B -> tensor (B,) with [q - 1] = c(q)."""
    if sorted(cost) != list(range(1, len(cost) + 1)) or any(c <= 0 for c in cost.values()):
        raise InvalidArgumentError(f"cost curve {cost}: expected positive seconds for q = 1..B")
    return torch.tensor([cost[q] for q in sorted(cost)], dtype=torch.float64)


def _at(curve: torch.Tensor, q: int) -> float:
    """curve[q - 1], extrapolated linearly past the measured range from the curve's upper half (large
    verifies are compute-bound, so their cost grows linearly with the tokens)."""
    q_max = curve.numel()
    if q <= q_max:
        return float(curve[q - 1])
    half = max(1, q_max // 2)
    slope = max(0.0, float(curve[-1] - curve[half - 1]) / max(1, q_max - half))
    return float(curve[-1]) + (q - q_max) * slope

"""Batched speculative decoding: many requests, one target verify forward per cycle for all of them.

    each cycle: every active row drafts (its own block size, verify length, sampling parameters and
    generator; one drafter forward and one LM-head matmul for all rows) -> one target forward over all
    rows, [token, drafts, padding] each, at the rows' own positions, ragged (the projections and MLPs run on
    the real tokens only, so a row that verifies more costs only its own tokens) -> each row verifies and commits on
    its own -> cache rows roll back to their committed lengths (free: the static cache keeps per-row
    lengths) -> finished rows leave, queued requests take their cache rows at once (continuous batching;
    a new row's prefill runs alone).

Each row runs exactly the steps of `SpeculativeEngine` (`propose` / `settle`) with its own state and random
generator, so a request decodes the same tokens as when it runs alone (bitwise equal where the batched
matmuls are; tested in float64) and sampled rows keep the target's distribution. Padding tokens sit after a
row's last real token, so causal masking hides them and the rollback discards them. The batched verify needs
the fast path (Llama / Qwen2 / Qwen3); other targets (MoE, sliding-window, hybrid) keep a cache per row, made
when a request takes the row and dropped when it leaves, and verify the rows one after another in the cycle
(their drafts are still made in one drafter pass).
"""
from __future__ import annotations

from typing import Iterator, Sequence

import torch

from blockdraft.decoding.adaptive import CHAIN, DRAFTER, LOOKUP, TREE
from blockdraft.decoding.engine import DecodeOptions, DecodeState, Proposal, SpeculativeEngine
from blockdraft.decoding.stats import GenerationStats, now
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.fast_target import FastTarget


class Batch:
    """Cache rows that requests join and leave between cycles (continuous batching), one cycle at a time.

    A caller (`BatchEngine.run`, the server's scheduler) decides who runs: `admit` a request into a free row,
    `prefill` it (whole, or a chunk at a time), run `cycle` for every prefilled row, `release` a row when its
    request ends. On the fast path the rows share one static cache; other targets get a cache per row (a hybrid
    target's linear-attention states included), new on `admit`, freed on `release`.
    """

    def __init__(self, engine: SpeculativeEngine, rows: int, capacity: int) -> None:
        if not isinstance(rows, int) or rows < 1:
            raise InvalidArgumentError(f"rows={rows!r}: expected an integer >= 1")
        self.engine, self.rows = engine, rows
        self.batched = isinstance(engine.target, FastTarget)
        self.cache = engine.target.new_cache(rows=rows, capacity=capacity) if self.batched else None
        self.caches: list[object | None] = [None] * rows  # per row, without the fast path
        self.states: list[DecodeState | None] = [None] * rows

    def free_rows(self) -> list[int]:
        return [r for r, s in enumerate(self.states) if s is None]

    def decoding_rows(self) -> list[int]:
        """Rows whose prompt is in the cache and whose request still decodes."""
        return [r for r, s in enumerate(self.states) if s is not None and s.token >= 0 and not s.done]

    def admit(self, state: DecodeState, row: int) -> None:
        if self.states[row] is not None:
            raise InvalidArgumentError(f"row {row} is taken: expected one of the free rows {self.free_rows()}")
        self.states[row] = state
        if self.batched:
            self.engine.target.rollback(self.cache, 0, row=row)
        else:
            self.caches[row] = self.engine.target.new_cache()

    def prefill(self, row: int, chunk: int | None = None) -> list[int]:
        """The next piece of row `row`'s prompt (all of it without `chunk`); [first token] after the last."""
        return self.engine.prefill(self.states[row], self._cache(row), chunk=chunk, **self._row(row))

    def release(self, row: int) -> None:
        self.states[row] = None
        self.caches[row] = None

    def _cache(self, row: int) -> object:
        return self.cache if self.batched else self.caches[row]

    def _row(self, row: int) -> dict[str, int]:
        return {"row": row} if self.batched else {}

    def cycle(self, active: list[int] | None = None) -> dict[int, list[int]]:
        """One draft + batched verify + commit for each row in `active` (default: every decoding row);
        returns the tokens each committed. Rows whose request is done stay until `release`."""
        engine, target = self.engine, self.engine.target
        active = self.decoding_rows() if active is None else active
        if not active:
            return {}
        device = target.device
        t0 = now(device)
        states = [self.states[r] for r in active]
        rows = len(active) if self.batched else 1  # how many rows share a verify forward
        props = engine.propose_many(states, rows)
        width = 1 + max(p.drafts.numel() for p in props)
        ids = torch.empty(len(active), width, dtype=torch.long, device=device)
        for i, (s, p) in enumerate(zip(states, props)):
            n = p.drafts.numel()
            ids[i, 0] = s.token
            ids[i, 1:n + 1] = p.drafts
            ids[i, n + 1:] = s.token  # padding after the real tokens: masked by position, rolled back
        lengths = [1 + p.drafts.numel() for p in props]
        features = any(s.speculative for s in states)
        tree = _tree_layout(props, width, device)
        t1 = now(device)
        if self.batched:  # ragged: the rows' real tokens only go through the projections and MLPs
            view = None if active == list(range(len(active))) else active
            logits, feats = target.forward(ids, self.cache, [s.start for s in states], features=features,
                                           rows=view, lengths=lengths, tree=tree)
            logits = logits.split(lengths)
            feats = feats.split(lengths) if feats is not None else [None] * len(active)
            if engine.policy is not None and any(s.policy is not None for s in states):
                engine.policy.observe(sum(lengths), now(device) - t1, rows=len(active))
        else:
            logits, feats = self._row_by_row(active, states, ids, lengths, tree)
        committed = {}
        for i, (r, s, p) in enumerate(zip(active, states, props)):
            start = s.start
            committed[r] = engine.settle(s, p, logits[i], feats[i] if s.speculative else None)
            target.keep_path(self._cache(r), start, p.path, **self._row(r))
            target.rollback(self._cache(r), s.start, **self._row(r))
        elapsed = now(device) - t0
        for s in states:
            s.stats.decode_time += elapsed
        if engine.policy is not None and any(s.policy is not None for s in states):
            # projecting context committed in earlier cycles is not this cycle's cost (see `_draft_hidden`)
            engine.policy.cycle_done(rows, cycle_kind(props), sum(map(len, committed.values())),
                                     elapsed - sum(p.context_s for p in props), shape=cycle_shape(states, props))
        return committed

    def _row_by_row(self, active: list[int], states: list[DecodeState], ids: torch.Tensor, lengths: list[int],
                    tree: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[list, list]:
        """The verify without the fast path: each row's real tokens through the target on its own cache.
        Returns per row logits (n, V) and features (n, K*D) or None."""
        engine, target = self.engine, self.engine.target
        logits, feats = [], []
        for i, (r, s, n) in enumerate(zip(active, states, lengths)):
            t0 = now(target.device)
            layout = None if tree is None else (tree[0][i:i + 1, :n], tree[1][i:i + 1, :n, :n])
            out, f = target.forward(ids[i:i + 1, :n], self.caches[r], s.start, features=s.speculative, tree=layout)
            if engine.policy is not None and s.policy is not None:
                engine.policy.observe(n, now(target.device) - t0)
            logits.append(out[0])
            feats.append(None if f is None else f[0])
        return logits, feats


def _tree_layout(props: list[Proposal], width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The verify layout of a batch where some rows propose trees: (depths (b, width), visible (b, width,
    width)); rows with chains (and every row's padding) keep positions in order and causal visibility.
    None when no row has a tree."""
    layouts = [p.layout() for p in props]
    if all(layout is None for layout in layouts):
        return None
    depths = torch.arange(width).repeat(len(props), 1)
    visible = torch.ones(width, width, dtype=torch.bool).tril().repeat(len(props), 1, 1)
    for i, layout in enumerate(layouts):
        if layout is not None:
            n = len(layout[0])
            depths[i, :n] = torch.tensor(layout[0])
            visible[i, :n, :n] = layout[1]
    return depths.to(device), visible.to(device)


def cycle_kind(props: list[Proposal]) -> str | None:
    """What a cycle speculated with (`CycleOutcomes`): the drafter when any row ran it (its probes too, verified
    or not), else looked-up drafts when any row has some, else nothing (None)."""
    if any(p.confidence is not None for p in props):
        return DRAFTER
    return LOOKUP if any(p.drafts.numel() for p in props) else None


def cycle_shape(states: list[DecodeState], props: list[Proposal]) -> str | None:
    """How the rows that asked for trees under the adaptive policy drafted this cycle (`AdaptiveVerify.chain_cycle`):
    TREE when any of them proposed a draft tree (whatever prefix of it the policy kept), CHAIN when they ran the
    drafter for chains only, None when none of them ran the drafter. Rows without trees, and rows with fixed
    verify (no policy: they draft trees whatever the verdict), do not take part in the comparison: a fixed row's
    trees would make every cycle TREE, and the adaptive rows would then draft chains for good, unjudged."""
    drafted = [p for s, p in zip(states, props) if s.tree_budget and s.policy is not None and p.confidence is not None]
    if not drafted:
        return None
    return TREE if any(p.tree is not None for p in drafted) else CHAIN


class BatchEngine:
    def __init__(self, engine: SpeculativeEngine, rows: int = 8) -> None:
        if not isinstance(rows, int) or rows < 1:
            raise InvalidArgumentError(f"rows={rows!r}: expected an integer >= 1")
        self.engine, self.rows = engine, rows

    @torch.inference_mode()
    def run(self, prompts: Sequence[list[int]], options: DecodeOptions | Sequence[DecodeOptions],
            ) -> Iterator[tuple[int, list[int], GenerationStats]]:
        """Yield (request index, generated tokens, stats) as requests finish (not in input order)."""
        opts = [options] * len(prompts) if isinstance(options, DecodeOptions) else list(options)
        if len(opts) != len(prompts):
            raise InvalidArgumentError(f"{len(opts)} options for {len(prompts)} prompts: expected one each")
        states = [self.engine.begin(p, o, GenerationStats(1)) for p, o in zip(prompts, opts)]  # errors first
        yield from self._batched(states)

    def _batched(self, states: list[DecodeState]) -> Iterator[tuple[int, list[int], GenerationStats]]:
        rows = min(self.rows, len(states))
        if any(s.policy is not None for s in states):
            self.engine.calibrate_batch(rows)
        longest = max((len(s.prompt) + s.options.max_new_tokens for s in states), default=1)
        batch = Batch(self.engine, rows, capacity=longest + max(self.engine.verify_tokens(s.options) for s in states) + 1)
        index: dict[int, int] = {}  # row -> request index
        tokens: dict[int, list[int]] = {}
        queue = iter(enumerate(states))
        while True:
            for r in batch.free_rows():  # refill free rows
                while batch.states[r] is None:
                    nxt = next(queue, None)
                    if nxt is None:
                        break
                    i, state = nxt
                    batch.admit(state, r)
                    first = batch.prefill(r)
                    if state.done:
                        batch.release(r)
                        yield i, first, state.stats
                    else:
                        index[r], tokens[r] = i, first
            if not batch.decoding_rows():
                return
            for r, committed in batch.cycle().items():
                tokens[r].extend(committed)
                if batch.states[r].done:
                    yield index[r], tokens[r], batch.states[r].stats
                    batch.release(r)

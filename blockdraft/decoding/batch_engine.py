"""Batched speculative decoding: many requests, one target verify forward per cycle for all of them.

    each cycle: every active row drafts (its own block size, verify length, sampling parameters and
    generator; one drafter forward and one LM-head matmul for all rows) -> one target forward over all
    rows, [token, drafts, padding] each, at the rows' own positions -> each row verifies and commits on
    its own -> cache rows roll back to their committed lengths (free: the static cache keeps per-row
    lengths) -> finished rows leave, queued requests take their cache rows at once (continuous batching;
    a new row's prefill runs alone).

Each row runs exactly the steps of `SpeculativeEngine` (`propose` / `settle`) with its own state and random
generator, so a request decodes the same tokens as when it runs alone (bitwise equal where the batched
matmuls are; tested in float64) and sampled rows keep the target's distribution. Padding tokens sit after a
row's last real token, so causal masking hides them and the rollback discards them. Needs the fast path
(Llama / Qwen2 / Qwen3); other targets decode the requests one after another.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from blockdraft.decoding.engine import DecodeOptions, DecodeState, SpeculativeEngine
from blockdraft.decoding.stats import GenerationStats, now
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.fast_target import FastTarget

log = logging.getLogger(__name__)


@dataclass
class _Slot:
    index: int
    state: DecodeState
    tokens: list[int]


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
        if not isinstance(self.engine.target, FastTarget):
            yield from self._one_by_one(prompts, opts)
            return
        yield from self._batched(states)

    def _one_by_one(self, prompts: Sequence[list[int]], opts: list[DecodeOptions]):
        log.info("target has no fast path: decoding %d requests one after another", len(prompts))
        for i, (p, o) in enumerate(zip(prompts, opts)):
            stats = GenerationStats(1)
            yield i, [t for chunk in self.engine.decode(p, o, stats) for t in chunk], stats

    def _batched(self, states: list[DecodeState]) -> Iterator[tuple[int, list[int], GenerationStats]]:
        engine, target = self.engine, self.engine.target
        rows = min(self.rows, len(states))
        if any(s.policy is not None for s in states):
            engine.calibrate_batch(rows)
        longest = max((len(s.prompt) + s.options.max_new_tokens for s in states), default=1)
        cache = target.new_cache(rows=rows, capacity=longest + max(s.block for s in states) + 1)
        slots: list[_Slot | None] = [None] * rows
        queue = iter(enumerate(states))
        while True:
            for r in range(rows):  # refill free rows
                while slots[r] is None:
                    nxt = next(queue, None)
                    if nxt is None:
                        break
                    i, state = nxt
                    first = engine.prefill(state, cache, row=r)
                    if state.done:
                        yield i, first, state.stats
                    else:
                        slots[r] = _Slot(i, state, first)
            active = [r for r in range(rows) if slots[r] is not None]
            if not active:
                return
            for r in self._cycle(cache, slots, active):
                slot = slots[r]
                yield slot.index, slot.tokens, slot.state.stats
                slots[r] = None

    def _cycle(self, cache: object, slots: list[_Slot | None], active: list[int]) -> list[int]:
        """One draft + batched verify + commit for every active row; returns the rows that finished."""
        engine, target = self.engine, self.engine.target
        device = target.device
        t0 = now(device)
        states = [slots[r].state for r in active]
        props = engine.propose_many(states)
        width = 1 + max(p.drafts.numel() for p in props)
        ids = torch.empty(len(active), width, dtype=torch.long, device=device)
        for i, (s, p) in enumerate(zip(states, props)):
            n = p.drafts.numel()
            ids[i, 0] = s.token
            ids[i, 1:n + 1] = p.drafts
            ids[i, n + 1:] = s.token  # padding after the real tokens: masked by position, rolled back
        view = None if active == list(range(len(active))) else active
        features = any(s.speculative for s in states)
        t1 = now(device)
        logits, feats = target.forward(ids, cache, [s.start for s in states], features=features, rows=view)
        if engine.policy is not None and any(s.policy is not None for s in states):
            engine.policy.observe(width, now(device) - t1, rows=len(active))
        finished = []
        for i, (r, s, p) in enumerate(zip(active, states, props)):
            committed = engine.settle(s, p, logits[i], feats[i] if s.speculative else None)
            target.rollback(cache, s.start, row=r)
            slots[r].tokens.extend(committed)
            if s.done:
                finished.append(r)
        elapsed = now(device) - t0
        for s in states:
            s.stats.decode_time += elapsed
        return finished

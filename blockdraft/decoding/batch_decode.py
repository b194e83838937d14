"""Plain (non-speculative) batched decoding with continuous batching, on the fast path.

Used to regenerate training data: `rows` sequences decode together, one token each per forward; a row that
finishes is refilled with the next prompt at once (its prefill runs alone), so no compute is spent on
finished rows. Greedy or sampled with the same `SamplingParams` as the engine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from blockdraft.decoding.sampling import SamplingParams, new_generator, probabilities, sample_index, uniforms
from blockdraft.modeling.fast_target import FastTarget


@dataclass
class _Row:
    index: int
    start: int  # position of the last token
    tokens: list[int] = field(default_factory=list)


def decode_many(target: FastTarget, prompts: Sequence[list[int]], *, max_new_tokens: int, rows: int,
                sampling: SamplingParams, stop_token_ids: Sequence[int]) -> Iterator[tuple[int, list[int], bool]]:
    """Yield (prompt index, generated tokens, ended with a stop token) as rows finish (any order)."""
    device = target.device
    gen = None if sampling.greedy else new_generator(sampling.seed, device)
    stops = set(stop_token_ids)
    longest = max((len(p) for p in prompts), default=1)
    cache = target.new_cache(rows=rows, capacity=longest + max_new_tokens + 1)
    slots: list[_Row | None] = [None] * rows
    queue = iter(range(len(prompts)))

    def pick(logits: torch.Tensor) -> list[int]:
        if sampling.greedy:
            return logits.argmax(-1).tolist()
        probs = probabilities(logits, sampling)
        return sample_index(probs, uniforms(probs.shape[0], gen, device)).tolist()

    def finished(row: _Row) -> bool:
        return row.tokens[-1] in stops or len(row.tokens) >= max_new_tokens

    pending = True
    while True:
        for r in range(rows):  # refill empty slots
            while slots[r] is None and pending:
                i = next(queue, None)
                if i is None:
                    pending = False
                    break
                ids = torch.tensor([prompts[i]], device=device)
                logits, _ = target.forward(ids, cache, 0, features=False, last_only=True, rows=[r])
                row = _Row(i, len(prompts[i]), pick(logits[:, -1]))
                if finished(row):
                    yield row.index, row.tokens, row.tokens[-1] in stops
                else:
                    slots[r] = row
        active = [r for r in range(rows) if slots[r] is not None]
        if not active:
            return
        ids = torch.tensor([[slots[r].tokens[-1]] for r in active], device=device)
        view = None if active == list(range(len(active))) else active  # rows 0..b-1: one slice write per layer
        logits, _ = target.forward(ids, cache, [slots[r].start for r in active], features=False, rows=view)
        for r, tok in zip(active, pick(logits[:, -1])):
            row = slots[r]
            row.tokens.append(tok)
            row.start += 1
            if finished(row):
                yield row.index, row.tokens, tok in stops
                slots[r] = None

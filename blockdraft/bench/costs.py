"""The target's verify cost curve: seconds for one forward of q new tokens at a given context length.

On a GPU verifying 16 tokens costs about as much as 1; on a CPU it does not (here ~1.5-4x), so this curve
decides the break-even acceptance length and how many drafts are worth verifying.
"""
from __future__ import annotations

import statistics

import torch

from blockdraft.stats import now
from blockdraft.target import TargetModel


@torch.inference_mode()
def verify_cost_curve(target: TargetModel, max_tokens: int, context: int = 300, repeats: int = 5,
                      seed: int = 0) -> dict[int, float]:
    """{q: median seconds of a q-token forward (features captured, as in verification)} for q = 1..max_tokens."""
    g = torch.Generator().manual_seed(seed)
    device = target.device
    prompt = torch.randint(0, target.vocab_size, (1, context), generator=g).to(device)
    cache = target.new_cache()
    target.forward(prompt, cache, 0, features=bool(target.feature_layer_ids), last_only=True)
    curve: dict[int, float] = {}
    for q in range(1, max_tokens + 1):
        step = torch.randint(0, target.vocab_size, (1, q), generator=g).to(device)
        times = []
        for r in range(repeats + 1):
            t0 = now(device)
            target.forward(step, cache, context, features=bool(target.feature_layer_ids))
            if r:  # the first run warms up
                times.append(now(device) - t0)
            target.rollback(cache, context)
        curve[q] = statistics.median(times)
    return curve

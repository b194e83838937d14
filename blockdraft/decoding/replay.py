"""Acceptance replay: the engine's greedy acceptance lengths without its verify forwards.

At T = 0 the engine's output is the target's greedy continuation, and a cycle accepts the leading drafts
that equal it. Given that continuation (from plain decoding), one target forward over prompt + continuation
yields the features of every position, and the engine's cycles replay with drafter calls only: draft after
the last committed token (the engine's own `propose`, so the same block, context, draft vocabulary and
numerics path), accept the drafts that match the continuation, commit them and the bonus token, and move
the committed tokens' features into the draft cache. The lengths equal the engine's fixed-verify lengths
up to float rounding between one long target forward and incremental ones (tested against the engine).

A 16-token verify costs ~1.5-2 plain steps on a CPU; a replay costs one prefill plus the drafter calls, so
tau over hundreds of prompts takes minutes instead of an hour.
"""
from __future__ import annotations

import torch

from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.stats import GenerationStats
from blockdraft.decoding.tree import walk
from blockdraft.errors import InvalidArgumentError


@torch.inference_mode()
def replay_acceptance(engine: SpeculativeEngine, prompt_ids: list[int], continuation: list[int],
                      options: DecodeOptions, drafted: list[int] | None = None) -> list[int]:
    """Acceptance lengths (bonus included) of the cycles the engine would run to produce `continuation`,
    the greedy output of plain decoding under `options` (fixed verify, T = 0; chains or draft trees, walked
    by the continuation's tokens); `drafted`, when given, gets each cycle's number of drafts (tree nodes with
    trees; fewer than the block near the end)."""
    if not options.sampling.greedy or options.verify != "fixed" or options.no_draft:
        raise InvalidArgumentError("replay needs greedy speculative decoding with fixed verify: expected "
                                   f"temperature 0, verify='fixed', no_draft=False (got {options})")
    if not continuation:
        raise InvalidArgumentError("replay needs the greedy continuation: expected at least one token")
    target = engine.target
    seq = engine.begin(prompt_ids, options, GenerationStats(1))
    ids = torch.tensor([prompt_ids + continuation], device=target.device)
    _, feats = target.forward(ids, target.new_cache(capacity=ids.shape[1]), 0, features=True,  # (1, T, K*D)
                              last_only=True)  # features of every position; logits of the last only
    p = len(prompt_ids)
    seq.token, seq.start, seq.remaining = continuation[0], p, options.max_new_tokens - 1
    seq.pending = [feats[:, :p]]
    lengths = []
    end = p + len(continuation)
    while seq.start < end - 1:
        prop = engine.propose(seq)
        if prop.tree is not None:  # walk the tree by the continuation: the target's argmax at each depth
            truth = ids[0, seq.start + 1:].tolist()
            depth = prop.tree.positions()
            path, _ = walk(prop.tree, lambda row: truth[depth[row]] if depth[row] < len(truth) else -1)
            accepted = len(path)
        else:
            truth = ids[0, seq.start + 1: seq.start + 1 + prop.drafts.numel()]
            match = (prop.drafts[: truth.numel()] == truth).int()
            accepted = int(torch.cumprod(match, 0).sum()) if match.numel() else 0
        # committed: the accepted drafts and the bonus, cut where the continuation ends (a stop token)
        committed = min(accepted + 1, p + len(continuation) - 1 - seq.start)
        if prop.drafts.numel():
            lengths.append(committed)
            if drafted is not None:
                drafted.append(prop.drafts.numel())
        seq.pending.append(feats[:, seq.start: seq.start + committed])
        seq.start += committed
        seq.remaining -= committed
        seq.token = int(ids[0, seq.start])
    return lengths

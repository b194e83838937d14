"""Benchmark metrics, as pure functions over per-call statistics.

Averaging order matters: the acceptance length is averaged per cycle within a prompt, then over prompts
(each prompt counts once, however long its answer). Histograms and per-position rates pool all cycles.
"""
from __future__ import annotations

from statistics import mean
from typing import Sequence

from blockdraft.decoding.stats import histogram, per_position_acceptance


def mean_acceptance_length(per_prompt: Sequence[Sequence[int]]) -> float | None:
    """Mean over prompts of each prompt's mean committed tokens per cycle (prompts without cycles skipped)."""
    means = [mean(lengths) for lengths in per_prompt if lengths]
    return mean(means) if means else None


def pooled_histogram(per_prompt: Sequence[Sequence[int]], block_size: int) -> list[float]:
    """Share of all cycles that committed k tokens, k = 1..block_size."""
    counts = histogram([n for lengths in per_prompt for n in lengths], block_size)
    total = sum(counts)
    return [c / total if total else 0.0 for c in counts]


def pooled_per_position(per_prompt: Sequence[Sequence[int]], drafted: Sequence[Sequence[int]],
                        block_size: int) -> list[float | None]:
    """Per draft position k: share of cycles that accepted it among those that proposed it, all prompts."""
    lengths = [n for lens in per_prompt for n in lens]
    proposed = [d for ds in drafted for d in ds]
    return per_position_acceptance(lengths, proposed, block_size)


def target_tokens_per_committed(per_prompt: Sequence[Sequence[int]], verified: Sequence[Sequence[int]]) -> float:
    """Tokens the target processed in verification per token committed (1.0 for plain decoding): each cycle's
    last committed token and the drafts it verified (`verified`; a tree's nodes, however deep it is)."""
    processed = sum(d + 1 for ds in verified for d in ds)
    committed = sum(n for lens in per_prompt for n in lens)
    return processed / committed if committed else float("nan")


def speedup(tokens_per_second: float, baseline_tokens_per_second: float) -> float:
    return tokens_per_second / baseline_tokens_per_second if baseline_tokens_per_second > 0 else float("nan")


def break_even_acceptance(cost: dict[int, float], verify_tokens: int, drafter_seconds: float) -> float:
    """Acceptance length at which a cycle (draft + verify of `verify_tokens`) costs as much per committed
    token as plain decoding: (c(q) + d) / c(1), from the measured verify cost curve c."""
    return (cost[verify_tokens] + drafter_seconds) / cost[1]


def predicted_speedup(cost: dict[int, float], verify_counts: dict[int, int], plain_cycles: int,
                      drafter_seconds: float, committed: int) -> float:
    """Speed-up over plain decoding predicted from the cost curve c and the cycles a run actually made:
    `committed` tokens at c(1) apiece, over c(q) per verify of q tokens (`verify_counts`: {q: cycles}), c(1)
    per plain step (an adaptive policy decodes plainly when drafting cannot pay) and the drafter's seconds."""
    largest = max(cost)
    seconds = (sum(n * cost[min(q, largest)] for q, n in verify_counts.items()) + plain_cycles * cost[1]
               + drafter_seconds)
    return committed * cost[1] / seconds if seconds > 0 else float("nan")

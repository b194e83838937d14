"""Per-call generation statistics: acceptance, timing, forward counts."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch


def now(device: torch.device | str | None = None) -> float:
    """Wall-clock seconds, after waiting for queued GPU work so timings are honest."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def histogram(lengths: list[int], block_size: int) -> list[int]:
    """counts[k-1] = number of cycles that committed k tokens (k = 1..block_size)."""
    counts = [0] * block_size
    for n in lengths:
        counts[n - 1] += 1
    return counts


def per_position_acceptance(lengths: list[int], drafted: list[int], block_size: int) -> list[float | None]:
    """rate[k-1] = share of cycles that accepted draft k, among cycles that proposed draft k.

    A cycle committing `n` tokens accepted drafts 1..n-1 (the n-th token is the bonus).
    None where no cycle proposed that position.
    """
    rates: list[float | None] = []
    for k in range(1, block_size):
        proposed = sum(1 for d in drafted if d >= k)
        accepted = sum(1 for n, d in zip(lengths, drafted) if d >= k and n - 1 >= k)
        rates.append(accepted / proposed if proposed else None)
    return rates


@dataclass
class GenerationStats:
    """What one generate call did. acceptance_lengths: tokens committed per cycle, bonus included."""

    block_size: int
    prompt_tokens: int = 0
    new_tokens: int = 0
    acceptance_lengths: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)  # per cycle: its deepest draft (a chain: its length)
    verified: list[int] = field(default_factory=list)  # per cycle: drafts the target verified (a tree: its nodes)
    sources: list[int] = field(default_factory=list)  # per cycle: 0 drafter, n > 0 looked up after an n-token match
    prefill_time: float = 0.0
    decode_time: float = 0.0
    drafter_time: float = 0.0
    target_forwards: int = 0
    drafter_forwards: int = 0

    @property
    def cycles(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def mean_acceptance_length(self) -> float | None:
        return sum(self.acceptance_lengths) / self.cycles if self.cycles else None

    @property
    def lookup_cycles(self) -> int:
        return sum(1 for s in self.sources if s)

    @property
    def drafter_acceptance_length(self) -> float | None:
        """Mean acceptance length over the cycles that verified the drafter's drafts (not looked-up ones)."""
        own = [n for n, s in zip(self.acceptance_lengths, self.sources) if not s]
        return sum(own) / len(own) if own else None

    @property
    def total_time(self) -> float:
        return self.prefill_time + self.decode_time

    @property
    def tokens_per_second(self) -> float:
        """New tokens over the whole call (prefill included): what a user waits for."""
        return self.new_tokens / self.total_time if self.total_time > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens produced after the first one, over decode time only."""
        return max(self.new_tokens - 1, 0) / self.decode_time if self.decode_time > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "block_size": self.block_size,
            "cycles": self.cycles,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_lengths": list(self.acceptance_lengths),
            "sources": list(self.sources),
            "lookup_cycles": self.lookup_cycles,
            "drafter_acceptance_length": self.drafter_acceptance_length,
            "acceptance_histogram": histogram(self.acceptance_lengths, self.block_size),
            "per_position_acceptance": per_position_acceptance(self.acceptance_lengths, self.drafted,
                                                               self.block_size),
            "prefill_time_s": self.prefill_time,
            "decode_time_s": self.decode_time,
            "drafter_time_s": self.drafter_time,
            "tokens_per_second": self.tokens_per_second,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "target_forwards": self.target_forwards,
            "drafter_forwards": self.drafter_forwards,
        }

    def summary(self) -> str:
        tau = self.mean_acceptance_length
        tau_s = f"{tau:.2f}" if tau is not None else "n/a (no draft)"
        if self.lookup_cycles:
            own = self.drafter_acceptance_length
            tau_s += (f" ({self.lookup_cycles} cycles looked up; drafter's own "
                      f"{'n/a' if own is None else f'{own:.2f}'})")
        return (f"{self.new_tokens} tokens in {self.total_time:.2f}s ({self.tokens_per_second:.1f} tok/s; "
                f"prefill {self.prefill_time * 1000:.0f} ms, decode {self.decode_tokens_per_second:.1f} tok/s) | "
                f"acceptance length {tau_s} over {self.cycles} cycles (block {self.block_size}) | "
                f"forwards: target {self.target_forwards}, drafter {self.drafter_forwards}")

"""Gumbel-max sampling from noise keyed by (seed, absolute position): drafter-invariant seeded sampling.

The token at absolute position t is argmax_x p_t(x) / E(seed, t, x), with E standard exponential variables
that depend on (seed, t, x) alone. That is the Gumbel-max trick in its exponential-race form (argmax
log p - log E, and -log E is a standard Gumbel variable), so it is an exact draw from p_t, including a
truncated p_t (top-k / top-p zeros never win).

Speculation uses the same noise: the drafter proposes its own race winner at each draft position, a draft is
accepted iff it equals the target's winner there, and the first mismatch commits the target's winner. So a
seeded request produces exactly the tokens plain decoding produces with that seed, whatever the drafter,
block size, verify length, lookups or batch neighbours did: only the target's distributions and the noise
decide (up to floating-point near-ties between a verify forward and a one-token step, as for greedy
decoding).

The noise is counter-based: position t's row is the splitmix64 stream of a key hashed from (seed, t), its
x-th output giving token x's uniform (53 bits). Rows can be made in any order, once each, on any device,
with the same values everywhere (int64 arithmetic). torch's CPU generator would not do: it keeps only 32
bits of a seed, so two positions' streams would collide once in ~2^32 keys.
"""
from __future__ import annotations

import secrets
from functools import lru_cache

import torch

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1, _MUL2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _splitmix64(x: int) -> int:
    """splitmix64's finaliser on a Python int: a bijection of 64-bit words whose outputs pass BigCrush."""
    x = ((x ^ (x >> 30)) * _MUL1) & _MASK
    x = ((x ^ (x >> 27)) * _MUL2) & _MASK
    return x ^ (x >> 31)


def _signed(c: int) -> int:
    """A 64-bit word as the int64 torch computes with (two's complement; products wrap)."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix_(x: torch.Tensor) -> torch.Tensor:
    """`_splitmix64` on int64 tensors, in place."""
    x ^= _shr(x, 30)
    x *= _signed(_MUL1)
    x ^= _shr(x, 27)
    x *= _signed(_MUL2)
    x ^= _shr(x, 31)
    return x


@lru_cache(maxsize=8)
def _steps(vocab: int, device: str) -> torch.Tensor:
    """(x + 1) * golden for every token x: the splitmix64 counter increments of one row."""
    return torch.arange(1, vocab + 1, dtype=torch.int64, device=device) * _signed(_GOLDEN)


def position_key(seed: int, position: int) -> int:
    """The 64-bit key of one (request seed, absolute position): the state its row's splitmix64 stream starts at."""
    return _splitmix64((_splitmix64(seed & _MASK) + (position + 1) * _GOLDEN) & _MASK)


def new_seed() -> int:
    """A fresh 63-bit seed for a request that gave none (its draws are still exact samples)."""
    return secrets.randbits(63)


def race_noise(seed: int, positions: list[int], vocab: int, device: torch.device | str) -> torch.Tensor:
    """Standard exponential variables (len(positions), vocab), float64: row i for absolute position positions[i].

    A row depends only on (seed, its position): it is the same whichever rows are asked for together."""
    keys = torch.tensor([_signed(position_key(seed, t)) for t in positions], dtype=torch.int64, device=device)
    words = _mix_(keys[:, None] + _steps(vocab, str(device)))
    u = _shr(words, 11).to(torch.float64).add_(0.5).mul_(2.0 ** -53)  # in (0, 1): never 0, never 1
    return u.log_().neg_()  # E = -log u > 0


def race_choice(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax_x p(x) / E(x) per row of probs (..., V) with exponential noise (..., V): an exact draw from p
    (Gumbel-max), never a zero-probability token."""
    return (probs.double() / noise).argmax(-1)

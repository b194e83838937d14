"""Gumbel-max sampling from noise keyed by (seed, absolute position, token): drafter-invariant seeded sampling.

The token at absolute position t is argmax_x (log p_t(x) + G(seed, t, x)), with G a standard Gumbel variable
made by a counter-based hash (splitmix64) of the seed, the position and the token id. That is an exact draw
from p_t (the Gumbel-max trick), including a truncated p_t (top-k / top-p zeros are -inf and never win).

Speculation uses the same noise: the drafter proposes argmax (log q + G) at each draft position, a draft is
accepted iff it equals the target's own Gumbel-max choice there, and the first mismatch commits the
target's choice. So a seeded request produces exactly the tokens plain decoding produces with that seed,
whatever the drafter, block size, verify length, lookups or batch neighbours did: only the target's
distributions and the noise decide (up to floating-point near-ties between a verify forward and a
one-token step, as for greedy decoding). The hash runs on the request's device in int64 arithmetic, so the
noise is the same on every device.
"""
from __future__ import annotations

import secrets

import torch

_GOLDEN = 0x9E3779B97F4A7C15
_MUL1, _MUL2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 torch multiplies with (wrapping, two's complement)."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: a bijection of 64-bit words whose outputs pass BigCrush."""
    x = (x ^ _shr(x, 30)) * _signed(_MUL1)
    x = (x ^ _shr(x, 27)) * _signed(_MUL2)
    return x ^ _shr(x, 31)


def new_seed() -> int:
    """A fresh 63-bit seed for a request that gave none (its draws are still exact samples)."""
    return secrets.randbits(63)


def noise_uniforms(seed: int, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Uniforms in (0, 1), float64, (n, vocab): row i for absolute position positions[i], column x for token x."""
    device = positions.device
    base = _mix(torch.tensor(seed, dtype=torch.int64, device=device) * _signed(_GOLDEN) + 0x632BE59BD9B4E019)
    rows = _mix(base + positions.to(torch.int64) * _signed(_GOLDEN))
    tokens = torch.arange(vocab, dtype=torch.int64, device=device) * _signed(_GOLDEN)
    bits = _shr(_mix(rows[:, None] ^ tokens[None, :]), 11)  # the top 53 bits
    return (bits.to(torch.float64) + 0.5) * 2.0 ** -53


def gumbel_noise(seed: int, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Standard Gumbel variables (n, vocab), float64, keyed by (seed, position, token)."""
    return -torch.log(-torch.log(noise_uniforms(seed, positions, vocab)))


def gumbel_choice(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax_x (log p(x) + G(x)) per row of probs (..., V) with noise (..., V): exact draws from p, never a
    zero-probability token."""
    return (probs.double().log() + noise).argmax(-1)

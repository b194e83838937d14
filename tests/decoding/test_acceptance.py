"""The sampler, proven with exact rational arithmetic.

Inputs are dyadic distributions (k / 64), so p - q, max(., 0) and cumulative sums are exact in float64 and
the code's residual converts to Fractions without error. The only inexact step is comparing a float
uniform with a rational threshold; the code's thresholds are located by probing 2^-40 on either side.
From the code's own thresholds and residuals we then compute, in Fractions, the exact probability of
every committed token and check it equals p exactly (sampled drafts, one-hot drafts, truncated rows).
"""
import random
from fractions import Fraction

import pytest
import torch

import blockdraft.decoding.acceptance as acc
from blockdraft.decoding.acceptance import greedy_verify, one_hot, speculative_verify

EPS = Fraction(1, 2**40)
DENOM = 64


def dyadic(rng: random.Random, vocab: int, zeros: int) -> list[Fraction]:
    """A random distribution with weights k/64; `zeros` entries forced to 0 (as top-k/top-p leave them)."""
    live = rng.sample(range(vocab), vocab - zeros)
    cuts = sorted(rng.choices(range(DENOM + 1), k=len(live) - 1))
    parts = [b - a for a, b in zip([0] + cuts, cuts + [DENOM])]
    w = [0] * vocab
    for i, part in zip(live, parts):
        w[i] = part
    return [Fraction(x, DENOM) for x in w]


def t64(rows) -> torch.Tensor:
    return torch.tensor([[float(x) for x in r] for r in rows], dtype=torch.float64)


def run(x: int, q_row, p_rows, u_acc: Fraction, u_smp: Fraction) -> tuple[int, int]:
    return speculative_verify(torch.tensor([x]), t64([q_row]), t64(p_rows),
                              torch.tensor([float(u_acc)], dtype=torch.float64),
                              torch.tensor(float(u_smp), dtype=torch.float64))


def acceptance_probability(x, q_row, p_rows) -> Fraction:
    """The code's probability of accepting draft x, from its threshold (checked on both sides)."""
    t = p_rows[0][x] / q_row[x]
    if t >= 1:
        assert run(x, q_row, p_rows, 1 - EPS, Fraction(0))[0] == 1
        return Fraction(1)
    if t > 0:
        assert run(x, q_row, p_rows, t - EPS, Fraction(0))[0] == 1
    assert run(x, q_row, p_rows, t + EPS, Fraction(0))[0] == 0
    return t


def token_probabilities(weights: list[Fraction], draw) -> list[Fraction]:
    """P(token) for the code's inverse-CDF draw `draw(u)` over exact weights, boundaries probed."""
    total = sum(weights)
    probs, cum = [], Fraction(0)
    for i, w in enumerate(weights):
        lo, cum = cum, cum + w
        if w > 0:
            assert draw(lo / total + EPS) == i and draw(cum / total - EPS) == i
        probs.append(w / total)
    return probs


def committed_distribution(x, q_row, p_rows) -> list[Fraction]:
    """Exact distribution of the first committed token given draft x, as the code computes it."""
    alpha = acceptance_probability(x, q_row, p_rows)
    vocab = len(q_row)
    out = [Fraction(0)] * vocab
    out[x] += alpha
    if alpha < 1:
        code_residual = acc.residual(t64([p_rows[0]])[0], t64([q_row])[0])
        weights = [Fraction(float(w)) for w in code_residual]  # exact: dyadic
        u_reject = min(alpha + EPS, 1 - EPS)
        draw = lambda u: run(x, q_row, p_rows, u_reject, u)[1]  # noqa: E731
        for y, py in enumerate(token_probabilities(weights, draw)):
            out[y] += (1 - alpha) * py
    return out


@pytest.mark.parametrize("seed", range(40))
def test_sampled_drafts_commit_exactly_p(seed):
    rng = random.Random(seed)
    vocab = rng.randint(2, 6)
    p = dyadic(rng, vocab, zeros=rng.randint(0, vocab - 1))
    q = dyadic(rng, vocab, zeros=rng.randint(0, vocab - 1))
    p_next = dyadic(rng, vocab, zeros=0)
    total = [Fraction(0)] * vocab
    for x in range(vocab):
        if q[x] > 0:  # drafts are drawn from q
            for y, pr in enumerate(committed_distribution(x, q, [p, p_next])):
                total[y] += q[x] * pr
    assert total == p


@pytest.mark.parametrize("seed", range(20))
def test_one_hot_drafts_commit_exactly_p_for_every_draft(seed):
    rng = random.Random(100 + seed)
    vocab = rng.randint(2, 6)
    p = dyadic(rng, vocab, zeros=rng.randint(0, vocab - 1))
    for x in range(vocab):  # any argmax the drafter may propose, even one p rules out
        q = [Fraction(int(i == x)) for i in range(vocab)]
        assert committed_distribution(x, q, [p, p]) == p


def test_one_hot_helper_matches_the_exact_rows():
    rows = one_hot(torch.tensor([2, 0]), 4, torch.float64)
    assert rows.tolist() == [[0, 0, 1, 0], [1, 0, 0, 0]]


def test_bonus_after_all_accepted_is_drawn_from_the_next_row():
    rng = random.Random(7)
    p, p_next = dyadic(rng, 5, 1), dyadic(rng, 5, 2)
    x = max(range(5), key=lambda i: p[i])
    q = [Fraction(int(i == x)) for i in range(5)]
    draw = lambda u: run(x, q, [p, p_next], Fraction(0), u)  # noqa: E731  u_acc = 0 accepts: p(x) > 0
    assert draw(Fraction(0))[0] == 1
    assert token_probabilities(p_next, lambda u: draw(u)[1]) == p_next


@pytest.mark.parametrize("seed", range(10))
def test_residual_is_max_p_minus_q(seed):
    rng = random.Random(200 + seed)
    p, q = dyadic(rng, 6, rng.randint(0, 5)), dyadic(rng, 6, rng.randint(0, 5))
    code = acc.residual(t64([p])[0], t64([q])[0])
    expected = [max(a - b, Fraction(0)) for a, b in zip(p, q)]
    assert [Fraction(float(w)) for w in code] == (expected if sum(expected) > 0 else p)


def test_first_rejection_uses_its_own_row():
    """Three drafts: accept the first, reject the second; the residual comes from row 1, not 0 or 2."""
    p = t64([[0.5, 0.5, 0, 0], [0, 0, 0.25, 0.75], [1, 0, 0, 0], [0, 1, 0, 0]])
    q = t64([[0.5, 0.5, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    drafts = torch.tensor([0, 2, 3])
    a, tok = speculative_verify(drafts, q, p, torch.tensor([0.0, 0.9, 0.0], dtype=torch.float64),
                                torch.tensor(0.5, dtype=torch.float64))
    assert (a, tok) == (1, 3)  # residual of row 1 = max(p1 - q1, 0) = [0, 0, 0, 0.75]


def test_broken_residual_is_caught(monkeypatch):
    """The exact check is not vacuous: sampling the rejection from p instead of max(p - q, 0) fails it."""
    monkeypatch.setattr(acc, "residual", lambda p, q: p)
    rng = random.Random(3)
    p, q = dyadic(rng, 4, 0), dyadic(rng, 4, 0)
    total = [Fraction(0)] * 4
    for x in range(4):
        if q[x] > 0:
            for y, pr in enumerate(committed_distribution(x, q, [p, p])):
                total[y] += q[x] * pr
    assert total != p


def test_greedy_verify():
    logits = torch.tensor([[0, 5.0, 0], [9.0, 0, 0], [0, 0, 1.0], [0, 3.0, 0]])
    assert greedy_verify(torch.tensor([1, 0, 2]), logits) == (3, 1)  # all accepted, bonus from the last row
    assert greedy_verify(torch.tensor([1, 2, 2]), logits) == (1, 0)  # mismatch at 2: bonus = target's choice
    assert greedy_verify(torch.tensor([0, 0, 2]), logits) == (0, 1)
    assert greedy_verify(torch.tensor([], dtype=torch.long), logits[:1]) == (0, 1)


def test_a_uniform_just_below_one_still_accepts_when_p_equals_q():
    """u < 1 and p(x) = q(x) must accept; in float32, u >= 1 - 2^-25 rounds to 1.0 and rejected."""
    q = torch.tensor([[0.3, 0.7]], dtype=torch.float32)
    p = torch.tensor([[0.3, 0.7], [0.5, 0.5]], dtype=torch.float32)
    u = torch.tensor([1 - 2.0 ** -30], dtype=torch.float64)
    assert speculative_verify(torch.tensor([1]), q, p, u, torch.tensor(0.25, dtype=torch.float64))[0] == 1

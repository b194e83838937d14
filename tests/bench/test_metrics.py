import pytest

from blockdraft.bench.metrics import (
    break_even_acceptance,
    mean_acceptance_length,
    pooled_histogram,
    pooled_per_position,
    predicted_speedup,
    speedup,
    target_tokens_per_committed,
)


def test_acceptance_is_averaged_per_prompt_then_over_prompts():
    per_prompt = [[4, 4, 4, 4], [1, 3]]  # a long prompt must not outweigh a short one
    assert mean_acceptance_length(per_prompt) == pytest.approx((4 + 2) / 2)
    assert mean_acceptance_length([[], [2, 4]]) == 3 and mean_acceptance_length([[]]) is None


def test_pooled_histogram_and_positions():
    assert pooled_histogram([[1, 3], [3, 4]], 4) == [0.25, 0.0, 0.5, 0.25]
    # four cycles of 3 drafts committing 1, 3, 3, 3 tokens (bonus included) accepted 0, 2, 2, 2 drafts
    assert pooled_per_position([[1, 3], [3, 3]], [[3, 3], [3, 3]], 4) == [0.75, 0.75, 0.0]
    # a cycle that proposed only 1 draft does not count against position 2
    assert pooled_per_position([[2], [3]], [[1], [3]], 4) == [1.0, 1.0, 0.0]


def test_cost_accounting():
    assert target_tokens_per_committed([[2, 1]], [[3, 3]]) == pytest.approx(8 / 3)
    cost = {1: 0.060, 4: 0.090, 16: 0.100}
    assert break_even_acceptance(cost, 16, 0.020) == pytest.approx(2.0)
    # 10 cycles verifying 16 tokens commit 40 (tau 4), the drafter took 0.2 s: 40 * 0.06 / (10 * 0.1 + 0.2)
    assert predicted_speedup(cost, {16: 10}, 0, 0.2, 40) == pytest.approx(2.0)
    # and 5 plain steps (an adaptive policy's), one token each at c(1)
    assert predicted_speedup(cost, {16: 10}, 5, 0.2, 45) == pytest.approx(45 * 0.06 / 1.5)
    assert predicted_speedup(cost, {20: 1}, 0, 0.0, 1) == pytest.approx(0.6)  # past the curve: its last point
    assert speedup(30.0, 15.0) == 2.0

"""Adaptive verify length: the policy's choices, and that it never changes what is generated."""
import math

import numpy as np

import pytest
import torch

from blockdraft.decoding.adaptive import DRAFTER, LOOKUP, PROBE_DRAFTS, AdaptiveVerify, CycleOutcomes
from blockdraft.decoding.engine import SpeculativeEngine
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.target import TargetModel
from tests.conftest import ARCHS, slow_unless, tiny_drafter, tiny_hf_model
from tests.decoding.test_engine import (
    PROMPT,
    VOCAB,
    chi_square_pvalue,
    decode,
    exact_joint,
    hf_greedy,
    prompts,
)

STEEP = {1: 1.0, 2: 1.2, 3: 1.5, 4: 2.0, 5: 2.6, 6: 3.3, 7: 4.0, 8: 5.0}  # seconds of a q-token verify


def test_verifies_more_drafts_when_they_are_likely_accepted():
    mild = {q: 1.0 + 0.1 * (q - 1) for q in range(1, 9)}
    for cost in (mild, STEEP):
        policy = AdaptiveVerify(cost)
        policy.accepted[:] = torch.linspace(0.05, 0.98, 10) * 100  # confident slots are accepted more
        policy.tested[:] = 100
        assert policy.choose(torch.full((7,), 0.01)) == 0
        assert 0 < policy.choose(torch.tensor([0.99, 0.99, 0.99, 0.2, 0.2, 0.2, 0.2])) <= 3
    policy = AdaptiveVerify(mild)
    policy.accepted[:], policy.tested[:] = 98, 100
    assert policy.choose(torch.full((7,), 0.99)) == 7
    policy = AdaptiveVerify(STEEP)
    policy.accepted[:], policy.tested[:] = 98, 100
    assert policy.choose(torch.full((7,), 0.99)) == 2  # 16 tokens cost 5x one: long verifies do not pay
    flat = AdaptiveVerify({q: 1.0 for q in range(1, 9)})  # a GPU: verifying more is free, so verify all
    assert flat.choose(torch.full((7,), 0.3)) == 6  # all but the 7th, which adds < 1% (the noise tolerance)


def test_drafts_only_the_slots_worth_drafting_and_probes_when_nothing_pays():
    policy = AdaptiveVerify(STEEP, probe_every=4, probe_budget=10.0)  # spacing by the interval alone
    assert 0 < policy.draft_length(7) < 7 and policy.draft_length(0) == 0  # prior: half the drafts pass
    for _ in range(60):
        policy.update(torch.full((7,), 0.5), verified=3, accepted=0, drafter_s=0.5)
    gaps = []
    for _ in range(4):  # plain cycles, then a probe drafting a few slots; probes that fail wait longer
        decisions = [policy.draft_length(7)]
        while decisions[-1] == 0 and len(decisions) < 40:
            decisions.append(policy.draft_length(7))
        gaps.append(len(decisions))
        assert decisions[-1] == PROBE_DRAFTS
        policy.update(torch.full((7,), 0.5), verified=7, accepted=0, drafter_s=0.5)
    assert gaps == [4, 8, 16, 16]
    for _ in range(150):  # the text turned predictable: recent history wins over the old failures
        policy.update(torch.full((7,), 0.9), verified=7, accepted=7, drafter_s=0.1)
    assert policy.draft_length(7) in (2, 3)  # STEEP: beyond 3 drafts the verify costs more than they add
    flat = AdaptiveVerify({q: 1.0 for q in range(1, 9)})
    for _ in range(150):
        flat.update(torch.full((7,), 0.9), verified=7, accepted=7, drafter_s=0.1)
    assert flat.draft_length(7) == 7 and flat.draft_length(5) == 5


def test_calibration_counts_only_tested_drafts():
    policy = AdaptiveVerify(STEEP)
    conf = torch.tensor([0.05, 0.15, 0.25, 0.35])
    policy.update(conf, verified=4, accepted=1, drafter_s=0.0)  # draft 1 accepted, 2 rejected, 3-4 untested
    assert policy.tested[:4].tolist() == [3, 3, 2, 2] and policy.accepted[:4].tolist() == [2, 1, 1, 1]


def test_bad_cost_curve_is_refused():
    with pytest.raises(InvalidArgumentError, match="expected positive seconds"):
        AdaptiveVerify({1: 0.0, 2: 1.0})


FLAT = {q: 1.0 + 0.01 * q for q in range(1, 9)}


@pytest.mark.parametrize("arch, cost", slow_unless([(a, c) for a in ARCHS for c in (STEEP, FLAT)], ("qwen3", STEEP),
                                                  ("llama", FLAT)),
                         ids=lambda v: {id(STEEP): "steep", id(FLAT): "flat"}.get(id(v)))
def test_adaptive_greedy_output_equals_fixed_and_plain(arch, cost):
    model = tiny_hf_model(arch, head_scale=3.0)
    target = TargetModel(model)
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=8), policy=AdaptiveVerify(cost))
    verified = []
    for prompt in prompts(4, seed=11):
        ref = hf_greedy(model, prompt, 30)
        fixed, _ = decode(engine, prompt, max_new_tokens=30)
        adaptive, stats = decode(engine, prompt, max_new_tokens=30, verify="adaptive")
        assert fixed == adaptive == ref
        verified += stats.drafted
    assert len(set(verified)) > 1 or cost is STEEP  # the policy really varies the verify length


def _adaptive_sampling_engine(seed_bias: bool = False):
    model = tiny_hf_model("qwen3", vocab=VOCAB, layers=2, head_scale=12.0, seed=5)
    target = TargetModel(model)
    policy = AdaptiveVerify({1: 1.0, 2: 1.3, 3: 1.6, 4: 2.0}, learn_costs=False)  # a curve in made-up seconds
    policy.accepted[:] = torch.linspace(0.1, 0.9, 10) * 50  # so the choice depends on the confidence
    policy.tested[:] = 50
    engine = SpeculativeEngine(target, tiny_drafter(target, std=0.5, seed=3, block_size=4), policy=policy)
    return engine, exact_joint(model)


@pytest.mark.slow
def test_adaptive_speculative_sampling_has_the_targets_distribution(monkeypatch):
    engine, joint = _adaptive_sampling_engine()
    chosen = []
    choose = engine.policy.choose
    monkeypatch.setattr(engine.policy, "choose", lambda c, rows=1: chosen.append(choose(c, rows)) or chosen[-1])
    monkeypatch.setattr(engine.policy, "update", lambda *a, **k: None)  # keep the planted calibration
    counts = _counts(engine)
    assert len(set(chosen)) >= 2, "the test must exercise several verify lengths"
    assert chi_square_pvalue(counts, joint) > 1e-3


@pytest.mark.slow
def test_choosing_the_length_from_the_drawn_tokens_would_be_detected(monkeypatch):
    """Why the policy only sees the drafter's distributions: verifying a draft only when the DRAWN token
    is a particular one biases the output, and the statistical test catches it."""
    engine, joint = _adaptive_sampling_engine()
    real_proposal = SpeculativeEngine._proposal
    favourite = int(np.argmax(joint.sum((1, 2))))

    def token_dependent(self, seq, *args):
        policy, seq.policy = seq.policy, None
        prop = real_proposal(self, seq, *args)  # all drafts, before any choice
        seq.policy = policy
        prop.confidence = (prop.drafts == favourite).float()
        keep = policy.choose(prop.confidence)
        prop.drafts, prop.q = prop.drafts[:keep], prop.q[:keep]
        return prop

    monkeypatch.setattr(SpeculativeEngine, "_proposal", token_dependent)
    monkeypatch.setattr(engine.policy, "update", lambda *a, **k: None)
    assert chi_square_pvalue(_counts(engine), joint) < 1e-3


def _counts(engine) -> np.ndarray:
    counts = np.zeros((VOCAB,) * 3)
    for seed in range(3000):
        out, _ = decode(engine, PROMPT, max_new_tokens=3, block_size=4, verify="adaptive",
                        sampling=SamplingParams(temperature=1.0, seed=seed))
        counts[tuple(out)] += 1
    return counts


def test_a_batch_drafts_only_when_its_compute_bound_verify_still_pays():
    cpu = {q: 1.0 + (0.0 if q <= 8 else 0.06 * (q - 8)) for q in range(1, 17)}  # flat, then linear
    policy = AdaptiveVerify(cpu, probe_budget=10.0)  # probes spaced by the interval alone
    for _ in range(100):  # about 40% of slot 1 and half of the later ones pass
        for accepted in (0, 0, 0, 1, 3):
            policy.update(torch.full((15,), 0.5), verified=15, accepted=accepted, drafter_s=0.1)
    assert policy.cost_of(32) == pytest.approx(1.48 + 16 * 0.06)  # extrapolated from the upper half
    assert policy.draft_length(15, rows=1) > 0  # one row: verifying a few drafts is almost free
    assert all(policy.draft_length(15, rows=8) == 0 for _ in range(5))  # 8 rows x drafts: compute-bound
    policy.skipped, policy.interval = 0, 2
    calls = [policy.draft_length(15, rows=8) for _ in range(16)]  # two cycles of 8 rows: one probe, one row
    assert calls == [0] * 15 + [PROBE_DRAFTS]
    gpu = AdaptiveVerify({q: 1.0 for q in range(1, 17)})
    for _ in range(100):
        gpu.update(torch.full((15,), 0.5), verified=15, accepted=3, drafter_s=0.01)
    assert gpu.draft_length(15, rows=8) > 0


def test_a_measured_batch_curve_replaces_the_extrapolation():
    one = {q: 1.0 for q in range(1, 9)}  # one row: a verify of up to 8 tokens costs one step
    policy = AdaptiveVerify(one)
    for _ in range(100):  # ~60% of slot 1 passes: a draft pays if it costs under ~1.6 plain steps per row
        for accepted in (0, 0, 1, 2, 3):
            policy.update(torch.full((7,), 0.5), verified=7, accepted=accepted, drafter_s=0.0)
    assert policy.forward_cost(4, 2) == 1.0  # extrapolated by total tokens: 8 tokens, one step
    assert policy.draft_length(7, rows=4) > 0
    # measured: 4 rows of q tokens cost q (compute-bound), so no draft pays for itself
    policy.set_batch_cost(4, {q: float(q) for q in range(1, 9)})
    assert policy.forward_cost(4, 2) == 2.0 and policy.forward_cost(4, 10) == pytest.approx(10.0)
    assert policy.forward_cost(1, 2) == 1.0  # one row keeps its own curve
    assert policy.forward_cost(3, 2) == pytest.approx(1.0 + (2.0 - 1.0) * 2 / 3)  # between 1 and 4 rows
    assert policy.forward_cost(7, 2) == pytest.approx(1.0 + (2.0 - 1.0) * 6 / 3)  # past the largest measured
    assert policy.choose(torch.full((7,), 0.95)) > 0  # one row: verifying is free
    assert policy.choose(torch.full((7,), 0.95), rows=4) == 0  # 4 rows: each draft costs a step
    policy.set_batch_cost(8, {q: 3.0 * q for q in range(1, 9)})
    assert policy.forward_cost(6, 2) == pytest.approx(2.0 + (6.0 - 2.0) * 2 / 4)  # between 4 and 8 rows
    assert policy.forward_cost(10, 2) == pytest.approx(2.0 + (6.0 - 2.0) * 6 / 4)  # along the 4-8 line
    assert all(policy.draft_length(7, rows=4) == 0 for _ in range(3))
    with pytest.raises(InvalidArgumentError, match="rows=1"):
        policy.set_batch_cost(1, one)
    with pytest.raises(InvalidArgumentError, match="q = 1..B"):
        policy.set_batch_cost(4, {1: 1.0, 3: 2.0})
    with pytest.raises(InvalidArgumentError, match="probe_budget=0"):
        AdaptiveVerify(one, probe_budget=0)


def test_probes_are_spaced_to_cost_at_most_the_budget():
    batch = {q: float(q) for q in range(1, 9)}  # 4 rows: compute-bound, a 1-draft probe doubles the step
    policy = AdaptiveVerify({q: 1.0 for q in range(1, 9)}, probe_every=2, probe_budget=0.05)
    policy.set_batch_cost(4, batch)
    for _ in range(100):
        policy.update(torch.full((7,), 0.5), verified=7, accepted=0, drafter_s=0.5)
    # per probe: one row verifies its 4 drafts, c_4(5) - c_4(1) = 4.0, + drafter 0.5 = 4.5 = 5% of the probed
    # row's share of 360 plain steps (a quarter of each)
    assert policy._probe_spacing(4) == pytest.approx(360.0)
    cycles = 0
    while policy.draft_length(7, rows=4) == 0:
        cycles += 1 / 4
    assert cycles == pytest.approx(360.0, abs=0.25)
    # one row: a 4-draft verify costs one step, so only the drafter counts: 0.5 / (0.05 * 1.0) = 10 cycles
    assert policy._probe_spacing(1) == pytest.approx(10.0)


def test_lookups_are_verified_when_they_should_commit_more_than_the_drafter():
    policy = AdaptiveVerify({q: 1.0 + 0.05 * q for q in range(1, 9)})
    assert policy.ngram_rate(3) == 0.5  # the prior
    for _ in range(20):
        policy.update_ngram(3, 7, 7)  # 3-token matches: every looked-up draft passes
        policy.update_ngram(1, 7, 0)  # 1-token matches: none does
        policy.update(torch.full((7,), 0.05), 7, 0, 0.1)  # and the drafter's slot 1 fails
    assert policy.ngram_rate(3) > 0.95 and policy.ngram_rate(1) < 0.1
    assert policy.ngram_length(3, 7) == 7
    assert policy.ngram_length(1, 7) == 0  # a plain step commits more per second
    assert policy.ngram_length(3, 0) == 0


@pytest.mark.parametrize("arch", slow_unless(ARCHS, "qwen3"))
def test_adaptive_lookups_keep_greedy_output_the_targets(arch):
    model = tiny_hf_model(arch, head_scale=3.0)
    target = TargetModel(model)
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=8), policy=AdaptiveVerify(STEEP))
    for prompt in prompts(4, seed=23):
        prompt = prompt + prompt
        out, _ = decode(engine, prompt, max_new_tokens=30, ngram=True, verify="adaptive")
        assert out == hf_greedy(model, prompt, 30)
    assert engine.policy.ngram_tested, "the policy must have verified looked-up drafts"


def test_a_lookup_in_a_batch_pays_for_its_own_tokens_in_the_ragged_verify():
    policy = AdaptiveVerify({q: 1.0 for q in range(1, 9)})  # one row: a verify costs one step
    # 8 rows, one of them verifying q tokens: +30% for the first extra token, +5% for each further one
    policy.set_batch_cost(8, {q: 1.0 + (0.0 if q == 1 else 0.25 + 0.05 * (q - 1)) for q in range(1, 9)})
    for _ in range(20):
        policy.update_ngram(3, 7, 7)
    assert policy.ngram_length(3, 7, rows=1) == 7
    # one row's 7 sure drafts: 15 tokens in 1.6 steps, 1.17x a plain step's 8 in 1
    assert policy.ngram_length(3, 7, rows=8) == 7
    # compute-bound (each extra token costs a row's share of a step): 15 tokens in 1.875 steps, plain is better
    policy.set_batch_cost(8, {q: 1.0 + (q - 1) / 8 for q in range(1, 9)})
    assert policy.ngram_length(3, 7, rows=8) == 0


def test_rows_with_lookups_are_planned_together_and_share_the_first_extra_tokens_cost():
    policy = AdaptiveVerify({q: 1.0 for q in range(1, 17)})
    # 8 rows: the first extra token costs 20% of a step (the batch leaves the one-query kernels), each further
    # one 3% (compute-bound, but cheaper than a row's share, 12.5%)
    policy.set_batch_cost(8, {q: 1.0 + (0.0 if q == 1 else 0.17 + 0.03 * (q - 1)) for q in range(1, 17)})
    for _ in range(20):
        policy.update_ngram(3, 1, 1)  # 3-token matches: every looked-up draft passes
        policy.update_ngram(1, 1, 0)  # 1-token matches: none does
    rate = policy.ngram_rate(3)
    assert rate > 0.95 and policy.ngram_rate(1) < 0.1
    assert policy.ngram_length(3, 1, rows=8) == 0  # alone: 1 + 0.95 tokens for 0.2 of a step, < 8 * 1.05 / 1
    # four rows' sure drafts together: 12 + 4 chances for 1.29 steps; each row's second draft adds more
    counts = policy.ngram_lengths([(3, 2), (1, 2), (3, 2), (3, 2), (3, 2)], rows=8)
    assert counts[1] == 0 and sorted(counts) == [0, 2, 2, 2, 2]
    # the most likely drafts go first: a row's third draft (0.95^3) before another row's first (2-token
    # matches: 1 pass in 3 tests), which adds less than the 1% tolerance
    policy.update_ngram(2, 1, 0)
    assert policy.ngram_lengths([(3, 3), (2, 3)], rows=8) == [3, 0]


def test_a_match_length_never_tested_gets_one_draft_verified_until_it_has_been_tried():
    from blockdraft.decoding.adaptive import LOOKUP_TRIALS

    policy = AdaptiveVerify({q: 1.0 for q in range(1, 9)})
    policy.set_batch_cost(8, {q: 1.0 + 0.2 * (q > 1) + 0.1 * (q - 1) for q in range(1, 9)})
    tried = 0
    while policy.ngram_lengths([(1, 4), (3, 4)], rows=8) == [1, 0]:  # at the prior's 0.5 no plan pays
        policy.update_ngram(1, 1, 0)
        tried += 1
    assert tried == LOOKUP_TRIALS
    assert policy.ngram_lengths([(1, 4), (3, 4)], rows=8) == [0, 1]  # then the next untried length
    for _ in range(LOOKUP_TRIALS):
        policy.update_ngram(3, 1, 0)
    assert policy.ngram_lengths([(1, 4), (3, 4)], rows=8) == [0, 0]  # both known to fail: plain


def test_in_a_batch_speculation_must_beat_plain_by_a_margin():
    policy = AdaptiveVerify({1: 1.0, 2: 1.0})
    for _ in range(50):
        policy.update_ngram(3, 1, 1)  # looked-up drafts after 3-token matches always pass
        policy.update(torch.full((1,), 0.05), 1, 0, 0.0)  # the drafter's never do
    policy.set_batch_cost(8, {1: 1.0, 2: 1.1})  # one row's draft adds 10% to the batch's step
    assert policy.ngram_length(3, 1, rows=8) == 0  # 9 tokens in 1.1 steps: only 2% over 8 in one
    policy.set_batch_cost(8, {1: 1.0, 2: 1.05})
    assert policy.ngram_length(3, 1, rows=8) == 1  # 7% over
    assert policy.ngram_length(3, 1, rows=1) == 1


def test_observed_forwards_correct_a_curve_that_is_wrong_in_shape():
    measured = {q: 1.0 + 0.3 * (q - 1) for q in range(1, 9)}  # priced under load: verifies look dear
    true = {q: 0.9 * (1.0 + 0.05 * (q - 1)) for q in range(1, 9)}
    policy = AdaptiveVerify(measured)
    policy.accepted[:], policy.tested[:] = 50, 100
    before = policy.choose(torch.full((7,), 0.9))
    for i in range(300):  # the policy only ever verifies 1, 2 or 3 tokens
        q = 1 + i % 3
        policy.observe(q, true[q])
    for q in (1, 2, 3):
        assert policy.forward_cost(1, q) == pytest.approx(true[q], rel=0.08)  # neighbours differ by 10-25%
    for q in (4, 5):  # unobserved neighbours move towards the truth
        assert true[q] < policy.forward_cost(1, q) < 0.9 * measured[q]
    # a distant size keeps the curve's shape, at the level the observed sizes run at (0.74x the curve)
    level = math.exp(sum(math.log(true[q] / measured[q]) for q in (1, 2, 3)) / 3)
    assert policy.forward_cost(1, 8) == pytest.approx(level * measured[8], rel=0.05)
    assert policy.choose(torch.full((7,), 0.9)) > before


def test_observations_that_agree_with_the_curve_change_nothing():
    policy = AdaptiveVerify(STEEP)
    for i in range(100):
        policy.observe(1 + i % 8, STEEP[1 + i % 8])
    policy.observe(2, 0.0)  # nonsense timings are ignored
    policy.observe(0, 1.0)
    assert [policy.forward_cost(1, q) for q in STEEP] == pytest.approx(list(STEEP.values()), rel=1e-9)
    assert policy.drift[1].seen == 100
    trusting = AdaptiveVerify(STEEP, learn_costs=False)
    for _ in range(100):
        trusting.observe(3, 10 * STEEP[3])
    assert trusting.forward_cost(1, 3) == STEEP[3]


def test_a_machine_slower_than_its_curve_does_not_make_unverified_sizes_look_cheap():
    """A policy that decodes plainly only ever observes q = 1. When those forwards run 1.5x the curve (a
    loaded machine, long contexts), verifying drafts must still cost what the curve says relative to a plain
    step: correcting q = 1 alone made drafts look 1.5x cheaper and drafting start where it loses."""
    policy = AdaptiveVerify(STEEP)
    policy.set_batch_cost(8, {q: 1.0 + 0.25 * (q - 1) for q in range(1, 9)})
    for _ in range(200):
        policy.observe(8, 1.5, rows=8)
    for q in range(1, 9):
        assert policy.forward_cost(8, q) / policy.forward_cost(8, 1) == pytest.approx(1.0 + 0.25 * (q - 1), rel=1e-6)
    assert policy.forward_cost(8, 1) == pytest.approx(1.5, rel=0.01)
    for _ in range(50):
        policy.update_ngram(2, 2, 2)  # looked-up drafts pass: worth it at the curve's prices?
    before = policy.ngram_length(2, 2, rows=8)
    fresh = AdaptiveVerify(STEEP)
    fresh.set_batch_cost(8, {q: 1.0 + 0.25 * (q - 1) for q in range(1, 9)})
    fresh.ngram_passed, fresh.ngram_tested = dict(policy.ngram_passed), dict(policy.ngram_tested)
    assert before == fresh.ngram_length(2, 2, rows=8) == 0  # as on the curve's own machine: 2 drafts cost 1.5 steps


def test_each_batch_size_learns_its_own_correction():
    policy = AdaptiveVerify({q: 1.0 for q in range(1, 5)})
    policy.set_batch_cost(4, {q: 2.0 for q in range(1, 5)})
    for _ in range(100):
        policy.observe(5, 4.0, rows=4)  # 5 tokens over 4 rows: one row verifies 2
    assert policy.forward_cost(4, 2) == pytest.approx(4.0, rel=0.1)
    assert policy.forward_cost(1, 2) == 1.0


def test_ragged_forwards_count_their_extra_tokens_as_one_rows():
    policy = AdaptiveVerify({q: 1.0 + 0.1 * q for q in range(1, 5)})
    assert policy.forward_cost(4, 2) == policy.cost_of(5)  # no batch curve: by total tokens, 3 + 2
    policy.set_batch_cost(4, {q: float(q) for q in range(1, 5)})
    for _ in range(100):  # 4 rows, two of them verifying 2 tokens: 6 tokens, priced as one row's 3
        policy.observe(6, 6.0, rows=4)
    assert policy.forward_cost(4, 3) == pytest.approx(6.0, rel=0.1)
    assert policy.forward_cost(4, 1) == pytest.approx(2.0, rel=0.1)  # the one size seen sets every size's level
    policy.observe(3, 1.0, rows=4)  # fewer tokens than rows: not a forward of these rows, ignored
    assert policy.drift[4].seen == 100


def _paying_batch_policy() -> AdaptiveVerify:
    """8 rows where, by the model, one row's sure looked-up drafts pay (a draft adds 5% to the step)."""
    policy = AdaptiveVerify({q: 1.0 for q in range(1, 9)})
    policy.set_batch_cost(8, {q: 1.0 + 0.05 * (q - 1) for q in range(1, 9)})
    for _ in range(20):
        policy.update_ngram(3, 7, 7)
    return policy


def test_a_batch_size_whose_speculative_cycles_commit_less_per_second_decodes_plainly():
    policy = _paying_batch_policy()
    assert policy.ngram_length(3, 7, rows=8) == 7
    for _ in range(10):  # measured: cycles with lookups commit 12 tokens in 1.5 s, plain ones 8 in 0.9 s
        policy.cycle_done(8, LOOKUP, 12, 1.5)
        policy.cycle_done(8, None, 8, 0.9)
    assert policy.plain_cycle(8, LOOKUP) and policy.ngram_length(3, 7, rows=8) == 0
    assert not policy.plain_cycle(8, DRAFTER)  # the drafter has its own verdict: lookups losing do not stop it
    assert policy.ngram_length(3, 7, rows=4) == 7  # another batch size keeps its own verdict
    for _ in range(200):  # the drafts start to pay (say the requests now repeat themselves more)
        policy.cycle_done(8, LOOKUP, 16, 1.2)
    policy.cycle_done(8, None, 8, 0.9)
    assert not policy.plain_cycle(8, LOOKUP) and policy.ngram_length(3, 7, rows=8) == 7
    policy.cycle_done(1, LOOKUP, 1, 1.0)  # one row alone is left to the model
    assert 1 not in policy.outcomes


def test_a_kind_that_lost_is_tried_again_once_its_cycles_fade():
    outcomes = CycleOutcomes()
    for _ in range(6):  # a bad start: the drafter's cycles commit 2 tokens in 0.1 s, plain ones 2 in 0.07 s
        outcomes.add(DRAFTER, 2, 0.1)
        outcomes.add(None, 2, 0.07)
    assert outcomes.use_baseline(DRAFTER) and not outcomes.use_baseline(LOOKUP)
    plain = trials = 0
    while outcomes.use_baseline(DRAFTER):  # plain cycles until the old verdict fades, then one drafting cycle
        outcomes.add(None, 2, 0.07)
        plain += 1
        if not outcomes.use_baseline(DRAFTER):  # tried again: drafting now pays, 3 tokens in 0.08 s
            outcomes.add(DRAFTER, 3, 0.08)
            trials += 1
        assert plain < 400
    assert plain > 60 and 1 < trials < 8  # each trial a few dozen plain cycles apart, and few trials to recover
    assert not outcomes.losing(DRAFTER)
    with pytest.raises(InvalidArgumentError, match="'sampled'"):
        outcomes.add("sampled", 1, 0.1)


def test_a_batch_size_where_the_drafter_lost_does_not_probe_until_the_verdict_fades():
    policy = AdaptiveVerify(STEEP, probe_every=2, probe_budget=10.0)  # nothing pays: only probes would draft
    assert any(policy.draft_length(15, rows=2) for _ in range(8))  # probes, one row of a 2-row batch at a time
    for _ in range(6):  # measured: the drafter's cycles at 2 rows commit less per second than plain ones
        policy.cycle_done(2, DRAFTER, 3, 0.2)
        policy.cycle_done(2, None, 2, 0.1)
    assert not any(policy.draft_length(15, rows=2) for _ in range(40))
    assert any(policy.draft_length(15, rows=1) for _ in range(40))  # one row alone still probes
    for _ in range(100):
        policy.cycle_done(2, None, 2, 0.1)
    assert any(policy.draft_length(15, rows=2) for _ in range(40))  # faded: probing again


def test_a_batch_that_always_drafts_still_runs_a_plain_cycle_to_compare_with():
    policy = _paying_batch_policy()
    plain = []
    for _ in range(40):
        skip = policy.plain_cycle(8, LOOKUP)
        plain.append(skip)
        policy.cycle_done(8, None if skip else LOOKUP, 8 if skip else 14, 1.0)  # drafting pays: 14 tokens, not 8
    assert plain.count(True) == 2 and plain[16] and plain[33]  # one in 17: after 16 speculative cycles

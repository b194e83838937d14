"""The adaptive policy with draft trees: each node's reach, the prefix worth verifying, what a tree cycle
teaches the calibration and the slot history, and a batch size's measured verdict of trees against chains."""
from __future__ import annotations

import pytest
import torch

import blockdraft.decoding.engine as engine_module
from blockdraft.decoding import tree as tree_module
from blockdraft.decoding.adaptive import CHAIN, DRAFTER, LOOKUP, TREE, AdaptiveVerify
from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.stats import GenerationStats
from blockdraft.decoding.tree import DraftTree
from blockdraft.modeling.fast_target import FastTarget
from tests.conftest import chain, tiny_drafter, tiny_hf_model

pytestmark = pytest.mark.usefixtures("one_thread")


FLAT = {q: 1.0 for q in range(1, 34)}  # verifying more costs nothing (a GPU)
LINEAR = {q: float(q) for q in range(1, 34)}  # every token costs a plain step


def policy_with_rates(cost: dict[int, float]) -> AdaptiveVerify:
    """A policy whose calibrated acceptance in confidence bin b (of 10) is (b + 0.5) / 10."""
    policy = AdaptiveVerify(cost)
    policy.accepted[:] = torch.arange(10, dtype=torch.float64) + 0.5
    policy.tested[:] = 10.0
    return policy


def hand_tree() -> DraftTree:
    """root -> 1 (p 0.93) -> 3 (p 0.57) -> 5 (p 0.26)
            -> 2 (p 0.21) -> 4 (p 0.97)"""
    return DraftTree(torch.tensor([10, 11, 12, 13, 14]), [0, 0, 1, 2, 3], [1, 1, 2, 2, 3],
                     [0.93, 0.21, 0.57, 0.97, 0.26])


# ---------------------------------------------------------------- reach
def test_a_nodes_reach_is_its_parents_times_its_calibrated_rate():
    policy = policy_with_rates(FLAT)
    # rates: bin 9 -> 0.95, bin 2 -> 0.25, bin 5 -> 0.55
    expected = [0.95, 0.25, 0.95 * 0.55, 0.25 * 0.95, 0.95 * 0.55 * 0.25]
    assert policy.tree_reach(hand_tree()).tolist() == pytest.approx(expected, rel=1e-12)
    assert policy.tree_reach(hand_tree().prefix(3)).tolist() == pytest.approx(expected[:3], rel=1e-12)


def test_looked_up_nodes_reach_with_their_match_lengths_rate():
    policy = policy_with_rates(FLAT)
    policy.ngram_passed[3], policy.ngram_tested[3] = 8.0, 10.0  # 3-token matches: 0.8
    tree = DraftTree(torch.tensor([5, 6, 7, 8]), [0, 1, 1, 0], [1, 2, 2, 1], [1.0, 1.0, 0.57, 0.21], lookup=2)
    assert policy.tree_reach(tree, match=3).tolist() == pytest.approx([0.8, 0.64, 0.8 * 0.55, 0.25], rel=1e-12)
    assert policy.tree_reach(tree, match=1).tolist() == pytest.approx([0.5, 0.25, 0.5 * 0.55, 0.25], rel=1e-12)


# ---------------------------------------------------------------- the prefix worth verifying
def test_no_node_is_verified_when_verifying_is_too_expensive():
    policy = policy_with_rates(LINEAR)
    assert policy.tree_size(hand_tree()) == 0  # a node adds < 1 token and costs a plain step
    low = DraftTree(torch.arange(8), [0] * 8, [1] * 8, [0.05] * 8)  # eight unlikely siblings
    assert policy_with_rates({q: 1.0 + 0.1 * (q - 1) for q in range(1, 34)}).tree_size(low) == 0


def test_a_cheap_verify_takes_the_prefix_within_tolerance_of_the_best():
    policy = policy_with_rates(FLAT)
    tree = hand_tree()
    committed = 1 + torch.tensor([0.0, *policy.tree_reach(tree).tolist()]).cumsum(0)  # over flat costs
    expected = next(n for n, c in enumerate(committed.tolist()) if c >= 0.99 * max(committed.tolist()))
    assert policy.tree_size(tree) == expected == 5  # every node adds more than the 1% tolerance
    mild = policy_with_rates({q: 1.0 + 0.2 * (q - 1) for q in range(1, 34)})
    rate = [(1 + sum(mild.tree_reach(tree).tolist()[:n])) / (1 + 0.2 * n) for n in range(6)]
    assert mild.tree_size(tree) == rate.index(max(rate)) == 3  # nodes 4, 5 (reach 0.24, 0.13) do not pay 0.2
    assert 0 < mild.tree_size(tree) < policy.tree_size(tree)
    # 4 rows share the verify (extrapolated: c(4 + n)); rates (4 + 0, 4.95, 5.2, 5.72, 5.96, 6.09) over
    # (1.6, 1.8, ..., 2.6) peak at one node
    assert mild.tree_size(tree, rows=4) == 1


def test_the_prefix_stays_within_the_measured_cost_curve():
    tree = chain(torch.arange(40), [0.95] * 40)
    assert policy_with_rates(FLAT).tree_size(tree) == 32  # q = 1..33: 32 nodes priced
    assert policy_with_rates({q: 1.0 for q in range(1, 10)}).tree_size(tree) == 8


# ---------------------------------------------------------------- learning from a tree cycle
def test_a_tree_cycle_calibrates_the_tested_nodes_and_counts_its_depth_in_the_slot_history():
    policy = AdaptiveVerify(FLAT)
    tested0, accepted0 = policy.tested.clone(), policy.accepted.clone()
    policy.update_tree(hand_tree(), [2, 4], drafter_s=0.3)
    # tested: nodes 1 (0.93, bin 9, rejected), 2 (0.21, bin 2, accepted), 4 (0.97, bin 9, accepted)
    assert (policy.tested - tested0).tolist() == [0, 0, 1, 0, 0, 0, 0, 0, 0, 2]
    assert (policy.accepted - accepted0).tolist() == [0, 0, 1, 0, 0, 0, 0, 0, 0, 1]
    # depth 2 reached in a tree of depth 3: slots 1, 2 passed, slot 3 failed (the prior stays put under decay)
    assert policy.slot_tested[:4].tolist() == pytest.approx([3.0, 3.0, 3.0, 2.0])
    assert policy.slot_passed[:4].tolist() == pytest.approx([2.0, 2.0, 1.0, 1.0])
    assert policy.drafter_s == 0.3
    policy.update_tree(hand_tree(), [1, 3, 5], drafter_s=0.5)  # to full depth: three slots passed, none failed
    assert policy.slot_passed[:4].tolist() == pytest.approx([2.98, 2.98, 2.0, 1.0])  # decay: 0.98 x + 0.02 prior
    assert policy.slot_tested[:4].tolist() == pytest.approx([3.98, 3.98, 3.98, 2.0])
    assert policy.drafter_s == pytest.approx(0.9 * 0.3 + 0.1 * 0.5)


def test_looked_up_nodes_are_not_counted_in_the_drafters_calibration():
    policy = AdaptiveVerify(FLAT)
    tested0, accepted0 = policy.tested.clone(), policy.accepted.clone()
    tree = DraftTree(torch.tensor([5, 6, 7, 8]), [0, 1, 1, 0], [1, 2, 2, 1], [1.0, 1.0, 0.57, 0.21], lookup=2)
    policy.update_tree(tree, [1, 3], drafter_s=0.1)
    # tested: 1 (looked up), 4 (0.21, bin 2, rejected), 2 (looked up), 3 (0.57, bin 5, accepted)
    assert (policy.tested - tested0).tolist() == [0, 0, 1, 0, 0, 1, 0, 0, 0, 0]
    assert (policy.accepted - accepted0).tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert policy.slot_tested[:3].tolist() == pytest.approx([3.0, 3.0, 2.0])  # depth 2 of 2 reached


def test_an_empty_tree_teaches_nothing_but_the_drafters_time():
    policy = AdaptiveVerify(FLAT)
    before = [t.clone() for t in (policy.tested, policy.accepted, policy.slot_tested, policy.slot_passed)]
    policy.update_tree(hand_tree().prefix(0), [], drafter_s=0.2)
    after = (policy.tested, policy.accepted, policy.slot_tested, policy.slot_passed)
    assert all(torch.equal(a, b) for a, b in zip(before, after)) and policy.drafter_s == 0.2


def test_the_engine_teaches_the_policy_every_node_its_walks_tested(monkeypatch):
    """Decoding with trees and adaptive verify: the calibration counts grow by exactly the nodes the walks
    tested, and its accepted counts by the rows they accepted."""
    target = FastTarget(tiny_hf_model("qwen3", vocab=12, layers=2, head_scale=0.7, seed=4))
    policy = AdaptiveVerify({q: 1.0 + 0.02 * q for q in range(1, 34)}, learn_costs=False)
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=6, std=0.05, seed=2), policy=policy)
    walks, real = [], engine_module.walk
    monkeypatch.setattr(engine_module, "walk", lambda tree, choose: walks.append((tree, real(tree, choose))) or
                        walks[-1][1])
    tested0, accepted0 = float(policy.tested.sum()), float(policy.accepted.sum())
    stats = GenerationStats(1)
    for _ in engine.decode([3, 1, 4, 1, 5], DecodeOptions(max_new_tokens=40, tree=8, verify="adaptive"), stats):
        pass
    checked = [hit for tree, (path, _) in walks for _, hit in tree_module.tested(tree, path)]
    assert len(walks) >= 5 and sum(checked) > 0
    assert float(policy.tested.sum()) - tested0 == len(checked)
    assert float(policy.accepted.sum()) - accepted0 == sum(checked)


# ---------------------------------------------------------------- trees against chains, measured per batch size
def test_a_batch_size_where_trees_lost_to_chains_drafts_chains_until_the_verdict_fades():
    policy = AdaptiveVerify(LINEAR)
    assert not policy.chain_cycle(4)  # nothing measured: the model decides
    for _ in range(6):  # at 4 rows, tree cycles commit 5 tokens in 0.2 s, chain cycles 5 in 0.15 s
        policy.cycle_done(4, DRAFTER, 5, 0.2, shape=TREE)
        policy.cycle_done(4, DRAFTER, 5, 0.15, shape=CHAIN)
    assert policy.chain_cycle(4)
    assert not policy.chain_cycle(2) and not policy.chain_cycle(1)  # other batch sizes keep their own verdict
    assert not policy.plain_cycle(4, DRAFTER)  # and drafting itself still pays there
    chains = 0
    while policy.chain_cycle(4):  # chains until the trees' record fades, then a tree cycle is tried again
        policy.cycle_done(4, DRAFTER, 5, 0.15, shape=CHAIN)
        chains += 1
        assert chains < 400
    assert chains > 60
    before = {k: list(v) for k, v in policy.shapes[4].sums.items()}
    for kind in (None, LOOKUP):  # cycles without the drafter have no shape to judge
        policy.cycle_done(4, kind, 4, 0.1, shape=TREE)
    policy.cycle_done(4, DRAFTER, 4, 0.1)  # nor do drafter cycles where no row asked for trees
    assert policy.shapes[4].sums == before
    policy.cycle_done(1, DRAFTER, 3, 0.01, shape=TREE)  # one row alone is left to the model
    assert set(policy.shapes) == {4}


def test_where_trees_win_a_chain_cycle_still_runs_now_and_then_to_compare_with():
    policy = AdaptiveVerify(LINEAR)
    shapes = []
    for _ in range(40):
        shape = CHAIN if policy.chain_cycle(8) else TREE
        shapes.append(shape)
        policy.cycle_done(8, DRAFTER, 14 if shape == TREE else 12, 1.0, shape=shape)  # trees pay: 14 tokens, not 12
    assert shapes.count(CHAIN) == 2 and shapes[16] == shapes[33] == CHAIN  # one in 17

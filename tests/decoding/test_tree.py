"""Draft trees (`blockdraft.decoding.tree`): best-first construction against brute-force enumeration, the
looked-up branch, the layout helpers, the walk and the nodes it tests, and the slots' candidates."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from blockdraft.decoding.gumbel import race_choice, race_noise
from blockdraft.decoding import tree as tree_module  # `tested` by name would be collected as a test
from blockdraft.decoding.tree import DraftTree, best_first, slot_candidates, walk
from blockdraft.errors import InvalidArgumentError
from tests.conftest import chain


# ---------------------------------------------------------------- helpers
def random_slots(seed: int, slots: int, k: int, vocab: int = 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random drafter distributions (slots, vocab) and their k best (log-probs descending, token ids)."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(2.0 * torch.randn(slots, vocab, generator=gen, dtype=torch.float64), -1)
    log_probs, ids = slot_candidates(probs, k)
    return probs, log_probs, ids


def node_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    """Every node's path from the root as a tuple of tokens (node order)."""
    paths: list[tuple[int, ...]] = [()]
    for parent, token in zip(tree.parents, tree.tokens.tolist()):
        paths.append(paths[parent] + (token,))
    return paths[1:]


def ranked_prefixes(log_probs: torch.Tensor, ids: torch.Tensor) -> list[tuple[tuple[int, ...], float]]:
    """All prefixes of depth 1..L over each slot's k candidates, with their log-probability, best first."""
    slots, k = ids.shape
    lp, tok = log_probs.tolist(), ids.tolist()
    out = []
    for depth in range(1, slots + 1):
        for ranks in itertools.product(range(k), repeat=depth):
            out.append((tuple(tok[d][r] for d, r in enumerate(ranks)), sum(lp[d][r] for d, r in enumerate(ranks))))
    return sorted(out, key=lambda x: -x[1])


def check_shape(tree: DraftTree) -> None:
    """Parents come before children, depths follow parents, no (parent, token) twice."""
    for i, (parent, depth) in enumerate(zip(tree.parents, tree.depths), 1):
        assert 0 <= parent < i
        assert depth == (0 if parent == 0 else tree.depths[parent - 1]) + 1
    pairs = list(zip(tree.parents, tree.tokens.tolist()))
    assert len(set(pairs)) == len(pairs), "a (parent, token) pair appears twice"
    assert len(tree.tokens) == len(tree.parents) == len(tree.depths) == len(tree.probs)


# ---------------------------------------------------------------- best_first
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slots, k", [(1, 1), (1, 4), (2, 2), (3, 3), (4, 2), (4, 4), (2, 4)])
def test_best_first_holds_the_most_probable_prefixes(seed, slots, k):
    """For every budget 1..20 the tree's nodes are exactly the top-N prefixes under the product of slot
    marginals (brute force over all k + k^2 + ... + k^L prefixes), every prefix(n) is the best n-node tree,
    and each node's prob is its slot probability."""
    _, log_probs, ids = random_slots(seed, slots, k)
    ranked = ranked_prefixes(log_probs, ids)
    scores = [s for _, s in ranked]
    assert len(set(scores)) == len(scores), "ties would make the top-N ambiguous"
    for budget in range(1, 21):
        tree = best_first(log_probs, ids, budget)
        check_shape(tree)
        n = min(budget, len(ranked))
        assert len(tree) == n
        paths = node_paths(tree)
        assert paths == [p for p, _ in ranked[:n]], "nodes must come out best first"
        for m in range(n + 1):
            assert set(node_paths(tree.prefix(m))) == {p for p, _ in ranked[:m]}
        assert tree.depth == max(len(p) for p in paths)
        tok = ids.tolist()
        for d, token, prob in zip(tree.depths, tree.tokens.tolist(), tree.probs):
            assert prob == pytest.approx(math.exp(log_probs[d - 1, tok[d - 1].index(token)].item()), rel=1e-12)
        assert tree.lookup == 0


def test_best_first_stops_at_tokens_the_drafter_rules_out():
    """Candidates of probability 0 (a truncated distribution) are never nodes, even with budget to spare."""
    probs = torch.tensor([[0.7, 0.3, 0.0, 0.0], [0.6, 0.4, 0.0, 0.0]], dtype=torch.float64)
    log_probs, ids = slot_candidates(probs, 4)
    tree = best_first(log_probs, ids, 20)
    assert len(tree) == 2 + 4
    assert set(tree.tokens.tolist()) == {0, 1}
    assert best_first(log_probs, ids, 0).tokens.numel() == 0


@pytest.mark.parametrize("budget", [0, 1, 3, 7])
def test_best_first_of_no_slots_is_empty_unless_looked_up(budget):
    empty = torch.empty(0, 0, dtype=torch.float64)
    assert len(best_first(empty, empty.long(), budget)) == 0
    tree = best_first(empty, empty.long(), budget, lookup=[4, 5])
    assert tree.tokens.tolist() == [4, 5][:budget] and tree.lookup == min(budget, 2)


def test_best_first_refuses_bad_arguments():
    _, log_probs, ids = random_slots(0, 2, 2)
    for bad in (-1, 2.0, "3"):
        with pytest.raises(InvalidArgumentError, match=repr(bad).replace(".", r"\.")):
            best_first(log_probs, ids, bad)
    with pytest.raises(InvalidArgumentError, match="same"):
        best_first(log_probs, ids[:, :1], 3)


# ---------------------------------------------------------------- the looked-up branch
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mode", ["drafter's best", "second rank", "foreign", "long"])
def test_a_looked_up_branch_comes_first_and_merges_with_equal_drafter_nodes(seed, mode):
    """lookup=[...]: nodes 1..m are the looked-up chain (prob 1, tree.lookup = m); a drafter node equal to a
    looked-up one is that node (no (parent, token) pair twice) and its children grow under it; the other
    nodes are the drafter's best prefixes, as many as fill the budget exactly."""
    slots, k = 4, 3
    _, log_probs, ids = random_slots(100 + seed, slots, k)
    tok = ids.tolist()
    lookup = {"drafter's best": [tok[0][0], tok[1][0], tok[2][0]],
              "second rank": [tok[0][1], tok[1][0]],
              "foreign": [97, 98],  # tokens the drafter never proposes
              "long": [tok[0][0], tok[1][0], tok[2][0], tok[3][0], 99, 98, 97]}[mode]
    ranked = [p for p, _ in ranked_prefixes(log_probs, ids)]
    for budget in range(1, 16):
        tree = best_first(log_probs, ids, budget, lookup=lookup)
        check_shape(tree)
        m = min(budget, len(lookup))
        assert tree.lookup == m and tree.tokens[:m].tolist() == lookup[:m]
        assert tree.parents[:m] == list(range(m)) and tree.depths[:m] == list(range(1, m + 1))
        assert tree.probs[:m] == [1.0] * m
        assert len(tree) == budget
        # the node set is the looked-up prefixes plus the drafter's best K prefixes, for the K that fills it
        looked = {tuple(lookup[:d]) for d in range(1, m + 1)}
        paths = node_paths(tree)
        fills = [K for K in range(len(ranked) + 1) if len(looked | set(ranked[:K])) == budget]
        assert fills and set(paths) == looked | set(ranked[:fills[0]])
    if mode == "drafter's best":  # the branch is the drafter's best path: every drafter prefix fits, none twice
        tree = best_first(log_probs, ids, 200, lookup=lookup)
        assert len(tree) == len(ranked) == 3 + 9 + 27 + 81
        row = node_paths(tree).index((tok[0][0], tok[1][0], tok[2][0], tok[3][0]))
        assert tree.parents[row] == 3 and tree.probs[row] == pytest.approx(math.exp(log_probs[3, 0].item()))


# ---------------------------------------------------------------- layout helpers
def hand_tree() -> DraftTree:
    """root -> 1 (5) -> 3 (2) -> 6 (8)
            -> 2 (7) -> 4 (3) -> 5 (9)
                     -> 7 (2)"""
    return DraftTree(torch.tensor([5, 7, 2, 3, 9, 8, 2]), [0, 0, 1, 2, 4, 3, 2], [1, 1, 2, 2, 3, 3, 2],
                     [0.5, 0.4, 0.9, 0.3, 0.2, 0.1, 0.6])


@pytest.mark.parametrize("seed", range(4))
def test_ancestors_are_exactly_the_rows_ancestors_and_itself(seed):
    trees = [hand_tree(), best_first(*random_slots(seed, 4, 3)[1:], 17),
             best_first(*random_slots(seed, 3, 4)[1:], 12, lookup=[1, 2, 3])]
    for tree in trees:
        seen = tree.ancestors()
        n = len(tree)
        assert seen.shape == (n + 1, n + 1) and seen.dtype == torch.bool
        parent_of = [None, *tree.parents]
        for i in range(n + 1):
            expected, j = {i}, i
            while j:
                j = parent_of[j]
                expected.add(j)
            assert set(seen[i].nonzero().flatten().tolist()) == expected
        assert tree.positions() == [0, *tree.depths]
        assert tree.positions()[1:] == [int(seen[i].sum()) - 1 for i in range(1, n + 1)]  # depth = ancestors
    assert hand_tree().ancestors()[5].nonzero().flatten().tolist() == [0, 2, 4, 5]


def test_a_chain_is_a_chain():
    tree = chain(torch.tensor([4, 1, 4, 6]))
    assert tree.is_chain() and tree.parents == [0, 1, 2, 3] and tree.depths == [1, 2, 3, 4]
    assert tree.probs == [1.0] * 4 and tree.positions() == [0, 1, 2, 3, 4]
    assert torch.equal(tree.ancestors(), torch.ones(5, 5, dtype=torch.bool).tril())
    assert chain(torch.tensor([3, 3]), [0.2, 0.7]).probs == [0.2, 0.7]
    assert not hand_tree().is_chain()
    assert best_first(*random_slots(0, 4, 1)[1:], 4).is_chain()  # k = 1: the tree is the argmax chain
    assert chain(torch.tensor([], dtype=torch.long)).is_chain()


# ---------------------------------------------------------------- walk and tested
@pytest.mark.parametrize("choices, path, bonus", [
    ({0: 4}, [], 4),                                  # the root has no child with the target's token
    ({0: 5, 1: 2, 3: 8, 6: 1}, [1, 3, 6], 1),         # the first-child chain to full depth
    ({0: 7, 2: 3, 4: 9, 5: 0}, [2, 4, 5], 0),         # the root's second child, to full depth
    ({0: 7, 2: 2, 7: 6}, [2, 7], 6),                  # a sibling at depth 2 (node 7, not node 4)
    ({0: 5, 1: 3}, [1], 3),                           # node 1 has no child 3 (3 is node 2's child's token)
    ({0: 7, 2: 5}, [2], 5),                           # 5 is a token of the tree, but not under node 2
])
def test_walk_follows_the_targets_tokens(choices, path, bonus):
    asked = []

    def choose(row):
        asked.append(row)
        return choices[row]

    assert walk(hand_tree(), choose) == (path, bonus)
    assert asked == [0, *path], "the target's token is asked at the root and each accepted row, in order"


def test_tested_nodes_are_the_children_of_the_root_and_of_accepted_rows():
    tree = hand_tree()
    assert tree_module.tested(tree, []) == [(1, False), (2, False)]
    assert tree_module.tested(tree, [2]) == [(1, False), (2, True), (4, False), (7, False)]
    assert tree_module.tested(tree, [2, 7]) == [(1, False), (2, True), (4, False), (7, True)]  # node 7 has no children
    assert tree_module.tested(tree, [1, 3, 6]) == [(1, True), (2, False), (3, True), (6, True)]
    assert tree_module.tested(tree, [2, 4, 5]) == [(1, False), (2, True), (4, True), (5, True), (7, False)]
    assert tree_module.tested(chain(torch.tensor([1, 2, 3])), [1]) == [(1, True), (2, False)]


# ---------------------------------------------------------------- slot candidates
@pytest.mark.parametrize("seed", range(5))
def test_slot_candidates_rank_by_probability_and_normalise(seed):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(3, 11, generator=gen), -1)  # float32, as the engine's
    for k in (1, 4, 11, 20):
        log_probs, ids = slot_candidates(probs, k)
        assert log_probs.dtype == torch.float64 and ids.shape == (3, min(k, 11))
        assert torch.equal(ids, probs.double().argsort(-1, descending=True)[:, :min(k, 11)])
        assert torch.allclose(log_probs.exp(), probs.double().gather(1, ids) / probs.double().sum(-1, keepdim=True))
        assert bool((log_probs.exp().sum(-1) <= 1 + 1e-12).all())
        if k >= 11:
            assert torch.allclose(log_probs.exp().sum(-1), torch.ones(3, dtype=torch.float64), atol=1e-12)
        assert bool((log_probs[:, 1:] <= log_probs[:, :-1]).all())


@pytest.mark.parametrize("seed", range(5))
def test_slot_candidates_with_noise_rank_by_the_gumbel_race(seed):
    """With the gumbel sampler's noise, candidates are ranked by q / E: the first is the race's winner
    (`race_choice`), and the scores are the race's normalised weights."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(4, 13, generator=gen), -1)
    probs[1, 3] = 0.0  # a truncated token never ranks before a positive one
    noise = race_noise(seed, [10, 11, 12, 13], 13, "cpu")
    race = probs.double() / noise
    for k in (1, 5, 13):
        log_probs, ids = slot_candidates(probs, k, noise)
        assert torch.equal(ids, race.argsort(-1, descending=True)[:, :k])
        assert torch.equal(ids[:, 0], race_choice(probs, noise))
        assert torch.allclose(log_probs.exp(), race.gather(1, ids) / race.sum(-1, keepdim=True))
        assert bool((log_probs.exp().sum(-1) <= 1 + 1e-12).all())
        if k == 13:
            assert torch.allclose(log_probs.exp().sum(-1), torch.ones(4, dtype=torch.float64), atol=1e-12)
            assert ids[1, -1].item() == 3 and log_probs[1, -1].item() == -math.inf
    plain = slot_candidates(probs, 13)[1]
    assert not torch.equal(plain, slot_candidates(probs, 13, noise)[1]), "the noise must change the ranking"

"""Tree verify forwards (`TargetModel.forward(tree=)`, `FastTarget.forward(tree=)`): every row of a draft tree
sees the cache and its own ancestors only, so its logits and features are plain decoding's over its path;
`keep_path` + `rollback` leave the cache of plain decoding over the committed tokens; a batch of rows with
trees, chains, ragged lengths and scattered cache rows equals each row alone. float64 tiny targets."""
from __future__ import annotations

import pytest
import torch

from blockdraft.decoding.batch_engine import _tree_layout
from blockdraft.decoding.engine import Proposal
from blockdraft.decoding.tree import DraftTree, best_first, slot_candidates
from blockdraft.modeling.fast_target import FastTarget, _visible
from blockdraft.modeling.target import TargetModel, path_moves
from tests.conftest import chain, tiny_hf_model
from tests.modeling.test_target import _sliding_qwen2

VOCAB, ATOL = 96, 1e-10
KINDS = ("hf", "fast")


pytestmark = pytest.mark.usefixtures("one_thread")


def make_target(arch: str, kind: str, layers: int = 3) -> TargetModel:
    model = tiny_hf_model(arch, layers=layers)
    target = FastTarget(model) if kind == "fast" else TargetModel(model)
    target.set_feature_layers([0, layers - 1])
    return target


def random_tree(seed: int, slots: int = 6, k: int = 4, budget: int = 40, lookup=()) -> DraftTree:
    """A best-first tree over random drafter distributions (deep and wide)."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(1.5 * torch.randn(slots, VOCAB, generator=gen, dtype=torch.float64), -1)
    return best_first(*slot_candidates(probs, k), budget, lookup=lookup)


def hand_tree(seed: int) -> DraftTree:
    """A wide root (6 children), a chain of depth 8 under its 3rd child, a wide level (5 children) under its
    5th, and 3 grandchildren under one of those."""
    parents = [0] * 6 + [3] + list(range(7, 14)) + [5] * 5 + [15] * 3
    depths = [1] * 6 + list(range(2, 10)) + [2] * 5 + [3] * 3
    tokens = torch.randint(0, VOCAB, (len(parents),), generator=torch.Generator().manual_seed(seed))
    assert all(p < i for i, p in enumerate(parents, 1))
    return DraftTree(tokens, parents, depths, [0.5] * len(parents))


def trees() -> dict[str, DraftTree]:
    return {"best-first": random_tree(0), "best-first, lookup": random_tree(1, budget=30, lookup=[5, 17, 17, 3]),
            "hand": hand_tree(2), "one node": random_tree(3, budget=1), "root only": random_tree(4, budget=0),
            "chain": chain(torch.tensor([9, 4, 4, 60, 2]))}


def paths(tree: DraftTree) -> list[list[int]]:
    """The tokens on every row's path from the root (row 0: [])."""
    out: list[list[int]] = [[]]
    for parent, token in zip(tree.parents, tree.tokens.tolist()):
        out.append(out[parent] + [token])
    return out


def layout(tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([tree.positions()]), tree.ancestors()[None]


def plain(target: TargetModel, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and features of the last token of `tokens`, run in one forward from an empty cache."""
    logits, feats = target.forward(torch.tensor([tokens]), target.new_cache(), 0)
    return logits[0, -1], feats[0, -1]


def prefilled(target: TargetModel, prompt: list[int]):
    """A cache holding prompt[:-1] (the last prompt token is the root, not yet in the cache)."""
    cache = target.new_cache()
    target.forward(torch.tensor([prompt[:-1]]), cache, 0)
    return cache


def verify(target: TargetModel, cache, prompt: list[int], tree: DraftTree):
    ids = torch.cat([torch.tensor([prompt[-1]]), tree.tokens])[None]
    return target.forward(ids, cache, len(prompt) - 1, tree=layout(tree))


# ---------------------------------------------------------------- every row is plain decoding over its path
@pytest.mark.parametrize("kind", KINDS)
def test_every_row_of_a_tree_verify_is_plain_decoding_over_its_path(arch, kind):
    target = make_target(arch, kind)
    prompt = torch.randint(0, VOCAB, (13,), generator=torch.Generator().manual_seed(7)).tolist()
    for name, tree in trees().items():
        cache = prefilled(target, prompt)
        logits, feats = verify(target, cache, prompt, tree)
        assert logits.shape[1] == len(tree) + 1
        for row, path in enumerate(paths(tree)):
            ref_logits, ref_feats = plain(target, prompt + path)
            assert torch.allclose(logits[0, row], ref_logits, atol=ATOL), f"{name}: row {row} logits"
            assert torch.allclose(feats[0, row], ref_feats, atol=ATOL), f"{name}: row {row} features"


def test_a_tree_that_ignored_its_mask_would_be_caught(arch):
    """Negative control: the same tree verified causally (every row sees every earlier row) differs from
    plain decoding over the rows' paths."""
    target = make_target(arch, "fast")
    prompt = [3, 1, 4, 1, 5, 9, 2]
    tree = hand_tree(0)
    cache = prefilled(target, prompt)
    causal = (torch.tensor([tree.positions()]), torch.ones(len(tree) + 1, len(tree) + 1, dtype=torch.bool).tril()[None])
    logits, _ = target.forward(torch.cat([torch.tensor([prompt[-1]]), tree.tokens])[None], cache, len(prompt) - 1,
                               tree=causal)
    wrong = [row for row, path in enumerate(paths(tree))
             if not torch.allclose(logits[0, row], plain(target, prompt + path)[0], atol=ATOL)]
    assert wrong == list(range(2, len(tree) + 1))  # all but the root and node 1, whose earlier rows are ancestors


def test_a_tree_verify_on_a_sliding_window_target_is_plain_decoding_past_the_window():
    """The HF path's sliding-window masks ({layer type: mask}) also hide keys a window behind each row's own
    position (its depth, not its cache entry)."""
    target = TargetModel(_sliding_qwen2(window=8))
    target.set_feature_layers([1, 3])
    prompt = list(range(10, 24))  # past the window
    for tree in (random_tree(5, budget=25), hand_tree(6)):
        cache = prefilled(target, prompt)
        logits, feats = verify(target, cache, prompt, tree)
        for row, path in enumerate(paths(tree)):
            ref_logits, ref_feats = plain(target, prompt + path)
            assert torch.allclose(logits[0, row], ref_logits, atol=ATOL), f"row {row}"
            assert torch.allclose(feats[0, row], ref_feats, atol=ATOL), f"row {row}"


def test_the_hf_path_verifies_one_tree_at_a_time():
    target = make_target("qwen3", "hf")
    tree = random_tree(0, budget=4)
    with pytest.raises(ValueError, match="one row"):
        target.forward(torch.zeros(2, 5, dtype=torch.long), target.new_cache(), 0,
                       tree=(torch.tensor([tree.positions()] * 2), tree.ancestors()[None].repeat(2, 1, 1)))


# ---------------------------------------------------------------- the masks
def reference_visible(starts: list[int], span: int, tree: torch.Tensor) -> torch.Tensor:
    b, q, _ = tree.shape
    out = torch.zeros(b, q, span, dtype=torch.bool)
    for i, s in enumerate(starts):
        for j in range(q):
            for key in range(span):
                out[i, j, key] = key < s or (s <= key < s + q and bool(tree[i, j, key - s]))
    return out


def test_the_fast_paths_mask_is_the_cache_and_the_rows_ancestors():
    gen = torch.Generator().manual_seed(0)
    starts, q = [5, 0, 11, 7], 6
    span = max(starts) + q
    slots = torch.tensor(starts)[:, None] + torch.arange(q)
    shown = torch.rand(4, q, q, generator=gen) < 0.5  # any pattern, not only trees: it is copied as given
    assert torch.equal(_visible(slots, span, shown), reference_visible(starts, span, shown))
    tree = random_tree(2, budget=q - 1)
    shown = tree.ancestors()[None].repeat(4, 1, 1)
    seen = _visible(slots, span, shown)
    assert torch.equal(seen, reference_visible(starts, span, shown))
    causal = _visible(slots, span, None)  # without a tree: causal by slot
    assert torch.equal(causal, torch.arange(span)[None, None] <= slots[:, :, None])


def test_the_hf_paths_mask_is_finite_exactly_at_the_cache_and_the_rows_ancestors():
    target = make_target("llama", "hf")
    for start, tree in ((9, hand_tree(1)), (0, random_tree(3, budget=12)), (4, random_tree(4, budget=0))):
        positions = start + torch.tensor([tree.positions()])
        mask = target._tree_mask(start, positions, tree.ancestors()[None])
        n = len(tree) + 1
        assert mask.shape == (1, 1, n, start + n) and mask.dtype == target.dtype
        finite = torch.isfinite(mask[0, 0]) & (mask[0, 0] == 0)
        expected = torch.cat([torch.ones(n, start, dtype=torch.bool), tree.ancestors()], dim=1)
        assert torch.equal(finite, expected)
        assert bool((mask[0, 0][~expected] == torch.finfo(target.dtype).min).all())


def test_the_hf_paths_sliding_masks_hide_keys_a_window_behind_each_rows_position():
    target = TargetModel(_sliding_qwen2(window=4))
    start, tree = 6, hand_tree(3)
    positions = start + torch.tensor([tree.positions()])
    masks = target._tree_mask(start, positions, tree.ancestors()[None])
    assert isinstance(masks, dict) and set(masks) == set(target.config.layer_types)
    seen = torch.cat([torch.ones(len(tree) + 1, start, dtype=torch.bool), tree.ancestors()], dim=1)
    key_pos = torch.cat([torch.arange(start), positions[0]])
    near = key_pos[None] > positions[0][:, None] - 4
    assert torch.equal(masks["full_attention"][0, 0] == 0, seen)
    assert torch.equal(masks["sliding_attention"][0, 0] == 0, seen & near)
    assert not torch.equal(seen & near, seen)  # the window hides something here


# ---------------------------------------------------------------- keep_path + rollback
def test_path_moves():
    assert path_moves(10, []) == (None, None)
    assert path_moves(10, [1, 2, 3]) == (None, None)  # already in place
    src, dst = path_moves(10, [2, 5, 9])
    assert src.tolist() == [12, 15, 19] and dst.tolist() == [11, 12, 13]
    src, dst = path_moves(0, [1, 3])
    assert src.tolist() == [1, 3] and dst.tolist() == [1, 2]


@pytest.mark.parametrize("kind", KINDS)
def test_keep_path_then_rollback_leaves_the_cache_of_plain_decoding(arch, kind):
    """For paths through the tree (empty, first-child chains, siblings, non-consecutive rows down to full
    depth), the cache after keep_path + rollback continues exactly as plain decoding over the committed
    tokens: the next tokens' logits and features match, and so does a second tree verify on top."""
    target = make_target(arch, kind)
    prompt = [8, 3, 55, 21, 0, 13, 77, 4, 4, 31]
    tree = hand_tree(4)
    parent_of = [None, *tree.parents]

    def to_root(row):
        out = []
        while row:
            out.append(row)
            row = parent_of[row]
        return out[::-1]

    leaves = [14, 21, 22, 6, 19]  # the deep chain's end, grandchildren, a lone level-1 node, a level-2 node
    cases = [[], [1], [3], [3, 7], [3, 7, 8]] + [to_root(leaf) for leaf in leaves]
    assert any(p != list(range(1, len(p) + 1)) for p in cases)
    nxt = [17, 42, 5]
    for path in cases:
        cache = prefilled(target, prompt)
        start = len(prompt) - 1
        verify(target, cache, prompt, tree)
        target.keep_path(cache, start, path)
        target.rollback(cache, start + 1 + len(path))
        committed = prompt + tree.tokens[[r - 1 for r in path]].tolist()
        logits, feats = target.forward(torch.tensor([nxt]), cache, len(committed))
        ref_logits, ref_feats = target.forward(torch.tensor([committed + nxt]), target.new_cache(), 0)
        assert torch.allclose(logits[0], ref_logits[0, -3:], atol=ATOL), f"path {path}"
        assert torch.allclose(feats[0], ref_feats[0, -3:], atol=ATOL), f"path {path}"
        # and a second tree verify on top of the kept path
        target.rollback(cache, len(committed))
        second = random_tree(len(path), budget=8)
        logits, _ = verify(target, cache, committed + [nxt[0]], second)
        for row, p in enumerate(paths(second)):
            assert torch.allclose(logits[0, row], plain(target, committed + [nxt[0]] + p)[0], atol=ATOL)


@pytest.mark.parametrize("kind", KINDS)
def test_without_keep_path_a_sibling_path_leaves_a_wrong_cache(kind):
    """Negative control: rolling back without moving the accepted rows keeps the wrong entries."""
    target = make_target("qwen3", kind)
    prompt = [8, 3, 55, 21, 0, 13]
    tree = hand_tree(4)
    cache = prefilled(target, prompt)
    verify(target, cache, prompt, tree)
    path = [3, 7, 8]  # rows 7, 8 are not at entries start + 2, start + 3
    target.rollback(cache, len(prompt) + len(path))
    committed = prompt + tree.tokens[[r - 1 for r in path]].tolist()
    logits, _ = target.forward(torch.tensor([[17]]), cache, len(committed))
    assert not torch.allclose(logits[0, -1], plain(target, committed + [17])[0], atol=1e-6)


def test_keep_path_moves_only_its_row_of_a_static_cache():
    target = make_target("llama", "fast")
    cache = target.new_cache(rows=3, capacity=32)
    target.forward(torch.randint(0, VOCAB, (3, 20)), cache, 0)
    before_k, before_v = cache.k.clone(), cache.v.clone()
    target.keep_path(cache, 4, [3, 9], row=1)
    assert torch.equal(cache.k[:, [0, 2]], before_k[:, [0, 2]]) and torch.equal(cache.v[:, [0, 2]], before_v[:, [0, 2]])
    assert torch.equal(cache.k[:, 1, :, 5:7], before_k[:, 1, :, [7, 13]])
    assert torch.equal(cache.v[:, 1, :, 5:7], before_v[:, 1, :, [7, 13]])
    untouched = [i for i in range(32) if i not in (5, 6)]
    assert torch.equal(cache.k[:, 1, :, untouched], before_k[:, 1, :, untouched])


# ---------------------------------------------------------------- batches
def proposal(tree: DraftTree | None, drafts: list[int] | None = None) -> Proposal:
    if tree is None:
        return Proposal(torch.tensor(drafts, dtype=torch.long), None, None, 0.0)
    return Proposal(tree.tokens, None, None, 0.0, tree=tree)


SHAPES = {  # name -> the rows' proposals
    "narrow": lambda: [proposal(random_tree(10, budget=6)), proposal(None, [5, 6, 7]),
                       proposal(hand_tree(11).prefix(6)), proposal(None, [])],
    "wide": lambda: [proposal(random_tree(10, budget=24)), proposal(None, [5, 6, 7]),
                     proposal(hand_tree(11)), proposal(None, [])],
    "one tree among plain steps": lambda: [proposal(None, []), proposal(None, []), proposal(random_tree(12, budget=8)),
                                           proposal(None, []), proposal(None, []), proposal(None, [3])],
}


@pytest.mark.parametrize("view", [False, True], ids=["rows 0..b-1", "scattered rows"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_batch_of_trees_and_chains_equals_each_row_alone(arch, view, shape, monkeypatch):
    """Rows with trees of different shapes, chains and plain steps, ragged (`lengths`), at distinct starts,
    through `_tree_layout` as `Batch.cycle` builds it: each row's logits and features are those of that row
    alone (plain decoding over each node's path). "narrow" pads every row's queries to the widest; "wide" rows
    go past 16 tokens and, like "one tree among plain steps", run their further queries apart (`_extra_queries`);
    "scattered rows" verify cache rows [7, 0, 2, 3, ...] of a larger cache (`rows=`)."""
    import blockdraft.modeling.fast_target as ft

    target = make_target(arch, "fast", layers=2)
    props = SHAPES[shape]()
    b = len(props)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (9, 4, 15, 7, 11, 5)[:b]]
    rows = [7, 0, 2, 3, 4, 6][:b] if view else list(range(b))
    cache = target.new_cache(rows=8, capacity=16)
    for r in range(8):  # rows not in the batch hold something too
        target.forward(torch.randint(0, VOCAB, (1, 12), generator=gen), cache, 0, rows=[r])
    for r, p in zip(rows, prompts):
        target.rollback(cache, 0, row=r)
        target.forward(torch.tensor([p[:-1]]), cache, 0, rows=[r])
    lengths = [1 + p.drafts.numel() for p in props]
    width = max(lengths)
    ids = torch.zeros(b, width, dtype=torch.long)
    for i, (p, pr) in enumerate(zip(prompts, props)):
        ids[i, : lengths[i]] = torch.cat([torch.tensor([p[-1]]), pr.drafts])
        ids[i, lengths[i]:] = p[-1]
    plans, plan = [], ft._extra_queries
    monkeypatch.setattr(ft, "_extra_queries", lambda *a: plans.append(plan(*a)) or plans[-1])
    layout = _tree_layout(props, width, torch.device("cpu"))
    logits, feats = target.forward(ids, cache, [len(p) - 1 for p in prompts], rows=rows if view else None,
                                   lengths=lengths, tree=layout)
    monkeypatch.undo()
    assert (plans[0] is not None) == (shape != "narrow"), "the shapes cover padded and apart queries"
    for i, (p, pr, lg, fe) in enumerate(zip(prompts, props, logits.split(lengths), feats.split(lengths))):
        row_paths = paths(pr.tree) if pr.tree is not None else [pr.drafts[:k].tolist() for k in range(lengths[i])]
        for row, path in enumerate(row_paths):
            ref_logits, ref_feats = plain(target, p + path)
            assert torch.allclose(lg[row], ref_logits, atol=ATOL), f"batch row {i}, tree row {row}"
            assert torch.allclose(fe[row], ref_feats, atol=ATOL), f"batch row {i}, tree row {row}"


def test_the_batch_layout_keeps_chains_and_padding_causal():
    tree = hand_tree(0).prefix(5)
    props = [proposal(None, [1, 2]), proposal(tree), proposal(None, [])]
    assert _tree_layout([props[0], props[2]], 3, torch.device("cpu")) is None
    depths, visible = _tree_layout(props, 8, torch.device("cpu"))
    assert depths.shape == (3, 8) and visible.shape == (3, 8, 8)
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    assert depths[0].tolist() == depths[2].tolist() == list(range(8))
    assert torch.equal(visible[0], causal) and torch.equal(visible[2], causal)
    assert depths[1].tolist() == tree.positions() + [6, 7]
    assert torch.equal(visible[1, :6, :6], tree.ancestors())
    assert torch.equal(visible[1, 6:], causal[6:])

"""Decoding with draft trees (`DecodeOptions(tree=...)`): greedy output is the target's, seeded output is plain
decoding's token for token, sampled output has the target's distribution at depth, batched rows decode what
they decode alone; negative controls show the checks see a missing `keep_path` and a walk that accepts a
child without the target's draw."""
from __future__ import annotations

import time

import pytest
import torch

import blockdraft.decoding.engine as engine_module
from blockdraft.decoding.adaptive import CHAIN, DRAFTER, TREE, AdaptiveVerify
from blockdraft.decoding.batch_engine import Batch, BatchEngine
from blockdraft.decoding.engine import TREE_BUDGET, DecodeOptions, SpeculativeEngine
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.decoding.stats import GenerationStats
from blockdraft.decoding.tree import DraftTree
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.drafter import Drafter
from blockdraft.modeling.fast_target import FastTarget
from blockdraft.modeling.target import TargetModel
from tests.conftest import ARCHS, slow_unless, tiny_drafter, tiny_drafter_config, tiny_hf_model
from tests.decoding.test_engine import PlantedDrafter, decode, hf_greedy, prompts
from tests.decoding.test_sampling_depth import (  # noqa: F401  (pair: a fixture)
    PASS,
    PROMPT as DEPTH_PROMPT,
    REJECT,
    Runs,
    exact,
    pair,
    solo,
)
from tests.modeling.test_target import _sliding_qwen2

TREES = (2, 5, 16, "auto")
pytestmark = pytest.mark.usefixtures("one_thread")


def curve(n: int = TREE_BUDGET + 1, slope: float = 0.02) -> dict[int, float]:
    """A made-up cost curve over every size a tree="auto" verify can have: verifying more is cheap."""
    return {q: 1.0 + slope * q for q in range(1, n + 1)}


class SiblingDrafter(PlantedDrafter):
    """A planted drafter (test_engine) whose errors often keep the right token as the slot's second choice
    (logit 29 under the wrong token's 30): a chain would reject there, a tree holds the right token as a
    sibling and the walk takes it. Other errors leave the right token out of the top two."""

    def logits(self, hidden, lm_head):
        real = Drafter.logits(self, hidden, lm_head)
        fake = torch.zeros_like(real)
        vocab = real.shape[-1]
        for i in range(real.shape[0]):
            k = self.start + 1 + i - self.prompt_len
            right = self.continuation[k] if k < len(self.continuation) else 0
            if self.rng.random() < self.error_rate:
                fake[i, (right + 1 + self.rng.randrange(vocab - 1)) % vocab] = 30.0
                if self.rng.random() < 0.5:
                    fake[i, right] = 29.0
            else:
                fake[i, right] = 30.0
        return real * 0 + fake


def record_walks(monkeypatch) -> list[tuple[DraftTree, list[int]]]:
    """Wrap the engine's walk: every (tree, accepted path) it returns."""
    walks, real = [], engine_module.walk

    def recorded(tree, choose):
        path, bonus = real(tree, choose)
        walks.append((tree, path))
        return path, bonus

    monkeypatch.setattr(engine_module, "walk", recorded)
    return walks


def went_to_a_sibling(tree: DraftTree, path: list[int]) -> bool:
    """Whether the walk accepted a node that is not its parent's first child."""
    kids = tree.children()
    return any(row != min(kids[parent].values()) for parent, row in zip([0, *path], path))


def moved(path: list[int]) -> bool:
    """Whether keep_path has anything to move (the accepted rows are not 1..a)."""
    return path != list(range(1, len(path) + 1))


# ---------------------------------------------------------------- greedy
@pytest.mark.parametrize("arch, kind", slow_unless([(a, k) for a in ARCHS for k in ("hf", "fast")], ("qwen3", "fast"),
                                                   ("llama", "hf")))
def test_greedy_trees_equal_hf_generate(arch, kind, monkeypatch):
    """Every tree setting with fixed and adaptive verify, at planted error rates 0 / 0.3 / 0.6: the output is
    HF generate's; cycles accept nothing, some and all drafts, and walks go down siblings (paths that
    keep_path must move)."""
    model = tiny_hf_model(arch)
    target = FastTarget(model) if kind == "fast" else TargetModel(model)
    walks = record_walks(monkeypatch)
    lengths: dict[object, list[int]] = {tree: [] for tree in TREES}
    sizes: dict[object, set[int]] = {tree: set() for tree in TREES}
    siblings: dict[object, int] = {tree: 0 for tree in TREES}
    for i, prompt in enumerate(prompts(2, seed=7)):
        ref = hf_greedy(model, prompt, 24)
        for error_rate in (0.0, 0.3, 0.6):
            for tree in TREES:
                for verify in ("fixed", "adaptive"):
                    walks.clear()
                    drafter = SiblingDrafter(tiny_drafter_config(target, block_size=8)).init_weights(1).double()
                    engine = SpeculativeEngine(target, drafter.plant(ref, len(prompt), error_rate, seed=i),
                                               policy=AdaptiveVerify(curve(), learn_costs=False))
                    out, stats = decode(engine, prompt, max_new_tokens=24, tree=tree, verify=verify)
                    assert out == ref, f"prompt {i}, error rate {error_rate}, tree={tree!r}, {verify}"
                    assert stats.new_tokens == 24
                    assert sum(len(t) > 0 for t, _ in walks) == len(stats.acceptance_lengths)
                    trees = [t for t, _ in walks if len(t)]  # every cycle: the nodes verified, the depth drafted
                    assert stats.verified == [len(t) for t in trees] and stats.drafted == [t.depth for t in trees]
                    lengths[tree] += stats.acceptance_lengths
                    sizes[tree] |= {len(t) for t, _ in walks}
                    siblings[tree] += sum(went_to_a_sibling(t, p) and moved(p) for t, p in walks)
    print(f"\n{arch}, {kind}: acceptance lengths", {t: sorted(set(v)) for t, v in lengths.items()},
          "sibling paths moved by keep_path", siblings)
    for tree in TREES:
        assert max(lengths[tree]) >= 3, f"tree={tree!r}: {lengths[tree]}"
        assert 1 in lengths[tree], f"tree={tree!r}: no cycle rejected every draft"
    assert max(sizes[16]) == 16 and max(sizes["auto"]) == TREE_BUDGET
    assert max(lengths[16]) == 8  # the whole block of 7 drafts + the bonus
    assert siblings[5] >= 5 and siblings[16] >= 10 and siblings["auto"] >= 10, siblings


@pytest.mark.parametrize("kind", ["hf", "fast"])
def test_a_missing_keep_path_is_caught(kind, monkeypatch):
    """Negative control: with keep_path doing nothing, sibling paths leave the wrong K/V in the cache and the
    greedy output stops being the target's."""
    model = tiny_hf_model("qwen3")
    target = FastTarget(model) if kind == "fast" else TargetModel(model)
    monkeypatch.setattr(type(target), "keep_path", staticmethod(lambda *args, **kw: None))
    wrong = 0
    for i, prompt in enumerate(prompts(3, seed=7)):
        ref = hf_greedy(model, prompt, 24)
        drafter = SiblingDrafter(tiny_drafter_config(target, block_size=8)).init_weights(1).double()
        out, _ = decode(SpeculativeEngine(target, drafter.plant(ref, len(prompt), 0.6, seed=i)), prompt,
                        max_new_tokens=24, tree=16)
        wrong += out != ref
    print(f"\nwithout keep_path [{kind}]: {wrong} of 3 outputs differ from the target's")
    assert wrong >= 1


def test_trees_stop_at_stop_tokens_the_limit_and_the_context():
    """Stop tokens inside an accepted path, max_new_tokens and the target's context cut a tree cycle as they
    cut a chain."""
    model = tiny_hf_model("llama", max_positions=40)
    target = FastTarget(model)
    prompt = list(range(1, 31))
    ref = hf_greedy(model, prompt, 11)
    drafter = SiblingDrafter(tiny_drafter_config(target, block_size=8)).init_weights(1).double()
    engine = SpeculativeEngine(target, drafter.plant(ref, len(prompt), 0.3))
    out, _ = decode(engine, prompt, max_new_tokens=100, tree="auto")
    assert out == ref  # 40 positions: 10 more tokens and the one at the last position
    for n in (1, 2, 5, 9):
        assert decode(engine, prompt, max_new_tokens=n, tree=16)[0] == ref[:n]
    stop = ref[6]
    out, _ = decode(engine, prompt, max_new_tokens=30, tree=16, stop_token_ids=(stop,))
    assert out == ref[: ref.index(stop) + 1]


# ---------------------------------------------------------------- seeded output is plain decoding's
SEEDS = 400
SEEDED_PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
SETTINGS = [  # (temperature, top_k, top_p, sampler): seed s decodes with SETTINGS[s % 4]
    (1.0, 0, 1.0, "gumbel"),
    (0.7, 6, 1.0, "gumbel"),
    (1.0, 0, 0.85, "gumbel"),
    # the rejection sampler's walk draws each row's token with the request's next uniform, as plain decoding
    # draws each token: its seeded output is plain decoding's too
    (0.7, 0, 1.0, "rejection"),
]
SEEDED = {4: 0.15, 16: 0.25, "auto": 0.25}  # tree -> least share of cycles that commit >= 3 tokens


def verify_mode(seed: int) -> str:
    """Every setting is decoded with fixed and with adaptive verify (seeds 0-3 fixed, 4-7 adaptive, ...)."""
    return ("fixed", "adaptive")[seed // len(SETTINGS) % 2]


def seeded(seed: int, **kw) -> DecodeOptions:
    t, k, p, sampler = SETTINGS[seed % len(SETTINGS)]
    return DecodeOptions(max_new_tokens=10, sampling=SamplingParams(t, k, p, seed, "sample", sampler), **kw)


def run(engine: SpeculativeEngine, options: DecodeOptions, prompt=SEEDED_PROMPT, stats=None) -> list[int]:
    return [t for chunk in engine.decode(prompt, options, stats or GenerationStats(1)) for t in chunk]


@pytest.fixture(scope="module")
def small_pair():
    """A tiny float64 target with a 12-token vocabulary (drafts pass often) and a nearly flat random drafter."""
    target = FastTarget(tiny_hf_model("qwen3", vocab=12, layers=2, head_scale=0.7, seed=4))
    return target, tiny_drafter(target, block_size=6, std=0.05, seed=2)


@pytest.fixture(scope="module")
def plain_outputs(small_pair):
    target, _ = small_pair
    engine = SpeculativeEngine(target)
    return [run(engine, seeded(seed)) for seed in range(SEEDS)]


@pytest.mark.slow
@pytest.mark.parametrize("tree", SEEDED)
def test_seeded_tree_output_is_plain_decodings(small_pair, plain_outputs, tree, monkeypatch):
    """400 seeds (gumbel at T = 1 / 0.7 with top-k / top-p, and the rejection sampler; fixed and adaptive
    verify), each decoded with trees and checked token for token against plain decoding with that seed;
    many walks go down siblings."""
    target, drafter = small_pair
    walks = record_walks(monkeypatch)
    # the policy learns its calibration; its costs stay the curve's, so its choices do not follow the load
    engine = SpeculativeEngine(target, drafter, policy=AdaptiveVerify(curve(), learn_costs=False))
    t0, deep, cycles = time.perf_counter(), 0, 0
    for seed in range(SEEDS):
        stats = GenerationStats(1)
        out = run(engine, seeded(seed, tree=tree, verify=verify_mode(seed)), stats=stats)
        assert out == plain_outputs[seed], f"tree={tree!r}: seed {seed}, {SETTINGS[seed % len(SETTINGS)]}, " \
                                           f"{verify_mode(seed)}"
        deep += sum(n >= 3 for n in stats.acceptance_lengths)
        cycles += len(stats.acceptance_lengths)
    siblings = sum(went_to_a_sibling(t, p) and moved(p) for t, p in walks)
    print(f"\ntree={tree!r}: {deep / cycles:.0%} of {cycles} cycles committed >= 3 tokens, {siblings} walks went "
          f"down siblings, {time.perf_counter() - t0:.1f} s")
    assert siblings >= 100, f"tree={tree!r}: only {siblings} walks went down siblings"
    assert deep / cycles >= SEEDED[tree], f"tree={tree!r}: only {deep / cycles:.1%} of cycles committed >= 3 tokens"


def test_trees_with_lookups_or_a_draft_vocabulary_keep_plain_decodings_output(small_pair, monkeypatch):
    """A looked-up branch in the tree (ngram=True; fixed verify uses it whole, adaptive prices it by its match
    length) and a drafter with its own vocabulary (token 4 and 8 never drafted): greedy and seeded gumbel
    output stay plain decoding's, and walks do accept looked-up nodes."""
    target, drafter = small_pair
    narrow = tiny_drafter(target, block_size=6, std=0.05, seed=2)
    narrow.draft_vocab = torch.tensor([0, 1, 2, 3, 5, 6, 7, 9, 10, 11])
    engines = {"lookups": SpeculativeEngine(target, drafter, policy=AdaptiveVerify(curve(), learn_costs=False)),
               "draft vocabulary": SpeculativeEngine(target, narrow)}
    assert engines["draft vocabulary"].draft_ids is not None
    plain = SpeculativeEngine(target)
    walks = record_walks(monkeypatch)
    prompt = [3, 1, 4, 1, 5, 3, 1, 4]  # repeats: lookups match
    for seed in range(60):
        sampling_ = SamplingParams() if seed % 3 == 0 else SamplingParams(0.7 + 0.3 * (seed % 2), 0, 1.0, seed,
                                                                           "sample", "gumbel")
        ref = run(plain, DecodeOptions(max_new_tokens=12, sampling=sampling_), prompt)
        for name, kw in (("lookups", dict(ngram=True, tree=8)), ("lookups", dict(ngram=True, tree="auto",
                                                                                 verify="adaptive")),
                         ("draft vocabulary", dict(tree=8))):
            out = run(engines[name], DecodeOptions(max_new_tokens=12, sampling=sampling_, **kw), prompt)
            assert out == ref, f"{name} {kw}: seed {seed}"
    looked_up = [(t, p) for t, p in walks if t.lookup]
    print(f"\n{len(looked_up)} of {len(walks)} trees held a looked-up branch, "
          f"{sum(bool(p) and p[0] == 1 for _, p in looked_up)} walks accepted its first node")
    assert len(looked_up) >= 50 and sum(bool(p) and p[0] == 1 for _, p in looked_up) >= 5


def test_a_sliding_window_target_decodes_with_trees_past_its_window():
    """The HF path's {layer type: mask} tree masks: greedy output equals generate() past the window."""
    model = _sliding_qwen2(window=8)
    target = TargetModel(model)
    prompt = [5, 6, 7, 8, 9]
    ref = hf_greedy(model, prompt, 30)
    drafter = SiblingDrafter(tiny_drafter_config(target, block_size=4)).init_weights(1).double()
    engine = SpeculativeEngine(target, drafter.plant(ref, len(prompt), 0.4))
    for tree in (3, 16, "auto"):
        out, stats = decode(engine, prompt, max_new_tokens=30, tree=tree)
        assert out == ref, f"tree={tree!r}"
        assert max(stats.acceptance_lengths) == 4


def test_a_one_row_batch_on_the_hf_path_verifies_trees():
    """`Batch` over a target without the fast path (one row, as the server runs it): tree cycles through
    `Batch.cycle`'s unbatched branch decode what `decode` does."""
    model = tiny_hf_model("qwen2")
    target = TargetModel(model)
    for i, prompt in enumerate(prompts(2, seed=3)):
        ref = hf_greedy(model, prompt, 20)
        drafter = SiblingDrafter(tiny_drafter_config(target, block_size=8)).init_weights(1).double()
        engine = SpeculativeEngine(target, drafter.plant(ref, len(prompt), 0.4, seed=i))
        batch = Batch(engine, 1, capacity=64)
        batch.admit(engine.begin(prompt, DecodeOptions(max_new_tokens=20, tree=16), GenerationStats(1)), 0)
        out = batch.prefill(0)
        while batch.decoding_rows():
            out += batch.cycle()[0]
        assert out == ref


# ---------------------------------------------------------------- batches
def test_batch_rows_with_trees_decode_what_they_decode_alone(small_pair, monkeypatch):
    """Rows of a batch (5 cache rows, 24 requests) mixing tree off / 3 / auto, fixed / adaptive verify,
    greedy, gumbel and rejection sampling: greedy and gumbel rows are plain decoding's, rejection rows (fixed
    verify: the chain rows' draws depend on the verify length) the same request's alone; walks in the batch
    go down siblings (moved by keep_path in their own cache row)."""
    target, drafter = small_pair
    policy = AdaptiveVerify(curve(), learn_costs=False)
    policy.set_batch_cost(5, curve())  # made up, not measured
    engine = SpeculativeEngine(target, drafter, policy=policy)
    plain = SpeculativeEngine(target)
    kept, real_keep = [], FastTarget.keep_path

    def keep(cache, start, path, row=0):
        kept.append(path)
        real_keep(cache, start, path, row=row)

    monkeypatch.setattr(FastTarget, "keep_path", staticmethod(keep))
    requests = []
    for i in range(24):
        sampler = ("greedy", "gumbel", "rejection")[i % 3]
        sampling_ = SamplingParams() if sampler == "greedy" else \
            SamplingParams(0.8 + 0.1 * (i % 4), 6 * (i % 2), 1.0, 1000 + i, "sample", sampler)
        options = DecodeOptions(max_new_tokens=10 + i % 5, sampling=sampling_, tree=("off", 3, "auto")[(i // 3) % 3],
                                verify="adaptive" if sampler != "rejection" and i % 2 else "fixed")
        requests.append(([(i * 7 + j) % 12 for j in range(3 + i % 6)], options))
    outs = {i: tokens for i, tokens, _ in BatchEngine(engine, rows=5).run(*zip(*requests))}
    for i, (prompt, options) in enumerate(requests):
        reference = engine if options.sampling.sampler == "rejection" else plain
        assert outs[i] == run(reference, options, prompt), f"request {i}: {options}"
    print(f"\n{sum(moved(p) for p in kept)} of {len(kept)} batched cycles moved their path")
    assert sum(moved(p) for p in kept) >= 10, "too few batched walks went down a sibling"


def test_a_batch_size_judged_better_off_with_chains_drafts_chains_for_tree_requests(small_pair, monkeypatch):
    """Where the policy's measured verdict says chains (`AdaptiveVerify.chain_cycle`), rows that asked for trees
    draft chains at that batch size, still decoding plain decoding's tokens; one row alone keeps its trees, and
    every batch cycle reports its shape."""
    target, drafter = small_pair
    policy = AdaptiveVerify(curve(), learn_costs=False)
    policy.set_batch_cost(3, curve())
    engine, plain = SpeculativeEngine(target, drafter, policy=policy), SpeculativeEngine(target)
    monkeypatch.setattr(policy, "chain_cycle", lambda rows: rows > 1)
    trees, real = [], engine._tree_proposal
    monkeypatch.setattr(engine, "_tree_proposal", lambda seq, logits, t0, head_s, spent, rows, context_s:
                        trees.append(rows) or real(seq, logits, t0, head_s, spent, rows, context_s))
    cycles, done = [], policy.cycle_done  # (rows, kind, shape) of every batch cycle
    monkeypatch.setattr(policy, "cycle_done", lambda rows, kind, *a, shape=None:
                        cycles.append((rows, kind, shape)) or done(rows, kind, *a, shape=shape))
    options = DecodeOptions(max_new_tokens=12, tree="auto", verify="adaptive")
    requests = [[(i * 5 + j) % 12 for j in range(3 + i)] for i in range(3)]
    outs = {i: tokens for i, tokens, _ in BatchEngine(engine, rows=3).run(requests, [options] * 3)}
    assert [outs[i] for i in range(3)] == [run(plain, options, p) for p in requests]
    assert (3, DRAFTER, CHAIN) in cycles  # the drafter ran for chains with all rows in the batch
    assert all(rows == 1 for rows, _, shape in cycles if shape == TREE) and all(rows == 1 for rows in trees)
    trees.clear()
    run(engine, options, requests[0])
    assert trees == [1] * len(trees) and trees  # one request alone: trees as asked


# ---------------------------------------------------------------- the target's distribution at depth
DEPTH_CONFIGS = {  # name -> (sampler, tree, sampling, runs, least share of cycles committing >= 3 tokens)
    "rejection, auto": ("rejection", "auto", dict(temperature=1.0), 600, 0.15),
    "gumbel, 16": ("gumbel", 16, dict(temperature=1.0), 500, 0.6),
    "rejection, auto, top_k": ("rejection", "auto", dict(temperature=1.5, top_k=5), 400, 0.25),
    "gumbel, 12, top_p": ("gumbel", 12, dict(temperature=1.3, top_p=0.9), 400, 0.4),
}


def deep_share(runs: Runs) -> float:
    lengths = runs.lengths
    return sum(n >= 3 for n in lengths) / max(1, len(lengths))


@pytest.mark.slow
@pytest.mark.parametrize("name", DEPTH_CONFIGS)
def test_tree_sampling_is_exact_at_depth(pair, name):
    """test_sampling_depth's check (exact enumeration of the first 5 tokens, chi-square on every marginal and
    late neighbours' joints) with draft trees: the walk's draws keep the target's distribution."""
    sampler, tree, params, count, least = DEPTH_CONFIGS[name]
    runs = solo(pair.engine, DEPTH_PROMPT, count, sampler, seed0=200_000, options=dict(tree=tree), **params)
    p, line = runs.report(f"tree {name}", exact(pair.model, DEPTH_PROMPT, SamplingParams(**params)))
    share = deep_share(runs)
    print(f"{share:.0%} of cycles committed >= 3 tokens")
    assert share >= least, f"too shallow to test depth ({share:.1%} of cycles >= 3 tokens): {line}"
    assert min(p.values()) > PASS, f"not the target's distribution: {line}"


def first_child_at_depth(monkeypatch) -> list[int]:
    """A broken walk: from a row at depth >= 1 it accepts the row's first child without asking the target (a
    draft accepted without the target's draw); returns how many such children it accepted, per walk."""
    forced: list[int] = []

    def broken(tree, choose):
        kids, depth = tree.children(), tree.positions()
        path, row, count = [], 0, 0
        while True:
            if depth[row] >= 1 and kids[row]:
                row = min(kids[row].values())
                path.append(row)
                count += 1
                continue
            child = kids[row].get(token := choose(row))
            if child is None:
                forced.append(count)
                return path, token
            path.append(child)
            row = child

    monkeypatch.setattr(engine_module, "walk", broken)
    return forced


@pytest.mark.parametrize("sampler, tree", slow_unless([("rejection", "auto"), ("gumbel", 16)], ("gumbel", 16)))
def test_a_walk_that_accepts_without_the_targets_draw_is_rejected(pair, sampler, tree, monkeypatch):
    """Negative control: the same checks reject (p < 1e-6) a walk that, past depth 1, takes the first child
    without the target's draw."""
    forced = first_child_at_depth(monkeypatch)
    runs = solo(pair.engine, DEPTH_PROMPT, 300, sampler, seed0=200_000, options=dict(tree=tree), temperature=1.0)
    p, line = runs.report(f"control [{sampler}, tree {tree}]", exact(pair.model, DEPTH_PROMPT,
                                                                      SamplingParams(temperature=1.0)))
    assert sum(forced) > 30, "the control must be reached"
    assert min(p.values()) < REJECT, f"a broken walk went unnoticed: {line}"


# ---------------------------------------------------------------- options
@pytest.mark.parametrize("bad", [0, -1, "big", True, 2.5, None])
def test_bad_tree_options_are_refused(bad):
    with pytest.raises(InvalidArgumentError, match=f"tree={bad!r}".replace(".", r"\.")):
        DecodeOptions(tree=bad)


@pytest.mark.parametrize("good", ["off", "auto", 1, 64])
def test_tree_options(good):
    assert DecodeOptions(tree=good).tree == good

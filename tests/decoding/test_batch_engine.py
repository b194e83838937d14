"""Batched speculative decoding: every row decodes exactly what it decodes alone."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from blockdraft.decoding.adaptive import CHAIN, DRAFTER, LOOKUP, TREE, AdaptiveVerify
from blockdraft.decoding.batch_engine import BatchEngine, cycle_kind, cycle_shape
from blockdraft.decoding.engine import DecodeOptions, Proposal, SpeculativeEngine
from blockdraft.decoding.tree import DraftTree
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.decoding.stats import GenerationStats
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.fast_target import FastTarget
from blockdraft.modeling.target import TargetModel
from tests.conftest import ARCHS, slow_unless, tiny_drafter, tiny_hf_model
from tests.decoding.test_engine import PROMPT, VOCAB, chi_square_pvalue, exact_joint, prompts


def solo(engine, prompt, options):
    stats = GenerationStats(1)
    return [t for chunk in engine.decode(prompt, options, stats) for t in chunk], stats


def batched(engine, ps, opts, rows):
    out = {i: (toks, st) for i, toks, st in BatchEngine(engine, rows=rows).run(ps, opts)}
    return [out[i] for i in range(len(ps))]


def mixed_options(n: int, vocab: int = 96) -> list[DecodeOptions]:
    """Different limits, block sizes, stop tokens, verify modes and sampling per request."""
    out = []
    for i in range(n):
        sampling = SamplingParams() if i % 3 else SamplingParams(temperature=0.9, top_p=0.9, seed=i)
        out.append(DecodeOptions(max_new_tokens=8 + 5 * (i % 4), block_size=[8, 4, 2, 8][i % 4],
                                 no_draft=i % 5 == 4, stop_token_ids=(i % vocab, 7), sampling=sampling,
                                 verify="adaptive" if i % 2 else "fixed"))
    return out


@pytest.mark.parametrize("arch, rows", slow_unless([(a, r) for a in ARCHS for r in (1, 3, 8)],
                                                   ("qwen3", 8), ("llama", 3), ("qwen2", 1)))
def test_each_row_decodes_what_it_decodes_alone(arch, rows, monkeypatch):
    target = FastTarget(tiny_hf_model(arch, head_scale=3.0))
    policy = AdaptiveVerify({q: 1 + 0.15 * q for q in range(1, 9)}, learn_costs=False)
    policy.accepted[:] = torch.linspace(1, 9, 10)
    policy.tested[:] = 10
    # frozen: a learning policy would see the requests in another order when batched, and sampled rows
    # consume their random streams according to the verify lengths it picks
    monkeypatch.setattr(policy, "update", lambda *a, **k: None)
    # and blind to the batch: a batch-aware draft length (tested in test_adaptive) may differ from the solo
    # one, which changes how sampled rows use their random streams (same distribution, other tokens)
    one_row, verify_one_row = policy.draft_length, policy.choose
    monkeypatch.setattr(policy, "draft_length", lambda limit, rows=1: one_row(limit))
    monkeypatch.setattr(policy, "choose", lambda confidence, rows=1: verify_one_row(confidence))
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=8), policy=policy)
    ps, opts = prompts(7, seed=rows), mixed_options(7)
    alone = [solo(engine, p, o) for p, o in zip(ps, opts)]
    together = batched(engine, ps, opts, rows)
    for (a_tokens, a_stats), (b_tokens, b_stats) in zip(alone, together):
        assert a_tokens == b_tokens
        assert b_stats.new_tokens == len(b_tokens) and b_stats.prompt_tokens > 0
    assert any(len(set(st.acceptance_lengths)) > 1 for _, st in together)


def test_other_targets_decode_one_by_one():
    target = TargetModel(tiny_hf_model("qwen2"))
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=8), policy=AdaptiveVerify({1: 1.0, 2: 1.1}))
    ps, opts = prompts(3, seed=1), mixed_options(3)
    assert [t for t, _ in batched(engine, ps, opts, 4)] == [solo(engine, p, o)[0] for p, o in zip(ps, opts)]


def test_bad_requests_fail_before_any_work():
    target = FastTarget(tiny_hf_model("llama"))
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=4))
    with pytest.raises(InvalidArgumentError, match="prompt is empty"):
        list(BatchEngine(engine).run([[1, 2], []], DecodeOptions()))
    with pytest.raises(InvalidArgumentError, match="2 options for 1 prompts"):
        list(BatchEngine(engine).run([[1]], [DecodeOptions()] * 2))
    with pytest.raises(InvalidArgumentError, match="rows=0"):
        BatchEngine(engine, rows=0)


@pytest.mark.slow
def test_batched_sampling_has_the_targets_distribution():
    model = tiny_hf_model("qwen3", vocab=VOCAB, layers=2, head_scale=12.0, seed=5)
    target = FastTarget(model)
    engine = SpeculativeEngine(target, tiny_drafter(target, std=0.5, seed=3, block_size=4))
    counts = np.zeros((VOCAB,) * 3)
    opts = [DecodeOptions(max_new_tokens=3, block_size=4, sampling=SamplingParams(temperature=1.0, seed=s))
            for s in range(3000)]
    for _, tokens, _ in BatchEngine(engine, rows=16).run([PROMPT] * len(opts), opts):
        counts[tuple(tokens)] += 1
    assert chi_square_pvalue(counts, exact_joint(model)) > 1e-3


def test_greedy_rows_equal_solo_under_the_learning_batch_aware_policy():
    target = FastTarget(tiny_hf_model("qwen3", head_scale=3.0))
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=8),
                               policy=AdaptiveVerify({q: 1 + 0.15 * q for q in range(1, 9)}))
    ps = prompts(6, seed=4)
    opts = [DecodeOptions(max_new_tokens=20, verify="adaptive") for _ in ps]
    alone = [solo(engine, p, o)[0] for p, o in zip(ps, opts)]
    assert [tokens for tokens, _ in batched(engine, ps, opts, 4)] == alone


@pytest.mark.parametrize("arch, rows", slow_unless([(a, r) for a in ARCHS for r in (1, 4)], ("qwen3", 4), ("llama", 1)))
def test_rows_with_looked_up_drafts_decode_what_they_decode_alone(arch, rows):
    target = FastTarget(tiny_hf_model(arch, head_scale=3.0))
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=8))
    opts = [DecodeOptions(max_new_tokens=20, ngram=True, block_size=[8, 4][i % 2],
                          sampling=SamplingParams() if i % 2 else SamplingParams(temperature=0.9, seed=i))
            for i in range(5)]
    ps = [list(range(96)) + p for p in prompts(5, seed=rows)]  # every token once: any answer has matches
    alone = [solo(engine, p, o) for p, o in zip(ps, opts)]
    together = batched(engine, ps, opts, rows)
    assert [tokens for tokens, _ in together] == [tokens for tokens, _ in alone]
    assert all(st.lookup_cycles for _, st in together)


def test_a_cycle_is_judged_by_the_kind_of_drafts_it_verified():
    nothing, two = torch.zeros(0, dtype=torch.long), torch.tensor([5, 6])
    plain = Proposal(nothing, None, None, 0.0)
    looked_up = Proposal(two, None, None, 0.0, source=3)
    drafted = Proposal(two, None, torch.tensor([0.9, 0.4]), 0.01)
    probed_unverified = Proposal(nothing, None, torch.tensor([0.2, 0.1]), 0.01)  # the drafter ran, 0 kept
    assert cycle_kind([plain, plain]) is None
    assert cycle_kind([plain, looked_up]) == LOOKUP
    assert cycle_kind([looked_up, drafted]) == DRAFTER
    assert cycle_kind([plain, probed_unverified]) == DRAFTER  # its cost is in the cycle
    tree = DraftTree(two, [0, 0], [1, 1], [0.6, 0.3])  # two children of the root
    treed = Proposal(two, None, torch.tensor([0.9, 0.4]), 0.01, tree=tree)
    policy = object()  # an adaptive row's (fixed verify: None)
    trees, chains = SimpleNamespace(tree_budget=32, policy=policy), SimpleNamespace(tree_budget=0, policy=policy)
    fixed = SimpleNamespace(tree_budget=32, policy=None)  # a tree verified whole: drafts trees whatever the verdict
    assert cycle_shape([trees, fixed], [drafted, treed]) == CHAIN  # the adaptive row drafted a chain
    assert cycle_shape([fixed], [treed]) is None
    assert cycle_shape([trees, chains], [treed, drafted]) == TREE
    assert cycle_shape([trees, chains], [drafted, plain]) == CHAIN  # the tree row drafted a chain this cycle
    assert cycle_shape([trees, chains], [plain, drafted]) is None  # only a row without trees ran the drafter
    assert cycle_shape([trees, trees], [looked_up, probed_unverified]) == CHAIN
    assert cycle_shape([trees], [looked_up]) is None  # looked-up drafts alone: the drafter did not run

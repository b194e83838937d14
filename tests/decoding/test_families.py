"""Targets off the fast path decode losslessly: the Qwen3.5 / Qwen3-Next hybrids (linear-attention states rolled
back after every verify, `blockdraft.modeling.recurrent`), Qwen3.5-MoE, Qwen3-MoE and gpt-oss (sliding windows,
attention sinks). Tiny random models in float64, each against Hugging Face `generate()`."""
from __future__ import annotations

import pytest
import torch

from blockdraft.decoding.batch_engine import BatchEngine
from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.decoding.stats import GenerationStats
from blockdraft.errors import IncompatibleModelsError
from blockdraft.modeling.recurrent import StateRollback
from blockdraft.modeling.target import TargetModel
from tests.conftest import FAMILIES, HYBRIDS, slow_unless, tiny_drafter, tiny_family_model

PROMPT = [5, 6, 7, 8, 9, 10, 11]
NEW = 60
BLOCK = 4
SEED = 2  # a seed where every family's greedy text soon repeats (looked-up drafts accepted whole)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=slow_unless(FAMILIES, "qwen3_5", "gpt_oss"))  # a hybrid, sliding windows
def family(request):
    """(name, HF model, engine): a sharpened random target (its greedy text soon repeats, so looked-up drafts
    are often accepted whole) and a random drafter (whose drafts mostly are not)."""
    model = tiny_family_model(request.param, head_scale=4.0, seed=SEED)
    target = TargetModel(model)
    return request.param, model, SpeculativeEngine(target, tiny_drafter(target, block_size=BLOCK))


def decode(engine: SpeculativeEngine, prompt: list[int], options: DecodeOptions) -> tuple[list[int], GenerationStats]:
    stats = GenerationStats(1)
    return [t for chunk in engine.decode(prompt, options, stats) for t in chunk], stats


def generate(model, prompt: list[int], new: int = NEW) -> list[int]:
    return model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False)[0, len(prompt):].tolist()


def test_greedy_equals_generate_after_none_some_and_all_drafts_accepted(family):
    name, model, engine = family
    expected = generate(model, PROMPT)
    histogram = [0] * BLOCK
    for options in (DecodeOptions(max_new_tokens=NEW, no_draft=True), DecodeOptions(max_new_tokens=NEW),
                    DecodeOptions(max_new_tokens=NEW, ngram=True),
                    DecodeOptions(max_new_tokens=NEW, ngram=True, verify="adaptive")):
        tokens, stats = decode(engine, PROMPT, options)
        assert tokens == expected, f"{name} {options}"
        for n in stats.acceptance_lengths:
            histogram[n - 1] += 1
    # rollback after 0 accepted drafts, after some, and none at all (every draft accepted)
    assert histogram[0] >= 10 and sum(histogram[1:-1]) >= 1 and histogram[-1] >= 2, (name, histogram)


@pytest.mark.parametrize("name", slow_unless(HYBRIDS, "qwen3_5"))
def test_without_the_state_rollback_the_output_changes(name, monkeypatch):
    """Negative control: cut the attention rows only and leave the linear-attention states where the verify
    left them (as a plain KV-cache engine would): the output is no longer the target's."""
    model = tiny_family_model(name, head_scale=4.0, seed=SEED)
    target = TargetModel(model)
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=BLOCK))
    expected = generate(model, PROMPT)

    def attention_only(self, cache, length):
        self._crop_attention(cache, cache.get_seq_length() - length)

    monkeypatch.setattr(StateRollback, "rollback", attention_only)
    tokens, _ = decode(engine, PROMPT, DecodeOptions(max_new_tokens=NEW, ngram=True))
    assert tokens != expected


@pytest.mark.slow
@pytest.mark.parametrize("name", HYBRIDS)
def test_seeded_sampling_equals_plain_decoding(name):
    """With a seed the gumbel sampler's output is plain decoding's, whatever was drafted and rolled back."""
    model = tiny_family_model(name, head_scale=2.0, seed=1)
    target = TargetModel(model)
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=BLOCK))
    drafted = 0
    for seed in range(12):
        for extra in ({"ngram": True}, {"verify": "adaptive"}):
            params = SamplingParams(temperature=0.8, top_p=0.95, seed=seed, sampler="gumbel")
            plain, _ = decode(engine, PROMPT, DecodeOptions(max_new_tokens=30, no_draft=True, sampling=params))
            spec, stats = decode(engine, PROMPT, DecodeOptions(max_new_tokens=30, sampling=params, **extra))
            assert spec == plain, (name, seed, extra)
            drafted += sum(n > 1 for n in stats.acceptance_lengths)
    assert drafted >= 20  # accepted drafts (then a rollback) happened


@pytest.mark.parametrize("name", slow_unless(HYBRIDS + ("gpt_oss",), "qwen3_5", "gpt_oss"))
def test_a_batch_of_rows_equals_each_row_alone(name):
    """Rows of different lengths and settings, each on its own cache, give what each gives alone."""
    model = tiny_family_model(name, head_scale=4.0, seed=SEED)
    target = TargetModel(model)
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=BLOCK))
    prompts = [PROMPT, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [42, 17], PROMPT[::-1]]
    options = [DecodeOptions(max_new_tokens=40, ngram=True),
               DecodeOptions(max_new_tokens=25, sampling=SamplingParams(temperature=0.9, seed=3, sampler="gumbel")),
               DecodeOptions(max_new_tokens=33, no_draft=True),
               DecodeOptions(max_new_tokens=20, verify="adaptive", ngram=True)]
    alone = [decode(engine, p, o)[0] for p, o in zip(prompts, options)]
    batched = {i: tokens for i, tokens, _ in BatchEngine(engine, rows=3).run(prompts, options)}
    assert [batched[i] for i in range(len(prompts))] == alone


@pytest.mark.parametrize("name", slow_unless(HYBRIDS, "qwen3_5"))
def test_a_hybrid_target_refuses_a_tree_size_and_verifies_chains_for_auto(name):
    model = tiny_family_model(name, head_scale=4.0, seed=SEED)
    target = TargetModel(model)
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=BLOCK))
    with pytest.raises(IncompatibleModelsError, match=r"tree=8: .* verifies chains only \(expected tree='off' or "):
        decode(engine, PROMPT, DecodeOptions(max_new_tokens=5, tree=8))
    tokens, stats = decode(engine, PROMPT, DecodeOptions(max_new_tokens=NEW, tree="auto", ngram=True))
    assert tokens == generate(model, PROMPT) and max(stats.acceptance_lengths) == BLOCK

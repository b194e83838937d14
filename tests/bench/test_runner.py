"""The side-by-side runner and its report on a tiny random pair: seconds, every output produced."""
import json

import pytest
import torch

from blockdraft.api import Pipeline
from blockdraft.bench.report import cost_accounting, markdown, plots, summaries, summarize
from blockdraft.bench.runner import (BenchSettings, Record, _engine, method_names, register_drafters, run_batched,
                                     run_bench)
from blockdraft.decoding.adaptive import AdaptiveVerify
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.checkpoint import save_drafter
from blockdraft.prompts import Prompt
from tests.conftest import tiny_drafter, tiny_pipeline


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline("llama", seed=3)


PROMPTS = {"chat": [Prompt("a", ({"role": "user", "content": "Tell me about cats."},), "t",
                           followups=("And dogs?",)),
                    Prompt("b", ({"role": "user", "content": "abc abc abc"},), "t")]}


def test_every_method_runs_every_turn_and_greedy_outputs_agree(pipe):
    s = BenchSettings(max_new_tokens=10, block_sizes=(2, 6), verify=("fixed", "adaptive"),
                      methods=("dflash", "dflash_hf", "no_draft", "hf_generate", "hf_prompt_lookup"))
    pipe.engine.policy = AdaptiveVerify({q: 1.0 + 0.2 * q for q in range(1, 7)})
    methods, records = run_bench(pipe, PROMPTS, s, progress=False)
    assert methods == ["dflash-b2", "dflash-b2-adaptive", "dflash-b6", "dflash-b6-adaptive", "dflash-hfpath",
                       "no_draft", "hf_generate", "hf_prompt_lookup"]
    assert len(records) == 3 * len(methods)  # prompt a has 2 turns, b has 1
    assert [(r.prompt_id, r.turn) for r in records[:: len(methods)]] == [("a", 1), ("a", 2), ("b", 1)]
    table = summaries(records, methods, methods)
    for m in methods:  # lossless: every method reproduces our plain greedy output, HF's included
        assert table["overall"][m]["identical_to_no_draft"] == table["overall"][m]["compared"] == 3
    b6 = table["overall"]["dflash-b6"]
    assert 1 <= b6["mean_acceptance_length"] <= 6 and len(b6["acceptance_histogram"]) == 6
    assert abs(sum(b6["acceptance_histogram"]) - 1) < 1e-9
    assert table["overall"]["no_draft"]["speedup"]["no_draft"] == pytest.approx(1.0)
    hf_path = [r for r in records if r.method == "dflash-hfpath"]
    assert [r.acceptance_lengths for r in hf_path] == [r.acceptance_lengths for r in records if r.method == "dflash-b6"]
    assert set(table) == {"chat", "overall"} and "mean_acceptance_length" not in table["overall"]["hf_generate"]
    assert all(r.ttft_s <= r.total_s for r in records)


def test_the_full_vocabulary_variant_runs_beside_the_draft_vocabulary():
    pipe = tiny_pipeline("qwen3", seed=4)
    pipe.drafter.draft_vocab = torch.arange(0, pipe.target.vocab_size, 2)
    pipe = Pipeline(pipe.target, pipe.drafter)
    s = BenchSettings(max_new_tokens=10, block_sizes=(6,), verify=("fixed", "adaptive"),
                      methods=("dflash", "dflash_fullvocab", "no_draft"), turns=1)
    methods, records = run_bench(pipe, PROMPTS, s, progress=False)
    assert methods == ["dflash-b6", "dflash-b6-adaptive", "dflash-b6-fullvocab", "dflash-b6-adaptive-fullvocab",
                       "no_draft"]
    table = summaries(records, methods, methods)["overall"]
    assert all(table[m]["identical_to_no_draft"] == table[m]["compared"] == 2 for m in methods)
    full = [r for r in records if r.method == "dflash-b6-fullvocab"]
    assert _engine(pipe, "dflash-b6-fullvocab").draft_ids is None and pipe.engine.draft_ids is not None
    assert _engine(pipe, "dflash-b6-adaptive-fullvocab") is _engine(pipe, "dflash-b6-fullvocab")
    assert len(full) == 2 and all(r.acceptance_lengths for r in full)
    batched = run_batched(pipe, PROMPTS, methods, s, rows=2)
    assert all(batched[m]["identical_to_no_draft"] == 2 for m in methods)
    rounds = run_batched(pipe, PROMPTS, ["dflash-b6-adaptive", "no_draft"], s, rows=2, rounds=3)
    for m, b in rounds.items():  # three runs each, pooled: the same tokens every round
        assert len(b["rounds_tokens_per_second"]) == 3 and b["new_tokens"] == 3 * batched[m]["new_tokens"]
        assert b["identical_to_no_draft"] == 2
    with pytest.raises(InvalidArgumentError, match="rounds=0"):
        run_batched(pipe, PROMPTS, methods, s, rows=2, rounds=0)


@pytest.mark.parametrize("verify, sampler", [("fixed", "rejection"), ("adaptive", "gumbel")])
def test_sampled_runs_are_reproducible(pipe, verify, sampler):
    """Seeded runs repeat token for token where the sampler promises it (docs/serve.md, `seed`): the rejection
    rule with a fixed verify length, the gumbel sampler with any. The adaptive policy's lengths follow measured
    timings, and the rejection rule's uniforms follow the lengths, so that pair keeps the distribution only."""
    s = BenchSettings(max_new_tokens=8, temperature=0.8, methods=("dflash", "no_draft"), turns=1,
                      verify=(verify,), samplers=(sampler,))
    _, first = run_bench(pipe, PROMPTS, s, progress=False)
    _, again = run_bench(pipe, PROMPTS, s, progress=False)
    assert any("adaptive" in r.method for r in first) == (verify == "adaptive")
    assert [r.token_ids for r in first] == [r.token_ids for r in again]


def test_each_drafter_label_runs_its_own_drafter_on_the_shared_target(tmp_path):
    pipe = tiny_pipeline("llama", seed=3)  # its own: the registry is per pipeline
    save_drafter(tiny_drafter(pipe.target, seed=7, block_size=6), tmp_path / "other")
    labels = register_drafters(pipe, {"mine": "not loaded", "other": str(tmp_path / "other")})
    s = BenchSettings(max_new_tokens=8, methods=("dflash", "no_draft"), turns=1, trees=("off", 4),
                      verify=("fixed",))
    assert method_names(s, 6, labels) == ["dflash-b6@mine", "dflash-b6-tree4@mine", "dflash-b6@other",
                                          "dflash-b6-tree4@other", "no_draft"]
    assert _engine(pipe, "dflash-b6@mine") is pipe.engine
    other = _engine(pipe, "dflash-b6@other")
    assert other.target is pipe.target and other.drafter is not pipe.drafter
    saved = tiny_drafter(pipe.target, seed=7, block_size=6).state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in other.drafter.state_dict().items())
    assert _engine(pipe, "dflash-b6-tree4@other").drafter is other.drafter
    _, records = run_bench(pipe, {"chat": PROMPTS["chat"][1:]}, s, progress=False, drafters=labels)
    assert len({tuple(r.token_ids) for r in records}) == 1  # lossless with either drafter
    with pytest.raises(InvalidArgumentError, match="no drafter labelled 'third'"):
        _engine(pipe, "dflash-b6@third")
    with pytest.raises(InvalidArgumentError, match="drafter label 'a@b'"):
        register_drafters(pipe, {"a@b": "x", "c": "y"})
    for name, kw in (("layers", {"target_layer_ids": [0]}), ("block", {"block_size": 4})):  # one hook set, one name
        save_drafter(tiny_drafter(pipe.target, seed=7, **{"block_size": 6, **kw}), tmp_path / name)
        with pytest.raises(InvalidArgumentError, match=f"drafter '{name}' reads target layers .* expected the same"):
            register_drafters(pipe, {"mine": "x", name: str(tmp_path / name)})
    assert pipe.target.feature_layer_ids == list(pipe.drafter.config.target_layer_ids)


def test_method_names_are_validated():
    with pytest.raises(InvalidArgumentError, match="block size 9: expected 2..6"):
        method_names(BenchSettings(block_sizes=(9,)), 6)
    with pytest.raises(InvalidArgumentError, match="method 'eagle'"):
        method_names(BenchSettings(methods=("eagle",)), 6)
    with pytest.raises(InvalidArgumentError, match="verify mode 'always'"):
        method_names(BenchSettings(verify=("always",)), 6)
    with pytest.raises(InvalidArgumentError, match="'dflash_ngram' needs a drafter"):
        method_names(BenchSettings(), None)


def _rec(prompt: str, turn: int, lengths: list[int], tokens: list[int], method: str = "dflash-b4",
         plain: int = 0) -> Record:
    """A generation: prefill, then cycles committing `lengths` (3 drafts each) and `plain` plain steps."""
    return Record("d", prompt, turn, method, 10, sum(lengths) + plain + 1, 0.1, 1.0, block_size=4,
                  acceptance_lengths=lengths, drafted=[3] * len(lengths), verified=[3] * len(lengths), drafter_s=0.05,
                  target_forwards=1 + len(lengths) + plain, token_ids=tokens)


def test_acceptance_is_averaged_per_prompt_over_its_turns_then_over_prompts():
    recs = [_rec("p", 1, [4, 4], [1]), _rec("p", 2, [1, 1], [2]), _rec("q", 1, [2], [3])]
    row = summarize(recs, reference={("d", "p", 1): [1], ("d", "p", 2): [9], ("d", "q", 1): [3]})
    assert row["mean_acceptance_length"] == pytest.approx((2.5 + 2) / 2)  # prompt p: (4+4+1+1)/4
    assert row["identical_to_no_draft"] == 2 and row["compared"] == 3
    assert row["acceptance_histogram"] == pytest.approx([2 / 5, 1 / 5, 0, 2 / 5])
    assert row["target_tokens_per_committed"] == pytest.approx(5 * 4 / 12)
    assert row["drafter_s_per_cycle"] == pytest.approx(0.15 / 5)


def test_cost_accounting_counts_the_plain_steps_of_an_adaptive_run():
    recs = [_rec("p", 1, [4, 2], [1], plain=3), _rec("q", 1, [1], [2], plain=1)]
    row = summarize(recs) | {"speedup": {}}
    assert row["verify_counts"] == {"4": 3} and row["plain_cycles"] == 4 and row["cycle_tokens"] == 7 + 4
    curve = {1: 0.05, 2: 0.06, 3: 0.07, 4: 0.08}
    cost = cost_accounting({"dflash-b4-adaptive": row}, curve, 300)["methods"]["dflash-b4-adaptive"]
    # 11 tokens at c(1) each, against 3 verifies of 4 tokens, 4 plain steps and 0.1 s of drafting
    assert cost["predicted_speedup"] == pytest.approx(11 * 0.05 / (3 * 0.08 + 4 * 0.05 + 0.1))


def test_tree_cycles_are_priced_by_their_nodes_not_their_depth():
    """A tree of 8 nodes 3 deep sends 1 + 8 tokens through the target: the work and the cost prediction count
    9, the per-position acceptance counts depth 3."""
    rec = _rec("p", 1, [3, 1], [1], method="dflash-b4-tree8")
    rec.drafted, rec.verified = [3, 3], [8, 8]
    row = summarize([rec]) | {"speedup": {}}
    assert row["verify_counts"] == {"9": 2} and row["mean_verify_tokens"] == 9
    assert row["target_tokens_per_committed"] == pytest.approx(18 / 4)
    assert row["per_position_acceptance"] == pytest.approx([1 / 2, 1 / 2, 0.0])
    curve = {q: 0.05 + 0.01 * (q - 1) for q in range(1, 10)}
    cost = cost_accounting({"dflash-b4-tree8": row}, curve, 300)["methods"]["dflash-b4-tree8"]
    assert cost["predicted_speedup"] == pytest.approx(4 * 0.05 / (2 * curve[9] + 0.05))  # 0.05 s drafting


def test_markdown_and_plots_from_a_result(tmp_path):
    recs = [_rec("p", 1, [4, 2], [1]), _rec("p", 1, [], [1], method="no_draft")]
    recs[1].block_size = 1
    result = {"summaries": summaries(recs, ["dflash-b4", "no_draft"], ["dflash-b4", "no_draft"]),
              "cost": {"context_tokens": 50, "verify_cost_ratio": {"1": 1.0, "4": 1.5},
                       "methods": {"dflash-b4": {"verify_tokens": 4, "break_even_acceptance": 1.6,
                                                 "predicted_speedup": 1.9, "measured_speedup": 1.0,
                                                 "target_tokens_per_committed": 1.3, "drafter_share_of_decode": 0.1}}}}
    md = markdown(result)
    assert "| d | dflash-b4 | 3.00 |" in md and "| dflash-b4 | 4 | 1.60 | 3.00 | 1.90 | 1.00 |" in md
    names = sorted(p.name for p in plots(result, tmp_path))
    assert names == ["acceptance_histogram.png", "per_position_acceptance.png", "speedup.png", "verify_cost.png"]
    assert all((tmp_path / n).stat().st_size > 1000 for n in names)
    json.dumps(result)


def test_looked_up_cycles_are_reported_apart_from_the_drafters():
    rec = _rec("p", 1, [4, 2, 3], [1], method="dflash-b4-ngram")
    rec.sources = [3, 0, 0]
    row = summarize([rec])
    assert row["lookup_cycles"] == 1 and row["drafter_mean_acceptance_length"] == pytest.approx(2.5)
    md = markdown({"summaries": {"d": {"dflash-b4-ngram": row | {"speedup": {}}}}})
    assert "1 of 3 cycles looked up; the drafter's own tau 2.50" in md

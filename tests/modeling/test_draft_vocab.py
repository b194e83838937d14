
import pytest
import torch

from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.decoding.stats import GenerationStats
from blockdraft.errors import CheckpointError, IncompatibleModelsError, InvalidArgumentError
from blockdraft.modeling.checkpoint import load_drafter, save_drafter
from blockdraft.modeling.draft_vocab import FILE, draft_head, frequent_tokens, read_draft_vocab
from blockdraft.modeling.memory import memory_report
from blockdraft.modeling.packing import PackedLinear
from blockdraft.modeling.target import TargetModel
from tests.conftest import slow_unless, tiny_drafter, tiny_hf_model
from tests.decoding.test_engine import PROMPT, VOCAB, chi_square_pvalue, decode, exact_joint, prompts, sample_counts


def test_frequent_tokens_rank_by_count_then_id_and_report_coverage():
    ids, coverage = frequent_tokens([torch.tensor([5, 5, 5, 2, 2, 9]), torch.tensor([9, 9, 1, 7])], 2)
    assert ids.tolist() == [5, 9] and coverage == pytest.approx(6 / 10)
    ids, _ = frequent_tokens([torch.tensor([4, 3, 8])], 2)  # all tied: the lower ids
    assert ids.tolist() == [3, 4]
    with pytest.raises(InvalidArgumentError, match="draft vocabulary size 0"):
        frequent_tokens([], 0)


def test_the_vocabulary_travels_with_the_folder_and_bad_files_are_refused(tmp_path):
    target = TargetModel(tiny_hf_model("qwen3"))
    drafter = tiny_drafter(target)
    drafter.draft_vocab = torch.tensor([1, 4, 9])
    save_drafter(drafter, tmp_path / "d")
    assert load_drafter(tmp_path / "d").draft_vocab.tolist() == [1, 4, 9]
    assert not list((tmp_path / "d").glob("draft_vocab*.safetensors"))  # vLLM loads every *.safetensors
    drafter.draft_vocab = None
    save_drafter(drafter, tmp_path / "plain")
    assert load_drafter(tmp_path / "plain").draft_vocab is None
    for bad in ('{"ids": []}', '{"ids": [1, 1]}', '{"ids": [-1]}', '{"ids": "x"}', "not json"):
        (tmp_path / "d" / FILE).write_text(bad)
        with pytest.raises(CheckpointError, match="draft"):
            read_draft_vocab(tmp_path / "d")
    with pytest.raises(IncompatibleModelsError, match="token id 96, outside the target's vocabulary"):
        draft_head(target.lm_head, torch.tensor([3, 96]), 96)


def test_the_head_scores_exactly_the_rows_of_the_targets_head():
    target = TargetModel(tiny_hf_model("llama"))
    ids = torch.tensor([0, 17, 40, 95])
    head = draft_head(target.lm_head, ids, target.vocab_size)
    x = torch.randn(5, target.hidden_size, dtype=target.dtype)
    assert torch.allclose(head(x), target.lm_head(x)[:, ids], atol=1e-5)
    assert not any(p.requires_grad for p in head.parameters())
    assert not isinstance(head, PackedLinear)  # a dense head gets a dense copy (--no-pack, --compile)
    if target.pack():  # a packed head gets a packed copy
        packed = draft_head(target.lm_head, ids, target.vocab_size)
        assert isinstance(packed, PackedLinear)
        assert torch.allclose(packed(x), target.lm_head(x)[:, ids], atol=1e-5)


@pytest.mark.parametrize("arch", slow_unless(["qwen3", "llama"], "qwen3"))
def test_greedy_output_is_the_targets_and_drafts_stay_in_the_vocabulary(arch):
    target = TargetModel(tiny_hf_model(arch, head_scale=6.0))
    drafter = tiny_drafter(target, block_size=6)
    drafter.draft_vocab = torch.arange(0, 96, 3)
    full, own = SpeculativeEngine(target, drafter, draft_vocab=False), SpeculativeEngine(target, drafter)
    proposed, real = [], own._proposal

    def record(*args):
        prop = real(*args)
        proposed.append(prop.drafts)
        return prop

    own._proposal = record
    plain = SpeculativeEngine(target, None)
    for p in prompts(6, seed=3):
        want = decode(plain, p, max_new_tokens=24)[0]
        assert decode(own, p, max_new_tokens=24)[0] == want == decode(full, p, max_new_tokens=24)[0]
    drafted = torch.cat(proposed)
    assert drafted.numel() and bool((drafted % 3 == 0).all())


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["sample", "greedy"])
def test_sampling_with_a_draft_vocabulary_keeps_the_targets_distribution(draft):
    model = tiny_hf_model("qwen3", vocab=VOCAB, layers=2, head_scale=12.0, seed=5)
    target = TargetModel(model)
    drafter = tiny_drafter(target, std=0.5, seed=3, block_size=4)
    drafter.draft_vocab = torch.tensor([0, 2, 3, 5, 8, 11])  # q is 0 on half the tokens
    engine = SpeculativeEngine(target, drafter)
    assert chi_square_pvalue(sample_counts(engine, draft), exact_joint(model)) > 1e-3


@pytest.mark.parametrize("draft", ["sample", "greedy"])
def test_every_slots_distribution_is_scattered_to_its_full_vocabulary_ids(draft):
    target = TargetModel(tiny_hf_model("qwen3", head_scale=6.0))
    drafter = tiny_drafter(target, block_size=6)
    ids = torch.tensor([90, 4, 33, 7, 61, 12, 2, 50])  # unsorted on purpose
    drafter.draft_vocab = ids
    engine = SpeculativeEngine(target, drafter)
    options = DecodeOptions(max_new_tokens=20, sampling=SamplingParams(temperature=1.0, seed=1, draft=draft))
    with torch.inference_mode():
        seq = engine.begin(PROMPT, options, GenerationStats(1))
        engine.prefill(seq, target.new_cache())
        prop = engine.propose(seq)
    n = prop.drafts.numel()
    assert n == 5 and prop.q.shape == (n, target.vocab_size)
    assert torch.allclose(prop.q.sum(-1), torch.ones(n, dtype=prop.q.dtype), atol=1e-5)
    outside = torch.ones(target.vocab_size, dtype=torch.bool)
    outside[ids] = False
    assert bool((prop.q[:, outside] == 0).all()) and bool(torch.isin(prop.drafts, ids).all())
    assert bool((prop.q[torch.arange(n), prop.drafts] > 0).all())  # each draft is where its mass is
    if draft == "greedy":
        assert bool((prop.q[torch.arange(n), prop.drafts] == 1).all())


def test_memory_report_counts_the_heads_copy():
    target = TargetModel(tiny_hf_model("qwen3"))
    drafter = tiny_drafter(target)
    head = draft_head(target.lm_head, torch.arange(10), target.vocab_size)
    with_head = memory_report(target, drafter, 64, draft_head=head)["drafter_parameters_bytes"]
    assert with_head - memory_report(target, drafter, 64)["drafter_parameters_bytes"] == 10 * target.hidden_size * target.dtype.itemsize

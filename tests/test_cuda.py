"""CUDA smoke tests: the same guarantees on a GPU in bf16 (skipped where there is no GPU).

Run by scripts/cuda_check.sh on a machine with a CUDA GPU. bf16 logits can tie where fp32 does not, so greedy
equality is checked against our own plain decoding on the same device and dtype (the same forward),
and batched against solo.
"""
import numpy as np
import pytest
import torch

from blockdraft.decoding.batch_engine import BatchEngine
from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.modeling.fast_target import FastTarget
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_drafter, tiny_hf_model
from tests.decoding.test_engine import PROMPT, VOCAB, chi_square_pvalue, decode, exact_joint, prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_training_logits_flex_equal_sdpa_with_memory_features_on_cuda():
    """GPU training path: features held in GPU memory, compiled flex_attention block masks vs dense SDPA masks."""
    from blockdraft.train.blocks import sample_anchors
    from blockdraft.train.data import Sequence
    from blockdraft.train.features import MemoryFeatures
    from blockdraft.train.trainer import block_logits

    target = FastTarget(tiny_hf_model("llama", dtype=torch.float32, hidden=64).cuda())  # flex needs head_dim >= 16
    target.set_feature_layers([1, 3])
    drafter = tiny_drafter(target, block_size=4, target_layer_ids=[1, 3]).to("cuda", torch.float32)
    g = torch.Generator().manual_seed(0)
    seqs = [Sequence(f"s{i}", torch.randint(0, 95, (n,), generator=g), torch.arange(n) >= 3)
            for i, n in enumerate((40, 33, 47))]
    feats = MemoryFeatures(target, seqs, torch.float32)
    anchors = [sample_anchors(s.loss_mask, 6, torch.Generator().manual_seed(i)) for i, s in enumerate(seqs)]
    dense, _ = block_logits(drafter, target, seqs, [feats(s) for s in seqs], anchors, attention="sdpa")
    flex, _ = block_logits(drafter, target, seqs, [feats(s) for s in seqs], anchors, attention="flex")
    assert torch.allclose(dense, flex, atol=1e-3, rtol=1e-3)


def near_tie(model, prompt: list[int], a: list[int], b: list[int], tolerance: float) -> bool:
    """Whether two greedy outputs first part where the target's two candidates' logits (in fp32, after the common
    prefix) are within `tolerance`: a near-tie that a verify forward and a one-token step may round apart."""
    k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    ids = torch.tensor([prompt + a[:k]], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits[0, -1].float()
    return abs(float(logits[a[k]] - logits[b[k]])) <= tolerance


@pytest.mark.parametrize("cls", [TargetModel, FastTarget])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_speculative_equals_plain_on_cuda(arch, cls, dtype):
    """fp32: identical. bf16: identical up to near-ties, which is what is guaranteed: a verify forward and a
    one-token step round differently, so where the top two logits are within bf16's resolution the argmax
    may differ; any difference must start at such a tie."""
    model = tiny_hf_model(arch, dtype=dtype, head_scale=3.0).cuda()
    target = cls(model)
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=8).to("cuda", dtype))
    for prompt in prompts(4, seed=2):
        plain, _ = decode(engine, prompt, max_new_tokens=24, no_draft=True)
        for verify in ("fixed", "adaptive"):
            out = decode(engine, prompt, max_new_tokens=24, verify=verify)[0]
            if dtype == torch.float32 or out == plain:
                assert out == plain
            else:  # bf16 keeps 8 bits of mantissa: logits of magnitude ~10 resolve to ~0.06
                reference = tiny_hf_model(arch, dtype=torch.float32, head_scale=3.0).cuda()
                assert near_tie(reference, prompt, out, plain, tolerance=0.25), (prompt, out, plain)


@pytest.mark.parametrize("cls", [TargetModel, FastTarget])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_draft_trees_equal_plain_on_cuda(cls, dtype):
    """Draft trees on the GPU (the tree mask on SDPA, the accepted path's K/V moved into place): greedy output is
    plain decoding's, in bf16 up to near-ties as above."""
    model = tiny_hf_model("qwen3", dtype=dtype, head_scale=3.0).cuda()
    target = cls(model)
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=8).to("cuda", dtype))
    for prompt in prompts(4, seed=3):
        plain, _ = decode(engine, prompt, max_new_tokens=24, no_draft=True)
        for tree, verify in ((5, "fixed"), ("auto", "adaptive"), (12, "adaptive")):
            out = decode(engine, prompt, max_new_tokens=24, tree=tree, verify=verify, ngram=True)[0]
            if dtype == torch.float32 or out == plain:
                assert out == plain, (tree, verify)
            else:
                reference = tiny_hf_model("qwen3", dtype=torch.float32, head_scale=3.0).cuda()
                assert near_tie(reference, prompt, out, plain, tolerance=0.25), (prompt, out, plain)


def test_batched_rows_with_trees_and_seeded_gumbel_rows_equal_plain_on_cuda():
    """Rows of a batch with different trees (off / 3 / auto), greedy and seeded gumbel: each is plain decoding's."""
    target = FastTarget(tiny_hf_model("llama", dtype=torch.float32, head_scale=3.0).cuda())
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=8).to("cuda", torch.float32))
    ps = prompts(9, seed=6)
    opts = [DecodeOptions(max_new_tokens=20, tree=("off", 3, "auto")[i % 3], verify="adaptive",
                          sampling=SamplingParams() if i % 2 else
                          SamplingParams(temperature=0.9, seed=100 + i, sampler="gumbel")) for i in range(9)]
    plain = [decode(engine, p, max_new_tokens=20, no_draft=True, sampling=o.sampling)[0] for p, o in zip(ps, opts)]
    together = {i: t for i, t, _ in BatchEngine(engine, rows=4).run(ps, opts)}
    assert [together[i] for i in range(9)] == plain


def test_batched_equals_solo_on_cuda():
    target = FastTarget(tiny_hf_model("qwen3", dtype=torch.float32, head_scale=3.0).cuda())
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=8).to("cuda", torch.float32))
    ps = prompts(6, seed=4)
    opts = [DecodeOptions(max_new_tokens=20, block_size=[8, 4][i % 2]) for i in range(6)]
    solo = [decode(engine, p, max_new_tokens=20, block_size=[8, 4][i % 2])[0] for i, p in enumerate(ps)]
    together = {i: t for i, t, _ in BatchEngine(engine, rows=4).run(ps, opts)}
    assert [together[i] for i in range(6)] == solo


def test_speculative_sampling_distribution_on_cuda():
    model = tiny_hf_model("qwen3", vocab=VOCAB, layers=2, head_scale=12.0, seed=5)
    joint = exact_joint(model)
    target = FastTarget(model.float().cuda())
    engine = SpeculativeEngine(target, tiny_drafter(target, std=0.5, seed=3, block_size=4).to("cuda", torch.float32))
    counts = np.zeros((VOCAB,) * 3)
    opts = [DecodeOptions(max_new_tokens=3, block_size=4, sampling=SamplingParams(temperature=1.0, seed=s))
            for s in range(3000)]
    for _, tokens, _ in BatchEngine(engine, rows=64).run([PROMPT] * len(opts), opts):
        counts[tuple(tokens)] += 1
    assert chi_square_pvalue(counts, joint) > 1e-3

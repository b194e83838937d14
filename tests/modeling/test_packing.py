import pytest
import torch
import torch.nn.functional as F
from torch import nn

from blockdraft.api import Pipeline
from blockdraft.decoding.costs import cost_key
from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.stats import GenerationStats
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.fast_target import FastTarget
from blockdraft.modeling.memory import memory_report
from blockdraft.modeling.packing import PackedLinear, Slice, pack_linears, packed_bytes, packing_available
from blockdraft.modeling.target import TargetModel
from tests.conftest import slow_unless, tiny_drafter, tiny_hf_model

needs_packing = pytest.mark.skipif(not packing_available(torch.float32), reason="torch build without oneDNN")


@needs_packing
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 40), (3, 40), (2, 5, 40), (4, 16, 40)])
def test_packed_linear_equals_f_linear(bias, shape):
    torch.manual_seed(0)
    lin = nn.Linear(40, 24, bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode():
        assert torch.allclose(PackedLinear(lin)(x), F.linear(x, lin.weight, lin.bias), atol=1e-5)


@needs_packing
def test_pack_linears_replaces_in_place_and_keeps_asked_dense_weights():
    model = tiny_hf_model("llama", dtype=torch.float32, tied=True)
    head = model.get_output_embeddings()
    dense = sum(m.weight.numel() * 4 for m in model.modules() if type(m) is nn.Linear)
    count = pack_linears(model, keep_dense=(head,))
    assert count == 4 * 7 + 1 and not any(type(m) is nn.Linear for m in model.modules())
    assert packed_bytes(model) == dense
    packed_head = model.get_output_embeddings()
    assert packed_head.weight is model.get_input_embeddings().weight  # the tie survives
    assert model.model.layers[0].mlp.up_proj.weight is None


@needs_packing
def test_packed_layers_refuse_gradients_unless_dense_is_kept():
    lin = nn.Linear(8, 4)
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="no gradient"):
        PackedLinear(lin)(x)
    PackedLinear(lin, keep_dense=True)(x).sum().backward()
    assert x.grad is not None and lin.weight.grad is not None


def test_packed_linear_needs_a_cpu_weight():
    with pytest.raises(ValueError, match="CPU"):
        PackedLinear(nn.Linear(4, 4, device="meta"))


@needs_packing
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_packed_fast_target_matches_dense(arch):
    model = tiny_hf_model(arch, dtype=torch.float32, layers=3)
    dense = FastTarget(tiny_hf_model(arch, dtype=torch.float32, layers=3))
    packed = FastTarget(model)
    assert packed.pack() and packed.packed
    for t in (dense, packed):
        t.set_feature_layers([0, 2])
    ids = torch.randint(0, 96, (2, 12))
    dc, pc = dense.new_cache(rows=2), packed.new_cache(rows=2)
    for lo, hi in [(0, 8), (8, 9), (9, 12)]:
        a, fa = dense.forward(ids[:, lo:hi], dc, lo)
        b, fb = packed.forward(ids[:, lo:hi], pc, lo)
        assert torch.allclose(a, b, atol=1e-4) and torch.allclose(fa, fb, atol=1e-4)


@needs_packing
@pytest.mark.parametrize("verify", slow_unless(["fixed", "adaptive"], "adaptive"))
def test_speculative_greedy_equals_plain_on_a_packed_target(verify, tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path))  # the adaptive policy's cost curve cache
    target = FastTarget(tiny_hf_model("qwen3", dtype=torch.float32, head_scale=4.0))
    target.pack()
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=6))
    for seed in range(3):
        prompt = torch.randint(0, 95, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
        runs = [[t for c in engine.decode(prompt, DecodeOptions(max_new_tokens=40, no_draft=plain, verify=verify),
                                          GenerationStats(1)) for t in c] for plain in (True, False)]
        assert runs[0] == runs[1]


@needs_packing
def test_memory_report_counts_packed_weights_and_the_cost_key_tells_them_apart():
    dense = TargetModel(tiny_hf_model("qwen3", dtype=torch.float32, tied=True))
    packed = TargetModel(tiny_hf_model("qwen3", dtype=torch.float32, tied=True))
    key = cost_key(packed, 8, 300)
    packed.pack()
    head = packed.lm_head.weight.numel() * 4  # kept dense (tied embedding) and packed
    assert memory_report(packed, None)["target_parameters_bytes"] == \
        memory_report(dense, None)["target_parameters_bytes"] + head
    assert cost_key(packed, 8, 300) != key == cost_key(dense, 8, 300)


@needs_packing
def test_stock_model_is_a_dense_copy_with_the_same_outputs(tiny_target_dir):
    target = TargetModel.from_pretrained(tiny_target_dir)
    assert target.stock_model() is target.model  # not packed: the model itself
    target.pack()
    stock = target.stock_model()
    assert stock is not target.model and stock is target.stock_model()  # loaded once
    assert any(type(m) is nn.Linear for m in stock.modules())
    ids = torch.randint(0, 200, (1, 10))
    with torch.inference_mode():
        assert torch.allclose(stock(ids).logits, target.model(ids).logits, atol=1e-4)


def test_compile_and_pack_together_are_refused():
    with pytest.raises(InvalidArgumentError, match="compile"):
        Pipeline.load("does-not-matter", compile="default", pack=True)


@needs_packing
def test_packed_drafter_drafts_the_same_and_refuses_to_be_saved(tmp_path):
    from blockdraft.modeling.checkpoint import save_drafter
    from blockdraft.modeling.drafter import DraftCache

    target = FastTarget(tiny_hf_model("qwen3", dtype=torch.float32))
    dense, packed = tiny_drafter(target, block_size=6), tiny_drafter(target, block_size=6)
    assert packed.pack() and packed.packed and not dense.packed
    target.set_feature_layers(dense.config.target_layer_ids)
    _, feats = target.forward(torch.randint(0, 95, (1, 10)), target.new_cache(), 0)
    block = target.embedding(torch.full((1, 6), 95))
    with torch.inference_mode():
        a = dense.draft(block, 10, feats, DraftCache(2))
        b = packed.draft(block, 10, feats, DraftCache(2))
    assert torch.allclose(a, b, atol=1e-5)
    with pytest.raises(InvalidArgumentError, match="prepacked"):
        save_drafter(packed, tmp_path / "d")


@needs_packing
def test_fused_projections_keep_the_hugging_face_forward_working():
    model = tiny_hf_model("qwen2", dtype=torch.float32, layers=2)  # qwen2: q/k/v have biases
    ids = torch.randint(0, 96, (1, 7))
    with torch.inference_mode():
        before = model(ids).logits
        target = FastTarget(model)
        target.pack()
        assert len(target._fused) == 2 and isinstance(model.model.layers[0].self_attn.q_proj, Slice)
        assert torch.allclose(model(ids).logits, before, atol=1e-4)  # the HF forward, through the slices
        assert torch.allclose(target.forward(ids, target.new_cache(), 0, features=False)[0], before, atol=1e-4)
    dense = sum(p.numel() * 4 for p in tiny_hf_model("qwen2", dtype=torch.float32, layers=2).parameters())
    head = 96 * 32 * 4  # the LM head stays dense (the drafter reads it) and is packed as well
    assert packed_bytes(model) + sum(p.numel() * 4 for p in model.parameters()) == dense + head

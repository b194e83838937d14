import torch

from blockdraft.modeling.memory import describe, memory_report, param_bytes
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_drafter, tiny_hf_model


def test_report_counts_parameters_and_per_token_caches():
    model = tiny_hf_model("qwen3", layers=4, hidden=32, dtype=torch.float32)
    target = TargetModel(model)
    drafter = tiny_drafter(target, layers=2).float()
    r = memory_report(target, drafter, context=100, draft_window=40)
    assert r["target_parameters_bytes"] == sum(p.numel() for p in model.parameters()) * 4
    assert r["target_kv_bytes_per_token"] == 2 * 4 * 2 * 8 * 4  # K and V, 4 layers, 2 kv heads of 8, fp32
    assert r["drafter_cache_bytes"] == r["drafter_cache_bytes_per_token"] * 40  # the window caps it
    assert r["drafter_parameters_bytes"] == param_bytes(drafter) < r["target_parameters_bytes"]
    assert r["total_bytes"] == (r["target_parameters_bytes"] + r["target_kv_bytes"] + r["drafter_parameters_bytes"]
                                + r["drafter_cache_bytes"])
    assert "drafter" in describe(r) and "at 100 tokens" in describe(r)

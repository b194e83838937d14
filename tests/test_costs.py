from blockdraft.costs import verify_cost_curve
from blockdraft.fast_target import FastTarget
from blockdraft.target import TargetModel
from tests.conftest import tiny_hf_model


def test_cost_curve_covers_every_verify_size_and_leaves_the_cache_intact():
    for target in (TargetModel(tiny_hf_model("qwen3")), FastTarget(tiny_hf_model("llama"))):
        target.set_feature_layers([1])
        curve = verify_cost_curve(target, 6, context=20, repeats=2)
        assert sorted(curve) == [1, 2, 3, 4, 5, 6] and all(t > 0 for t in curve.values())

import pytest
import torch

from blockdraft.decoding.batch_engine import BatchEngine
from blockdraft.decoding.costs import cost_key, monotone, report_cost_curve, verify_cost_curve
from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.fast_target import FastTarget
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_drafter, tiny_hf_model


def test_cost_curve_covers_every_verify_size_and_leaves_the_cache_intact():
    for target in (TargetModel(tiny_hf_model("qwen3")), FastTarget(tiny_hf_model("llama"))):
        target.set_feature_layers([1])
        curve = verify_cost_curve(target, 6, context=20, repeats=2)
        assert sorted(curve) == [1, 2, 3, 4, 5, 6] and all(t > 0 for t in curve.values())


def test_batch_cost_curve_needs_the_fast_path_and_keeps_every_row_intact():
    target = FastTarget(tiny_hf_model("llama"))
    target.set_feature_layers([1])
    curve = verify_cost_curve(target, 4, context=20, repeats=2, rows=3)
    assert sorted(curve) == [1, 2, 3, 4] and all(t > 0 for t in curve.values())
    with pytest.raises(InvalidArgumentError, match="3-row cost curve needs a fast-path target"):
        verify_cost_curve(TargetModel(tiny_hf_model("qwen3")), 4, context=20, rows=3)


def test_batch_engine_measures_its_batch_size_once(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path))
    target = FastTarget(tiny_hf_model("llama"))
    engine = SpeculativeEngine(target, tiny_drafter(target, block_size=4))
    opts = DecodeOptions(max_new_tokens=6, verify="adaptive")
    list(BatchEngine(engine, rows=3).run([[1, 2, 3], [4, 5], [6]], opts))
    # the curve reaches a block of drafts or a tree of TREE_BUDGET nodes
    assert sorted(engine.policy.batch_cost) == [3] and engine.policy.batch_cost[3].numel() == engine.verify_range
    assert len(list((tmp_path / "costs").glob("*.json"))) == 2  # the one-row curve and the 3-row one


def test_every_round_times_each_size_once_alternating_direction():
    target = FastTarget(tiny_hf_model("llama"))
    seen: list[int] = []
    forward = target.forward
    target.forward = lambda ids, *a, **k: (seen.append(ids.shape[1]), forward(ids, *a, **k))[1]
    verify_cost_curve(target, 3, context=10, repeats=2)
    assert seen == [10, 1, 2, 3, 3, 2, 1, 1, 2, 3]  # prompt, warm-up round, then rounds up and down


def test_the_cache_key_tells_cpus_apart(monkeypatch):
    target = FastTarget(tiny_hf_model("llama"))
    key = cost_key(target, 4, 20)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "SOMETHING_ELSE")
    assert cost_key(target, 4, 20) != key


def _fake_clock(monkeypatch, target: FastTarget, seconds: dict[int, list[float]]) -> None:
    """Each timed forward of q tokens takes the next of seconds[q] on a fake clock (the warm-up is free)."""
    clock = [0.0]
    calls = {q: 0 for q in seconds}
    forward = target.forward

    def timed(ids, *a, **k):
        q = ids.shape[1]
        if q in seconds and calls[q] > 0:  # after the untimed warm-up round
            clock[0] += seconds[q][calls[q] - 1]
        calls[q] = calls.get(q, 0) + 1
        return forward(ids, *a, **k)
    target.forward = timed
    monkeypatch.setattr("blockdraft.decoding.costs.now", lambda _device=None: clock[0])


def test_the_curve_is_the_fastest_round_made_non_decreasing(monkeypatch):
    assert monotone([1.0, 3.0, 2.0, 4.0, 4.0, 3.5, 6.0]) == pytest.approx([1, 2.5, 2.5, 23 / 6, 23 / 6, 23 / 6, 6])
    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    target = FastTarget(tiny_hf_model("llama"))
    _fake_clock(monkeypatch, target, {1: [1.0, 1.0], 2: [5.0, 2.0], 3: [1.5, 1.5]})  # a neighbour slows q = 2 once
    curve = verify_cost_curve(target, 3, context=10, repeats=2)
    assert curve == pytest.approx({1: 1.0, 2: 1.75, 3: 1.75})  # min per q: 1, 2, 1.5, then pooled


def test_a_report_curve_takes_each_size_s_median_round(monkeypatch):
    target = FastTarget(tiny_hf_model("llama"))
    seconds = {1: [1.0, 3.0, 1.0], 2: [2.0, 2.0, 9.0], 3: [3.0, 2.5, 3.0]}
    _fake_clock(monkeypatch, target, seconds)
    assert verify_cost_curve(target, 3, context=10, repeats=3, statistic="median") == \
        pytest.approx({1: 1.0, 2: 2.0, 3: 3.0})
    target = FastTarget(tiny_hf_model("llama"))
    _fake_clock(monkeypatch, target, seconds)
    assert verify_cost_curve(target, 3, context=10, repeats=3) == pytest.approx({1: 1.0, 2: 2.0, 3: 2.5})
    with pytest.raises(InvalidArgumentError, match="statistic='mean': expected one of"):
        verify_cost_curve(target, 3, context=10, statistic="mean")
    target = FastTarget(tiny_hf_model("llama"))
    rounds: list[int] = []
    forward = target.forward
    target.forward = lambda ids, *a, **k: (rounds.append(ids.shape[1]), forward(ids, *a, **k))[1]
    assert sorted(report_cost_curve(target, 2, context=10)) == [1, 2]
    assert rounds.count(1) == 10  # 9 timed rounds after the warm-up

import pytest
import torch

from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.fast_target import FastTarget
from blockdraft.modeling.target import TargetModel
from blockdraft.train.data import Sequence
from blockdraft.train.features import (
    CachedFeatures,
    LazyCachedFeatures,
    MemoryFeatures,
    OnlineFeatures,
    build_feature_cache,
    cached_layer_ids,
    feature_bytes,
)
from tests.conftest import tiny_hf_model


def test_cache_matches_online_features_and_resumes(tmp_path):
    target = TargetModel(tiny_hf_model("qwen3", dtype=torch.float32))
    target.set_feature_layers([0, 2])
    seqs = [Sequence(f"s{i}", torch.randint(0, 96, (5 + i,)), torch.ones(5 + i, dtype=torch.bool)) for i in range(5)]
    build_feature_cache(target, seqs[:3], tmp_path, shard_size=2)
    build_feature_cache(target, seqs, tmp_path, shard_size=2)  # only the two new ones are computed
    assert len(list(tmp_path.glob("feats-*.safetensors"))) == 3
    cached, online = CachedFeatures(tmp_path, [0, 2]), OnlineFeatures(target)
    for s in seqs:
        assert torch.allclose(cached(s), online(s), atol=2e-3, rtol=1e-2)  # stored as fp16
    assert feature_bytes(1000, [0, 2], 32) == 1000 * 2 * 32 * 2
    with pytest.raises(InvalidArgumentError, match=r"holds layers \[0, 2\], not \[1\]"):
        CachedFeatures(tmp_path, [0, 1])
    with pytest.raises(InvalidArgumentError, match="'zz' is not in the feature cache"):
        cached(Sequence("zz", torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool)))


def test_a_cache_of_more_layers_serves_any_subset_in_any_order(tmp_path):
    target = TargetModel(tiny_hf_model("llama", dtype=torch.float32))
    seq = Sequence("a", torch.randint(0, 96, (7,)), torch.ones(7, dtype=torch.bool))
    target.set_feature_layers([0, 1, 3])
    build_feature_cache(target, [seq], tmp_path)
    for subset in ([3], [1, 0], [0, 1, 3]):
        target.set_feature_layers(subset)
        assert torch.allclose(CachedFeatures(tmp_path, subset)(seq), OnlineFeatures(target)(seq), atol=2e-3, rtol=1e-2)
    assert cached_layer_ids(tmp_path) == [0, 1, 3] and cached_layer_ids(tmp_path / "none") is None


def test_a_lazy_cache_fills_as_steps_use_it_and_serves_what_a_built_cache_serves(tmp_path):
    target = TargetModel(tiny_hf_model("llama", dtype=torch.float32))
    seqs = [Sequence(f"s{i}", torch.randint(0, 96, (4 + i,)), torch.ones(4 + i, dtype=torch.bool)) for i in range(5)]
    target.set_feature_layers([0, 1, 3])
    build_feature_cache(target, seqs, tmp_path / "built")
    built = CachedFeatures(tmp_path / "built", [3, 0])
    target.set_feature_layers([3, 0])  # the drafter's layers; the cache keeps a superset
    lazy = LazyCachedFeatures(target, tmp_path / "lazy", [3, 0], cache_layer_ids=[0, 1, 3], shard_size=2)
    first = [lazy(s) for s in seqs[:3]]  # two written as a shard, one pending
    assert sorted(lazy.entries) == ["s0", "s1"] and list(lazy.pending) == ["s2"]
    assert target.feature_layer_ids == [3, 0]  # computing the cache's layers leaves the drafter's in place
    assert all(torch.equal(got, built(s)) for got, s in zip(first, seqs))  # fp16 as stored, on first use too
    assert torch.equal(lazy(seqs[0]), first[0])  # read back from its shard
    with pytest.raises(InvalidArgumentError, match="being written by another process"):
        LazyCachedFeatures(target, tmp_path / "lazy", [3, 0])  # one writer at a time
    lazy.flush()
    lazy.flush()  # nothing pending: no empty shard
    assert len(list((tmp_path / "lazy").glob("feats-*.safetensors"))) == 2
    lazy.close()

    def no_target(_seq):
        raise AssertionError("a cached sequence ran the target")

    again = LazyCachedFeatures(target, tmp_path / "lazy", [0], shard_size=2)  # a later run: the cache's layers
    again.online = no_target
    assert torch.equal(again(seqs[2]), CachedFeatures(tmp_path / "built", [0])(seqs[2]))
    assert cached_layer_ids(tmp_path / "lazy") == [0, 1, 3]
    with pytest.raises(InvalidArgumentError, match=r"holds layers \[0, 1, 3\], not \[2\]"):
        LazyCachedFeatures(target, tmp_path / "lazy", [2])
    with pytest.raises(InvalidArgumentError, match=r"holds layers \[1\], not \[3, 0\]"):
        LazyCachedFeatures(target, tmp_path / "new", [3, 0], cache_layer_ids=[1])
    assert not (tmp_path / "new").exists()  # refused before anything was written
    with pytest.raises(InvalidArgumentError, match="have 4 tokens, the sequence has 3"):
        again(Sequence("s0", torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool)))


def test_a_shard_written_but_never_indexed_is_not_overwritten(tmp_path):
    target = TargetModel(tiny_hf_model("llama", dtype=torch.float32))
    target.set_feature_layers([1])
    seqs = [Sequence(f"s{i}", torch.randint(0, 96, (4 + i,)), torch.ones(4 + i, dtype=torch.bool)) for i in range(3)]
    build_feature_cache(target, seqs[:1], tmp_path)
    orphan = tmp_path / "feats-00007.safetensors"  # a process killed between a shard and its index entry
    orphan.write_bytes(b"left over")
    build_feature_cache(target, seqs, tmp_path)
    assert orphan.read_bytes() == b"left over" and (tmp_path / "feats-00008.safetensors").is_file()
    assert torch.equal(CachedFeatures(tmp_path, [1])(seqs[2]), OnlineFeatures(target)(seqs[2]).half().float())


@pytest.mark.parametrize("fast", [False, True])
def test_memory_features_from_padded_batches_equal_one_by_one(fast):
    model = tiny_hf_model("llama", dtype=torch.float32)
    target = FastTarget(model) if fast else TargetModel(model)
    target.set_feature_layers([2, 0])
    lengths = (3, 11, 7, 11, 1, 9)
    seqs = [Sequence(f"s{i}", torch.randint(0, 96, (n,)), torch.ones(n, dtype=torch.bool)) for i, n in enumerate(lengths)]
    memory, online = MemoryFeatures(target, seqs, torch.float32, tokens_per_batch=24), OnlineFeatures(target)
    for s in seqs:  # right padding never reaches a real token (causal attention)
        got = memory(s)
        assert got.shape == (s.input_ids.numel(), 2 * 32) and not got.is_inference()
        assert torch.allclose(got, online(s), atol=1e-5, rtol=1e-4)
    with pytest.raises(InvalidArgumentError, match="'zz' has no features in memory"):
        memory(Sequence("zz", torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool)))


def test_greedy_tokens_come_from_the_feature_forward_in_memory_and_online():
    model = tiny_hf_model("llama", dtype=torch.float32)
    target = FastTarget(model)
    target.set_feature_layers([1])
    seqs = [Sequence(f"s{i}", torch.randint(0, 96, (n,)), torch.ones(n, dtype=torch.bool)) for i, n in enumerate((4, 9))]
    memory = MemoryFeatures(target, seqs, torch.float32, tokens_per_batch=64, greedy=True)
    online = OnlineFeatures(target, greedy=True)
    for s in seqs:
        online(s)
        want = model(input_ids=s.input_ids[None]).logits[0].argmax(-1)
        assert torch.equal(online.greedy_tokens(s), want) and torch.equal(memory.greedy_tokens(s), want)
        with pytest.raises(InvalidArgumentError, match="no greedy tokens"):
            online.greedy_tokens(s)  # handed out once
    with pytest.raises(InvalidArgumentError, match="no greedy tokens"):
        MemoryFeatures(target, seqs, torch.float32).greedy_tokens(seqs[0])

import torch

from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.stats import GenerationStats
from blockdraft.modeling.fast_target import FastTarget, supports_fast_path
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_drafter, tiny_hf_model


def test_logits_and_features_equal_the_hf_forward(arch):
    model = tiny_hf_model(arch, layers=5)
    fast, ref = FastTarget(model), TargetModel(model)
    assert supports_fast_path(model)
    for t in (fast, ref):
        t.set_feature_layers([3, 0, 2])
    ids = torch.randint(0, 96, (1, 20))
    fc, rc = fast.new_cache(capacity=8), ref.new_cache()  # capacity 8 forces the cache to grow
    for lo, hi in [(0, 9), (9, 10), (10, 20)]:
        a, fa = fast.forward(ids[:, lo:hi], fc, lo)
        b, fb = ref.forward(ids[:, lo:hi], rc, lo)
        assert torch.allclose(a, b, atol=1e-10) and torch.allclose(fa, fb, atol=1e-10)
    fast.rollback(fc, 12)  # free: no copy, stale entries are overwritten
    ref.rollback(rc, 12)
    new = torch.randint(0, 96, (1, 4))
    assert torch.allclose(fast.forward(new, fc, 12)[0], ref.forward(new, rc, 12)[0], atol=1e-10)


def test_rows_at_different_lengths_match_single_rows():
    model = tiny_hf_model("qwen3")
    fast = FastTarget(model)
    fast.set_feature_layers([1])
    prompts = [torch.randint(0, 96, (1, n)) for n in (5, 11, 8)]
    cache = fast.new_cache(rows=3)
    for r, p in enumerate(prompts):
        fast.forward(p, cache, 0, rows=[r])
    step = torch.randint(0, 96, (3, 2))
    batched, feats = fast.forward(step, cache, [5, 11, 8])
    for r, p in enumerate(prompts):
        solo, solo_feats = fast.forward(torch.cat([p, step[r:r + 1]], 1), fast.new_cache(), 0)
        assert torch.allclose(batched[r], solo[0, -2:], atol=1e-10)
        assert torch.allclose(feats[r], solo_feats[0, -2:], atol=1e-10)
    sub, _ = fast.forward(step[[2, 0]], cache, [8, 5], rows=[2, 0])  # a gathered subset of rows
    assert torch.allclose(sub, batched[[2, 0]], atol=1e-10)


def test_engine_on_the_fast_path_equals_hf_generate(arch):
    model = tiny_hf_model(arch)
    fast = FastTarget(model)
    engine = SpeculativeEngine(fast, tiny_drafter(fast, block_size=6))
    prompt = [7, 3, 9, 1, 4]
    stats = GenerationStats(1)
    out = [t for c in engine.decode(prompt, DecodeOptions(max_new_tokens=30), stats) for t in c]
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=30, min_new_tokens=30, do_sample=False)
    assert out == ref[0, 5:].tolist()


def test_rows_attend_to_views_of_the_cache(monkeypatch):
    """Rows 0..b-1 (rows=None) read their keys and values in place, whatever their starts, and so does any
    subset of rows, one run of consecutive cache rows at a time. A gather here would copy the keys and values
    of every row through memory in every layer."""
    import blockdraft.modeling.fast_target as ft

    fast = FastTarget(tiny_hf_model("llama", layers=2))
    cache = fast.new_cache(rows=3, capacity=32)
    fast.forward(torch.randint(0, 96, (3, 6)), cache, 0, features=False)
    seen = []
    sdpa = ft.F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append(k.untyped_storage().data_ptr() == cache.k.untyped_storage().data_ptr())
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(ft.F, "scaled_dot_product_attention", spy)
    fast.forward(torch.randint(0, 96, (3, 1)), cache, [6, 4, 5], features=False)  # different starts, rows in order
    assert seen and all(seen)
    seen.clear()
    fast.forward(torch.randint(0, 96, (2, 1)), cache, [8, 7], features=False, rows=[2, 0])  # two runs of one row
    assert len(seen) == 2 * 2 and all(seen)


def test_runs_of_consecutive_cache_rows():
    from blockdraft.modeling.fast_target import _runs

    assert _runs([0, 1, 2, 5, 6]) == [(0, 3, 0), (3, 5, 5)]
    assert _runs([3]) == [(0, 1, 3)]
    assert _runs([2, 0, 1]) == [(0, 1, 2), (1, 3, 0)]
    assert _runs([4, 5, 7, 9, 10, 11]) == [(0, 2, 4), (2, 3, 7), (3, 6, 9)]


def test_scattered_rows_verifying_several_tokens_equal_each_row_alone(arch):
    """Rows 0, 2, 3 of a 4-row cache (two runs), ragged, each verifying its own number of tokens: the logits
    of every row equal that row alone (the grouped attention path on a CPU)."""
    fast = FastTarget(tiny_hf_model(arch, layers=2))
    prompts = [torch.randint(0, 96, (1, n)) for n in (5, 9, 7, 6)]
    cache = fast.new_cache(rows=4)
    for r, p in enumerate(prompts):
        fast.forward(p, cache, 0, rows=[r], features=False)
    rows, lengths = [0, 2, 3], [3, 1, 4]
    step = torch.randint(0, 96, (3, 4))
    logits, _ = fast.forward(step, cache, [5, 7, 6], features=False, rows=rows, lengths=lengths)
    for r, n, lg, ids in zip(rows, lengths, logits.split(lengths), step):
        solo, _ = fast.forward(torch.cat([prompts[r], ids[None, :n]], 1), fast.new_cache(), 0, features=False)
        assert torch.allclose(lg, solo[0, -n:], atol=1e-10)


def test_rows_cut_into_stretches_over_their_own_keys_equal_each_row_alone(arch, monkeypatch):
    """With cuts made cheap (call_keys=1), every stretch of rows attends over its own longest row's keys only:
    a plain step and a ragged verify over rows of 3-40 tokens give each row's solo logits."""
    import blockdraft.modeling.fast_target as ft

    fast = FastTarget(tiny_hf_model(arch, layers=2))
    fast.call_keys = 1
    prompts = [torch.randint(0, 96, (1, n)) for n in (40, 3, 5, 33, 6)]
    cache = fast.new_cache(rows=5)
    for r, p in enumerate(prompts):
        fast.forward(p, cache, 0, rows=[r], features=False)
    plans = []
    cut = ft._by_span
    monkeypatch.setattr(ft, "_by_span", lambda *a: plans.append(cut(*a)) or plans[-1])
    starts = [p.shape[1] for p in prompts]
    for lengths in ([1] * 5, [1, 4, 1, 2, 3]):
        step = torch.randint(0, 96, (5, max(lengths)))
        logits, _ = fast.forward(step, cache, starts, features=False, lengths=lengths)
        for r, n, lg in zip(range(5), lengths, logits.split(lengths)):
            solo, _ = fast.forward(torch.cat([prompts[r], step[r:r + 1, :n]], 1), fast.new_cache(), 0, features=False)
            assert torch.allclose(lg, solo[0, -n:], atol=1e-10)
            fast.rollback(cache, starts[r], row=r)
    assert plans[0] == [(0, 1, 0, 41), (1, 2, 1, 4), (2, 3, 2, 6), (3, 4, 3, 34), (4, 5, 4, 7)]  # each alone


def test_extra_queries_attend_apart_when_padding_every_row_would_cost_more():
    from blockdraft.modeling.fast_target import _extra_queries

    one_run = [(0, 6, 0, 40)]
    # one row verifying 5 tokens next to five verifying 1: padding would give each of them 4 more queries
    assert _extra_queries([1, 1, 5, 1, 1, 1], one_run, 5) == [(2, 3, 2, 5, 40)]
    # stretches of consecutive long rows go together, in the cache rows their run starts at, over its keys
    assert _extra_queries([1, 4, 3, 1, 1, 1, 2, 2], [(0, 5, 0, 30), (5, 8, 9, 20)], 4) == [(1, 3, 1, 4, 30),
                                                                                           (6, 8, 10, 2, 20)]
    assert _extra_queries([2, 2, 1], [(0, 3, 0, 9)], 2) is None  # most rows have two: padding is cheaper
    assert _extra_queries([1, 4, 1, 4, 1, 4], one_run, 4) is None  # three calls of one row each cost more
    assert _extra_queries([1, 1, 1], [(0, 3, 0, 9)], 1) is None


def test_stretches_of_rows_attend_over_their_own_keys_where_a_call_costs_less_than_the_keys_it_saves():
    from blockdraft.modeling.fast_target import _by_span

    # one long row among short ones: apart, the others stop reading 3 x 580 keys for two more calls
    assert _by_span([(0, 4, 0)], [100, 90, 700, 120], call_keys=320) == [(0, 2, 0, 100), (2, 3, 2, 700),
                                                                         (3, 4, 3, 120)]
    # rows of about the same length: a cut would save fewer keys than a call costs
    assert _by_span([(0, 4, 0)], [100, 90, 140, 120], call_keys=320) == [(0, 4, 0, 140)]
    # runs stay apart (their cache rows are not consecutive), each cut on its own
    assert _by_span([(0, 2, 3), (2, 3, 9)], [50, 900, 60], call_keys=320) == [(0, 1, 3, 50), (1, 2, 4, 900),
                                                                              (2, 3, 9, 60)]
    # at most `longest` rows a call
    assert _by_span([(0, 40, 0)], [100] * 40, call_keys=320, longest=16) == [(0, 16, 0, 100), (16, 32, 16, 100),
                                                                              (32, 40, 32, 100)]


def test_rows_whose_further_queries_attend_apart_equal_each_row_alone(arch, monkeypatch):
    """Scattered rows, one of them verifying 5 tokens and the others 1 or 2: every row's first query attends
    with the others, the longer rows' further queries apart (no padding), and each row's logits equal that
    row alone."""
    import blockdraft.modeling.fast_target as ft

    fast = FastTarget(tiny_hf_model(arch, layers=2))
    prompts = [torch.randint(0, 96, (1, n)) for n in (5, 9, 7, 6, 8, 4, 3, 10)]
    cache = fast.new_cache(rows=8)
    for r, p in enumerate(prompts):
        fast.forward(p, cache, 0, rows=[r], features=False)
    rows, lengths = [0, 1, 2, 4, 5, 6, 7], [1, 1, 5, 1, 1, 1, 2]
    plans = []
    plan = ft._extra_queries
    monkeypatch.setattr(ft, "_extra_queries", lambda *a: plans.append(plan(*a)) or plans[-1])
    step = torch.randint(0, 96, (7, 5))
    starts = [prompts[r].shape[1] for r in rows]
    logits, _ = fast.forward(step, cache, starts, features=False, rows=rows, lengths=lengths)
    assert [[e[:4] for e in plan] for plan in plans] == [[(2, 3, 2, 5), (6, 7, 7, 2)]]
    for r, n, lg, ids in zip(rows, lengths, logits.split(lengths), step):
        solo, _ = fast.forward(torch.cat([prompts[r], ids[None, :n]], 1), fast.new_cache(), 0, features=False)
        assert torch.allclose(lg, solo[0, -n:], atol=1e-10)


def test_a_ragged_batch_equals_each_row_alone_and_runs_only_its_real_tokens(arch, monkeypatch):
    """lengths=: rows verify different numbers of tokens; each row's real tokens give its solo logits and
    features (flat, rows one after another), the rest of its cache is untouched, and the projections see
    only the real tokens (a row of 5 next to rows of 1 costs 5 + 1 + 1 tokens, not 15)."""
    import blockdraft.modeling.fast_target as ft

    model = tiny_hf_model(arch, layers=3)
    fast = FastTarget(model)
    fast.set_feature_layers([0, 2])
    prompts = [torch.randint(0, 96, (1, n)) for n in (5, 11, 8)]
    cache = fast.new_cache(rows=3)
    for r, p in enumerate(prompts):
        fast.forward(p, cache, 0, rows=[r])
    step, lengths = torch.randint(0, 96, (3, 5)), [1, 5, 2]
    seen = []
    mlp = ft.FastTarget._mlp
    monkeypatch.setattr(ft.FastTarget, "_mlp", lambda self, i, layer, h: seen.append(h.shape[0]) or mlp(self, i, layer, h))
    logits, feats = fast.forward(step, cache, [5, 11, 8], lengths=lengths)
    assert seen == [sum(lengths)] * 3 and logits.shape[0] == feats.shape[0] == sum(lengths)
    monkeypatch.undo()
    for r, (p, n, lg, fe) in enumerate(zip(prompts, lengths, logits.split(lengths), feats.split(lengths))):
        solo, solo_feats = fast.forward(torch.cat([p, step[r:r + 1, :n]], 1), fast.new_cache(), 0)
        assert torch.allclose(lg, solo[0, -n:], atol=1e-10)
        assert torch.allclose(fe, solo_feats[0, -n:], atol=1e-10)
    fast.rollback(cache, 5, row=0)  # the padding after row 0's one real token is rolled back: next step
    nxt = torch.randint(0, 96, (1, 3))  # continues exactly as if the row had been alone
    sub, _ = fast.forward(nxt, cache, [6], rows=[0])
    solo, _ = fast.forward(torch.cat([prompts[0], step[:1, :1], nxt], 1), fast.new_cache(), 0)
    assert torch.allclose(sub[0], solo[0, -3:], atol=1e-10)
    full, _ = fast.forward(step[:, :2], fast.new_cache(rows=3), 0, lengths=[2, 2, 2])  # no padding: flat too
    assert full.shape[0] == 6
    import pytest
    with pytest.raises(ValueError, match="lengths"):
        fast.forward(step, cache, [5, 11, 8], lengths=[1, 6, 2])

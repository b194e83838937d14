"""The gumbel sampler: exact draws from the (truncated) target distribution, and seeded speculative output that
is plain decoding's token for token, whatever the drafter, block size, verify length, lookups or batch."""
import numpy as np
import pytest
import torch

from blockdraft.decoding.adaptive import AdaptiveVerify
from blockdraft.decoding.batch_engine import BatchEngine
from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.gumbel import position_key, race_choice, race_noise
from blockdraft.decoding.sampling import SamplingParams, probabilities
from blockdraft.decoding.stats import GenerationStats
from blockdraft.modeling.fast_target import FastTarget
from tests.conftest import slow_unless, tiny_drafter, tiny_hf_model
from tests.decoding.test_engine import chi_square_pvalue

P = torch.tensor([0.05, 0.3, 0.15, 0.25, 0.1, 0.15], dtype=torch.float64)


def draws(probs: torch.Tensor, seeds: range, position: int = 7) -> np.ndarray:
    """One Gumbel-max draw per seed at one position, as counts per token."""
    picks = [int(race_choice(probs, race_noise(s, [position], probs.shape[-1], "cpu")[0])) for s in seeds]
    return np.bincount(picks, minlength=probs.shape[-1]).astype(float)


def test_noise_is_a_pure_function_of_seed_and_position():
    pos = [0, 5, 6, 1_000_000]
    a, b = race_noise(3, pos, 50, "cpu"), race_noise(3, pos, 50, "cpu")
    assert torch.equal(a, b) and a.dtype == torch.float64 and bool((a > 0).all())
    assert torch.equal(race_noise(3, pos[1:2], 50, "cpu")[0], a[1])  # a row does not depend on the others asked
    assert not torch.equal(a[1], a[2]) and not torch.equal(a, race_noise(4, pos, 50, "cpu"))
    assert len({position_key(s, t) for s in range(30) for t in range(300)}) == 30 * 300
    e = race_noise(0, list(range(200)), 500, "cpu").flatten()  # 100K exponentials: exp(-E) is flat in 20 bins
    u = torch.exp(-e).numpy()
    assert chi_square_pvalue(np.histogram(u, bins=20, range=(0, 1))[0].astype(float), np.full(20, 0.05)) > 1e-3


def test_the_tensor_hash_is_splitmix64():
    """The int64 tensor arithmetic (wrapping products, logical shifts) computes splitmix64's stream exactly."""
    from blockdraft.decoding.gumbel import _GOLDEN, _MASK, _splitmix64

    noise = race_noise(11, [3, 2**40], 1000, "cpu")
    for row, position in enumerate([3, 2**40]):
        key = position_key(11, position)
        for x in (0, 1, 500, 999):
            word = _splitmix64((key + (x + 1) * _GOLDEN) & _MASK)
            u = ((word >> 11) + 0.5) * 2.0 ** -53
            assert float(noise[row, x]) == pytest.approx(-np.log(u), rel=1e-14)


def test_the_gumbel_max_draw_has_the_exact_distribution():
    assert chi_square_pvalue(draws(P, range(20_000)), P.numpy()) > 1e-3


def test_draws_at_two_positions_are_independent():
    picks = np.zeros((6, 6))
    for s in range(12_000):
        a, b = race_choice(P.expand(2, -1), race_noise(s, [10, 11], 6, "cpu")).tolist()
        picks[a, b] += 1
    assert chi_square_pvalue(picks, np.outer(P, P)) > 1e-3


@pytest.mark.parametrize("top_k, top_p", slow_unless([(3, 1.0), (0, 0.6), (4, 0.8)], (4, 0.8)))  # top-k and top-p
def test_truncation_is_exact(top_k, top_p):
    truncated = probabilities(P.log()[None], SamplingParams(1.0, top_k, top_p))[0].double()
    counts = draws(truncated, range(12_000))
    assert counts[truncated.numpy() == 0].sum() == 0  # never a token outside the support
    keep = truncated.numpy() > 0
    assert chi_square_pvalue(counts[keep], truncated.numpy()[keep]) > 1e-3


def test_a_wrong_distribution_is_rejected():
    assert chi_square_pvalue(draws(P, range(20_000)), np.roll(P.numpy(), 1)) < 1e-6


# ---------------------------------------------------------------- speculative == plain, token for token
# Every seed is a different random path checked token for token; 400 of them per configuration (2,800 decodes
# and a 400-request batch) reach the shares of deep and looked-up cycles asserted below. 1000 took 6 min of CI.
SEEDS = 400
PROMPT = [3, 1, 4, 1, 5, 3, 1, 4]  # repeats, so looked-up drafts fire


@pytest.fixture(scope="module")
def pair():
    """A tiny float64 target with a small vocabulary (drafts pass often) and a random drafter."""
    model = tiny_hf_model("qwen3", vocab=8, layers=2, head_scale=0.7, seed=4)
    target = FastTarget(model, None)
    return target, tiny_drafter(target, block_size=6, std=0.05, seed=2)


def options(seed: int, **kw) -> DecodeOptions:
    sampling = SamplingParams(kw.pop("temperature", 1.0), kw.pop("top_k", 0), kw.pop("top_p", 1.0), seed,
                              kw.pop("draft", "sample"), "gumbel")
    return DecodeOptions(max_new_tokens=kw.pop("max_new_tokens", 12), sampling=sampling, **kw)


def run(engine: SpeculativeEngine, opts: DecodeOptions, stats: GenerationStats | None = None) -> list[int]:
    return [t for chunk in engine.decode(PROMPT, opts, stats or GenerationStats(1)) for t in chunk]


@pytest.fixture(scope="module")
def plain(pair):
    target, _ = pair
    engine = SpeculativeEngine(target)
    return {(seed, t): run(engine, options(seed, temperature=t)) for seed in range(SEEDS) for t in (1.0, 0.6)}


CONFIGS = {  # name -> (options, least share of cycles that commit >= 3 drafts (block 3: 2), that are looked up)
    "fixed": (dict(), 0.1, 0.0),
    "fixed, block 3": (dict(block_size=3), 0.1, 0.0),
    "fixed, greedy drafts": (dict(draft="greedy"), 0.0, 0.0),  # argmax drafts rarely match a sampled choice
    "adaptive": (dict(verify="adaptive"), 0.1, 0.0),
    "adaptive + lookups": (dict(verify="adaptive", ngram=True), 0.1, 0.0),  # the policy may prefer the drafter
    "fixed + lookups": (dict(ngram=True), 0.1, 0.2),  # without a policy every match is verified
    "fixed + lookups, T=0.6": (dict(ngram=True, temperature=0.6), 0.1, 0.2),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_seeded_speculative_output_is_plain_decodings(pair, plain, name):
    target, drafter = pair
    policy = AdaptiveVerify({q: 1.0 + 0.02 * q for q in range(1, 7)})  # learning on (calibration and costs)
    engine = SpeculativeEngine(target, drafter, policy=policy)
    kw, least, least_looked = dict(CONFIGS[name][0]), *CONFIGS[name][1:]
    temperature = kw.get("temperature", 1.0)
    full = min(4, kw.get("block_size", 6))  # committed tokens of a cycle that accepted >= 3 drafts (block 3: 2)
    deep = cycles = looked = 0
    for seed in range(SEEDS):
        stats = GenerationStats(1)
        assert run(engine, options(seed, **kw), stats) == plain[seed, temperature], f"{name}: seed {seed}"
        deep += sum(n >= full for n in stats.acceptance_lengths)
        cycles += len(stats.acceptance_lengths)
        looked += sum(s > 0 for s in stats.sources)
    print(f"{name}: {deep / cycles:.0%} of {cycles} cycles committed >= {full - 1} drafts, {looked / cycles:.0%} "
          "looked up")
    assert deep / cycles >= least, f"{name}: only {deep / cycles:.1%} of cycles went deep"
    assert looked / cycles >= least_looked, f"{name}: only {looked / cycles:.1%} of cycles were looked up"


@pytest.mark.slow
def test_seeded_rows_of_a_batch_are_plain_decodings_whatever_their_neighbours(pair, plain):
    target, drafter = pair
    engine = SpeculativeEngine(target, drafter)
    mixed = [options(seed, temperature=(1.0, 0.6)[seed % 2], block_size=(6, 4, 2)[seed % 3], ngram=seed % 4 == 0,
                     verify=("fixed", "adaptive")[seed % 5 == 0]) for seed in range(SEEDS)]
    for i, tokens, _ in BatchEngine(engine, rows=8).run([PROMPT] * SEEDS, mixed):
        assert tokens == plain[i, mixed[i].sampling.temperature], f"row {i}"


def test_without_a_seed_each_request_draws_afresh(pair):
    target, drafter = pair
    engine = SpeculativeEngine(target, drafter)
    outs = {tuple(run(engine, options(None))) for _ in range(6)}
    assert len(outs) > 1

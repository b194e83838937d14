import random

import torch

from blockdraft.decoding.batch_decode import decode_many
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.modeling.fast_target import FastTarget
from tests.conftest import tiny_hf_model


def test_continuous_batching_equals_one_prompt_at_a_time():
    model = tiny_hf_model("llama", vocab=64)
    fast = FastTarget(model)
    rng = random.Random(0)
    prompts = [[rng.randrange(64) for _ in range(rng.randint(1, 12))] for _ in range(9)]
    stop = 5
    results = {i: (toks, stopped) for i, toks, stopped in
               decode_many(fast, prompts, max_new_tokens=20, rows=3, sampling=SamplingParams(), stop_token_ids=[stop])}
    assert sorted(results) == list(range(9))
    for i, p in enumerate(prompts):
        ids = torch.tensor([p])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                             eos_token_id=stop, pad_token_id=stop)[0, len(p):].tolist()
        toks, stopped = results[i]
        assert toks == ref and stopped == (ref[-1] == stop)


def test_sampled_batches_are_seeded():
    fast = FastTarget(tiny_hf_model("qwen3", head_scale=4.0))
    prompts = [[1, 2, 3], [4, 5], [6]]
    run = lambda seed: sorted(decode_many(fast, prompts, max_new_tokens=8, rows=2,  # noqa: E731
                                          sampling=SamplingParams(temperature=1.0, seed=seed), stop_token_ids=[]))
    assert run(1) == run(1) != run(2)

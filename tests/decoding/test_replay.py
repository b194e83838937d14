import pytest

from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.replay import replay_acceptance
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.target import TargetModel
from tests.conftest import slow_unless, tiny_drafter_config, tiny_hf_model
from tests.decoding.test_engine import PlantedDrafter, decode, hf_greedy, prompts


@pytest.mark.parametrize("error_rate", slow_unless([0.0, 0.3, 0.7], 0.3))
def test_replay_gives_the_engines_acceptance_lengths(error_rate):
    model = tiny_hf_model("qwen3", head_scale=6.0)
    target = TargetModel(model)
    for i, prompt in enumerate(prompts(4, seed=7)):
        ref = hf_greedy(model, prompt, 40)
        stop = (ref[25],) if i == 1 else ()  # one run ends at a stop token inside a block
        drafter = PlantedDrafter(tiny_drafter_config(target, block_size=8)).init_weights(1).double()
        engine = SpeculativeEngine(target, drafter.plant(ref, len(prompt), error_rate, seed=i))
        options = DecodeOptions(max_new_tokens=37, stop_token_ids=stop)
        out, stats = decode(engine, prompt, max_new_tokens=37, stop_token_ids=stop)
        drafter.plant(ref, len(prompt), error_rate, seed=i)  # the same planted errors again
        assert replay_acceptance(engine, prompt, out, options) == stats.acceptance_lengths
        assert max(stats.acceptance_lengths) > 1 or error_rate > 0


def test_replay_refuses_what_it_cannot_replay():
    target = TargetModel(tiny_hf_model("qwen3"))
    engine = SpeculativeEngine(target, PlantedDrafter(tiny_drafter_config(target)).init_weights(1).double())
    for options in (DecodeOptions(verify="adaptive"), DecodeOptions(sampling=SamplingParams(temperature=1.0)),
                    DecodeOptions(no_draft=True)):
        with pytest.raises(InvalidArgumentError, match="replay needs greedy speculative decoding"):
            replay_acceptance(engine, [1, 2], [3], options)
    with pytest.raises(InvalidArgumentError, match="at least one token"):
        replay_acceptance(engine, [1, 2], [], DecodeOptions())


def test_replay_drafts_from_the_same_context_as_the_engine():
    """A real drafter (not planted): every proposal, hence every feature in its context, is the engine's."""
    from tests.conftest import tiny_drafter

    target = TargetModel(tiny_hf_model("llama", head_scale=6.0))
    engine = SpeculativeEngine(target, tiny_drafter(target, std=0.5, block_size=6))
    seen, real = [], engine._proposal

    def record(*args):
        prop = real(*args)
        seen.append(prop.drafts.tolist())
        return prop

    engine._proposal = record
    for prompt in prompts(3, seed=2):
        out, _ = decode(engine, prompt, max_new_tokens=30)
        during, seen[:] = list(seen), []
        replay_acceptance(engine, prompt, out, DecodeOptions(max_new_tokens=30))
        assert seen == during and len(seen) > 3
        seen.clear()

import pytest
import torch

from blockdraft.api import Pipeline
from blockdraft.errors import InvalidArgumentError
from tests.conftest import slow_unless, tiny_drafter, tiny_drafter_config, tiny_pipeline
from tests.decoding.test_engine import PlantedDrafter


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline("qwen3", seed=2)


def test_text_matches_the_engines_tokens(pipe):
    out = pipe.generate("Once upon a time", max_new_tokens=30)
    plain = pipe.generate("Once upon a time", max_new_tokens=30, no_draft=True)
    assert out.token_ids == plain.token_ids and out.text == plain.text
    assert out.text == pipe.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert out.stats.new_tokens == len(out.token_ids) and out.finish_reason in ("length", "stop")


@pytest.mark.parametrize("seed", range(6))
def test_stream_concatenates_to_the_final_text(pipe, seed):
    stream = pipe.stream(f"prompt {seed} ✓", max_new_tokens=40, temperature=1.0, seed=seed)
    deltas = list(stream)
    assert "".join(deltas) == stream.output.text
    assert all(deltas)


def test_a_closed_stream_stops_generating(pipe):
    stream = pipe.stream("Once upon a time", max_new_tokens=200, stop_token_ids=[])
    first = next(stream)
    stream.close()
    assert first and list(stream) == [] and stream.output is None
    stream.close()  # closing twice is harmless


def test_stop_strings_cut_the_text(pipe):
    # the default (gumbel) sampler: a seeded run repeats token for token, whatever the verify lengths
    kw = dict(max_new_tokens=40, temperature=1.0, seed=4, stop_token_ids=[])
    full = pipe.generate("abc", **kw)
    stop = full.text[10:12]
    assert stop and full.text.find(stop) >= 0
    cut = pipe.generate("abc", stop=[stop], **kw)
    assert cut.text == full.text[: full.text.find(stop)] and cut.finish_reason == "stop"
    stream = pipe.stream("abc", stop=[stop], **kw)
    assert "".join(stream) == cut.text


def _committed(out) -> int:
    """Tokens the engine committed for `out`, before a stop string cut them: the first token, each verify
    cycle's, and one per plain step (the forwards that verified no draft)."""
    plain_steps = out.stats.target_forwards - 1 - len(out.stats.acceptance_lengths)
    return 1 + sum(out.stats.acceptance_lengths) + plain_steps


@pytest.mark.parametrize("temperature", slow_unless([0.0, 1.0], 0.0))
def test_stop_strings_cut_token_ids_where_plain_decoding_stops(pipe, temperature):
    """A cycle can commit tokens past a stop string; token_ids and counts must stop where plain decoding does.
    The drafter proposes plain decoding's own continuation, so cycles commit whole blocks and most stops
    fall inside one."""
    inside = 0
    for seed in range(3):
        prompt, kw = f"{seed} abab", dict(max_new_tokens=48, temperature=temperature, seed=seed, stop_token_ids=[])
        full = pipe.generate(prompt, no_draft=True, **kw)
        drafter = PlantedDrafter(tiny_drafter_config(pipe.target, block_size=6)).init_weights(1).double()
        planted = Pipeline(pipe.target, drafter.plant(full.token_ids, len(pipe.encode(prompt)), 0.0))
        for stop in {full.text[i:i + 2] for i in range(4, 40, 3) if len(full.text[i:i + 2]) == 2}:
            out = planted.generate(prompt, stop=[stop], verify="fixed", ngram=False, **kw)
            plain = planted.generate(prompt, stop=[stop], no_draft=True, **kw)
            assert out.token_ids == plain.token_ids and out.text == plain.text and out.finish_reason == "stop"
            text_of = lambda ids: pipe.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
            assert stop in text_of(out.token_ids) and stop not in text_of(out.token_ids[:-1])
            assert out.stats.new_tokens == len(out.token_ids)
            inside += _committed(out) > len(out.token_ids)
    assert inside >= 10, f"only {inside} stops fell inside a cycle's committed tokens"


def test_stop_token_ends_generation(pipe):
    full = pipe.generate("xyz", max_new_tokens=30, stop_token_ids=[])
    stop_id = full.token_ids[5]
    out = pipe.generate("xyz", max_new_tokens=30, stop_token_ids=[stop_id])
    assert out.token_ids == full.token_ids[: full.token_ids.index(stop_id) + 1] and out.finish_reason == "stop"


def test_chat_uses_the_template(pipe):
    ids = pipe.encode(chat="hi")
    assert ids[0] == pipe.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert pipe.tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ids == pipe.encode(messages=[{"role": "user", "content": "hi"}])


def test_bad_inputs(pipe):
    with pytest.raises(InvalidArgumentError, match="exactly one of prompt, chat or messages"):
        pipe.generate("a", chat="b")
    with pytest.raises(InvalidArgumentError, match="stop='ab'"):
        pipe.generate("a", stop="ab")
    with pytest.raises(InvalidArgumentError, match="message 'hi'"):
        pipe.generate(messages=["hi"])
    with pytest.raises(InvalidArgumentError, match="temperature=-0.5"):
        pipe.generate("a", temperature=-0.5)
    with pytest.raises(InvalidArgumentError, match="block_size=7"):
        pipe.stream("a", block_size=7)


def test_load_from_folders(tiny_target_dir, tmp_path):
    from blockdraft.modeling.checkpoint import save_drafter

    random_pair = Pipeline.load(str(tiny_target_dir), device="cpu")
    assert random_pair.untrained_drafter and random_pair.drafter.config.num_hidden_layers == 1
    save_drafter(tiny_drafter(random_pair.target, block_size=4).float(), tmp_path / "d")
    pair = Pipeline.load(str(tiny_target_dir), tmp_path / "d", device="cpu")
    assert not pair.untrained_drafter and pair.drafter.dtype == torch.float32
    assert pair.generate("hey", max_new_tokens=12).text == random_pair.generate("hey", max_new_tokens=12).text


def test_generate_batch_equals_generate_per_prompt(tiny_target_dir):
    pipe = Pipeline.load(str(tiny_target_dir), device="cpu")
    chats = ["hi", "tell me a story", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                       {"role": "user", "content": "c"}]]
    outs = pipe.generate_batch(chats, rows=2, max_new_tokens=[5, 12, 9], block_size=4)
    solo = [pipe.generate(chat=chats[0], max_new_tokens=5, block_size=4),
            pipe.generate(chat=chats[1], max_new_tokens=12, block_size=4),
            pipe.generate(messages=chats[2], max_new_tokens=9, block_size=4)]
    assert [o.token_ids for o in outs] == [o.token_ids for o in solo]
    assert [o.text for o in outs] == [o.text for o in solo]
    with pytest.raises(InvalidArgumentError, match="2 max_new_tokens for 3 prompts"):
        pipe.generate_batch(chats, max_new_tokens=[1, 2])

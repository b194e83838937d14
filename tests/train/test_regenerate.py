import pytest

from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.target import TargetModel
from blockdraft.prompts import Prompt
from blockdraft.train.regenerate import RegenSettings, regenerate, responses, stop_ids
from blockdraft.train.shards import read_split, shard_paths
from tests.conftest import tiny_hf_model, tiny_tokenizer


@pytest.fixture(scope="module")
def target():
    tok = tiny_tokenizer()
    model = tiny_hf_model("qwen3", vocab=len(tok), head_scale=4.0, seed=2)
    model.generation_config.eos_token_id = tok.eos_token_id
    return TargetModel(model, tok)


def prompts(n):
    return [Prompt(f"p{i}", ({"role": "user", "content": f"question number {i}?"},), "test") for i in range(n)]


def test_regenerate_writes_splits_and_resumes(target, tmp_path):
    settings = RegenSettings(target="tiny", max_new_tokens=12, batch_size=4, heldout_percent=20.0)
    first = regenerate(target, prompts(10), tmp_path, settings, shard_size=3)
    assert first["generated"] == 10 and first["already_done"] == 0
    again = regenerate(target, prompts(14), tmp_path, settings, shard_size=3)  # a killed run re-invoked
    assert again["generated"] == 4 and again["already_done"] == 10
    train, held = list(read_split(tmp_path, "train")), list(read_split(tmp_path, "heldout"))
    assert sorted(r["id"] for r in train + held) == sorted(f"p{i}" for i in range(14))
    assert 0 < len(held) < 14 and all(len(r["messages"]) == 2 for r in train)
    assert all(r["messages"][-1]["role"] == "assistant" and r["response_tokens"] <= 12 for r in train)
    assert len(shard_paths(tmp_path, "train")) == (len(train) + 2) // 3  # shards of 3, the last one partial


def test_a_resume_with_other_settings_is_refused(target, tmp_path):
    regenerate(target, prompts(2), tmp_path, RegenSettings(target="tiny", max_new_tokens=4, batch_size=2))
    with pytest.raises(InvalidArgumentError, match="max_new_tokens"):
        regenerate(target, prompts(2), tmp_path, RegenSettings(target="tiny", max_new_tokens=5, batch_size=2))
    regenerate(target, prompts(3), tmp_path, RegenSettings(target="tiny", max_new_tokens=4, batch_size=3))


def test_fast_and_hf_backends_write_the_same_responses():
    tok = tiny_tokenizer()
    model = tiny_hf_model("llama", vocab=len(tok), head_scale=4.0, seed=3)  # float64: no ties
    model.generation_config.eos_token_id = tok.eos_token_id
    target = TargetModel(model, tok)
    ids = [tok(f"prompt {i} " * (i + 1))["input_ids"] for i in range(5)]
    settings = RegenSettings(target="tiny", max_new_tokens=10, batch_size=2)
    fast = dict((i, (r, s)) for i, r, s in responses(target, ids, settings, stop_ids(target)))
    model.config.model_type = "not-fast"  # force the Hugging Face `generate` fallback
    try:
        slow = dict((i, (r, s)) for i, r, s in responses(target, ids, settings, stop_ids(target)))
    finally:
        model.config.model_type = "llama"
    assert fast == slow and len(fast) == 5


def test_an_interrupted_run_keeps_every_finished_answer(target, tmp_path, monkeypatch):
    import blockdraft.train.regenerate as regen

    real = regen.responses

    def three_then_interrupt(*args):
        for k, item in enumerate(real(*args)):
            if k == 3:
                raise KeyboardInterrupt
            yield item
    monkeypatch.setattr(regen, "responses", three_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        regenerate(target, prompts(8), tmp_path, RegenSettings(target="tiny", max_new_tokens=6, batch_size=4))
    assert len(list(read_split(tmp_path, "train")) + list(read_split(tmp_path, "heldout"))) == 3

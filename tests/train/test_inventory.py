import json

import pytest

from blockdraft.cli import main
from blockdraft.errors import InvalidArgumentError
from blockdraft.train.corpus import import_conversations
from blockdraft.train.inventory import inventory, render_inventory, turn_of
from blockdraft.train.shards import ShardWriter, read_split
from tests.conftest import tiny_tokenizer
from tests.train.test_corpus import chats


def record(rid, tokens, finish="stop"):
    return {"id": rid, "source": "sharegpt", "messages": [{"role": "user", "content": "q"},
                                                         {"role": "assistant", "content": "a"}],
            "prompt_tokens": 3, "response_tokens": tokens, "finish_reason": finish}


def test_turns_come_from_the_ids():
    assert turn_of("J410gdS_0") == 1 and turn_of("J410gdS_0@turn2") == 2 and turn_of("x@turn13") == 13
    assert turn_of("a@turnover") == 1


def test_regenerated_answers_are_counted_per_turn_and_split(tmp_path):
    folder = tmp_path / "regen"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps({"settings": {"target": "t"}}))
    ShardWriter(folder, "train", shard_size=2).add([
        record("a", 10), record("b", 7, "length"), record("a@turn2", 5), record("c", 1), record("a@turn3", 2)])
    ShardWriter(folder, "heldout").add([record("h", 4, "length")])
    rows = inventory(folder)
    got = {(r["turn"], r["split"]): (r["records"], r["answers"], r["response_tokens"], r["stopped"], r["cut"])
           for r in rows}
    assert got == {(1, "train"): (3, 3, 18, 2, 1), (2, "train"): (1, 1, 5, 1, 0), (3, "train"): (1, 1, 2, 1, 0),
                   (1, "heldout"): (1, 1, 4, 0, 1)}
    assert [(r["turn"], r["split"]) for r in rows] == [(1, "train"), (1, "heldout"), (2, "train"), (3, "train")]
    table = render_inventory(rows)
    assert "| **all** | | | train | 5 | 5 | 25 | |" in table and "| 2 / 1 |" in table


def test_imported_answers_are_counted_with_the_targets_tokenizer(tmp_path):
    import_conversations([str(chats(tmp_path / "c.jsonl", 40))], tmp_path / "imp", heldout_percent=10.0)
    answers = {split: [m["content"] for r in read_split(tmp_path / "imp", split) for m in r["messages"]
                       if m["role"] == "assistant"] for split in ("train", "heldout")}
    rows = inventory(tmp_path / "imp", tiny_tokenizer())  # a byte tokenizer: a token per UTF-8 byte
    assert [(r["kind"], r["split"], r["answers"], r["response_tokens"]) for r in rows] == [
        ("imported", split, len(answers[split]), sum(len(a.encode()) for a in answers[split]))
        for split in ("train", "heldout")]
    assert [r["response_tokens"] for r in inventory(tmp_path / "imp")] == [None, None]  # no tokenizer: unknown


def test_a_folder_that_is_not_training_data_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgumentError, match="empty: expected meta.json and train-"):
        inventory(tmp_path / "empty")


def test_cli_prints_a_table_or_json_rows(tmp_path, tiny_target_dir, capsys):
    import_conversations([str(chats(tmp_path / "c.jsonl", 12))], tmp_path / "imp", heldout_percent=0.0)
    assert main(["data", "stats", str(tmp_path / "imp"), "--target", str(tiny_target_dir)]) == 0
    out = capsys.readouterr().out
    assert "| imported | all | train | 13 | 25 |" in out
    assert main(["data", "stats", str(tmp_path / "imp"), "--no-tokens", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["answers"] == 25 and rows[0]["response_tokens"] is None
    assert main(["data", "stats", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: expected meta.json" in capsys.readouterr().err

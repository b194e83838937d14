import json

import pytest

from blockdraft.errors import InvalidArgumentError
from blockdraft.prompts import Prompt, is_held_out
from blockdraft.train.corpus import import_conversations
from blockdraft.train.shards import read_split


def chats(path, n):
    rows = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"question {i}"},
                                              {"from": "gpt", "value": f"answer {i}"},
                                              {"from": "human", "value": f"and {i}?"},
                                              {"from": "gpt", "value": f"more {i}"}]} for i in range(n)]
    rows.append(rows[0])  # a duplicate
    rows.append({"id": "c0", "conversations": [{"from": "human", "value": "other"}, {"from": "gpt", "value": "chat"}]})
    rows.append({"id": "bad", "conversations": [{"from": "human", "value": "unanswered"}]})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_import_keeps_whole_chats_and_the_regeneration_split(tmp_path):
    src = chats(tmp_path / "c.jsonl", 300)
    counts = import_conversations([str(src)], tmp_path / "out", heldout_percent=10.0, shard_size=64)
    assert counts["conversations"] == 301 and counts["assistant_turns"] == 601
    assert counts["duplicates"] == 1 and counts["unusable"] == 1
    held = {r["id"] for r in read_split(tmp_path / "out", "heldout")}
    train = [r for r in read_split(tmp_path / "out", "train")]
    assert len(held) == counts["heldout"] and 10 < len(held) < 60 and len(train) + len(held) == 301
    ids = [r["id"] for r in train] + sorted(held)
    assert len(set(ids)) == 301 and "c0#2" in ids  # another chat under a used id keeps its own
    assert sum(len(r["messages"]) == 4 for r in train) >= len(train) - 1
    # a chat is held out exactly when its first-turn prompt is held out in regeneration
    for split in ("train", "heldout"):
        for r in read_split(tmp_path / "out", split):
            first = Prompt(r["id"], tuple(r["messages"][:1]), "x")
            assert is_held_out(first, 10.0) == (split == "heldout")
    with pytest.raises(InvalidArgumentError, match="already holds training data"):
        import_conversations([str(src)], tmp_path / "out")
    assert import_conversations([str(src)], tmp_path / "few", limit=5)["conversations"] == 5

"""What a training data folder holds, per kind (`blockdraft data stats`): how many answers and response tokens
of each turn the target regenerated, or how many chats and answers an import carries.

Regenerated records count the tokens the target wrote (`response_tokens`, recorded at generation). Imported
chats were written by people, so their answers are counted with the target's tokenizer when one is given."""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from blockdraft.errors import InvalidArgumentError
from blockdraft.train.shards import SPLITS, read_split, shard_paths

_TURN = re.compile(r"@turn(\d+)$")


def folder_kind(folder: Path) -> str:
    """'regenerated' (`data regenerate`) or 'imported' (`data import`), from the folder's meta.json."""
    meta = folder / "meta.json"
    if not meta.is_file() or not any(shard_paths(folder, s) for s in SPLITS):
        raise InvalidArgumentError(f"data folder {folder}: expected meta.json and train-*.jsonl.gz shards "
                                   "(written by `blockdraft data regenerate` or `data import`)")
    settings = json.loads(meta.read_text()).get("settings", {})
    return "imported" if settings.get("kind") == "conversations" else "regenerated"


def turn_of(record_id: str) -> int:
    """1 for a first turn, k for the k-th user turn answered after the target's own earlier answers."""
    match = _TURN.search(record_id)
    return int(match.group(1)) if match else 1


def inventory(folder: str | Path, tokenizer: Any = None) -> list[dict[str, Any]]:
    """One row per (kind, turn, split) of `folder`: records, answers, response tokens (None where unknown:
    imported chats without a tokenizer) and how the regenerated answers ended (stop token or length cut)."""
    folder = Path(folder)
    kind = folder_kind(folder)
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    for split in SPLITS:
        for record in read_split(folder, split):
            turn = turn_of(record["id"]) if kind == "regenerated" else 0
            row = rows.setdefault((turn, split), {
                "folder": str(folder), "kind": kind, "turn": turn or None, "split": split, "records": 0,
                "answers": 0, "response_tokens": 0 if kind == "regenerated" or tokenizer else None,
                "stopped": 0, "cut": 0})
            row["records"] += 1
            if kind == "regenerated":
                row["answers"] += 1
                row["response_tokens"] += int(record["response_tokens"])
                row["stopped" if record.get("finish_reason") == "stop" else "cut"] += 1
            else:
                answers = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
                row["answers"] += len(answers)
                if tokenizer is not None:
                    row["response_tokens"] += sum(len(ids) for ids in
                                                  tokenizer(answers, add_special_tokens=False)["input_ids"])
    return [rows[key] for key in sorted(rows, key=lambda k: (k[0], SPLITS.index(k[1])))]


def render_inventory(rows: list[dict[str, Any]]) -> str:
    """A markdown table of `inventory` rows, with a total line per split."""
    lines = ["| folder | kind | turn | split | records | answers | response tokens | stopped / cut |",
             "|---|---|---|---|---:|---:|---:|---|"]
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in rows:
        tokens = "-" if r["response_tokens"] is None else f"{r['response_tokens']:,}"
        ended = f"{r['stopped']:,} / {r['cut']:,}" if r["kind"] == "regenerated" else "-"
        lines.append(f"| {r['folder']} | {r['kind']} | {r['turn'] or 'all'} | {r['split']} | {r['records']:,} | "
                     f"{r['answers']:,} | {tokens} | {ended} |")
        total = totals[r["split"]]
        total[0] += r["records"]
        total[1] += r["answers"]
        total[2] += r["response_tokens"] or 0
    for split, (records, answers, tokens) in totals.items():
        lines.append(f"| **all** | | | {split} | {records:,} | {answers:,} | {tokens:,} | |")
    return "\n".join(lines)

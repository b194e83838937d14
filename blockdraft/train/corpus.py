"""Existing conversations as training data: the chats as written, without regeneration.

Regenerating answers with the target is the expensive step of the recipe (one decode per token). With
`blockdraft train --labels target` the target labels every assistant position of any text with its own
greedy token, in the same forward that yields the features, and a block's deeper slots keep their labels
only where the text agreed with the target (`blockdraft.train.blocks`). So chats written by anyone, all
their turns, become training data at the cost of one forward per sequence.

`import_conversations` writes them as the same JSONL shards as regeneration. The split is decided by the
first user turn exactly as there (`is_held_out` on the first-turn prompt), so a prompt held out from the
regenerated data is held out here too and never trained on. Settings go to `meta.json`; a folder that
already holds data is refused rather than mixed.
"""
from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from tqdm import tqdm

from blockdraft.errors import InvalidArgumentError
from blockdraft.files import atomic_path
from blockdraft.prompts import Prompt, conversation, is_held_out, read_records
from blockdraft.train.shards import SPLITS, ShardWriter, shard_paths

log = logging.getLogger(__name__)


def import_conversations(sources: list[str], folder: str | Path, heldout_percent: float = 2.0,
                         limit: int | None = None, shard_size: int = 256) -> dict[str, int]:
    """Write the whole chats of `sources` (at most `limit` per source) into `folder`; returns counts."""
    folder = Path(folder)
    if any(shard_paths(folder, s) for s in SPLITS):
        raise InvalidArgumentError(f"{folder} already holds training data: expected a new --out folder")
    if not 0 <= heldout_percent < 100:
        raise InvalidArgumentError(f"heldout percent={heldout_percent}: expected a value in [0, 100)")
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / "meta.json") as tmp:
        tmp.write_text(json.dumps({"settings": {"kind": "conversations", "sources": sources,
                                                "heldout_percent": heldout_percent, "limit": limit}}, indent=2) + "\n")
    writers = {s: ShardWriter(folder, s, shard_size) for s in SPLITS}
    counts = {"conversations": 0, "assistant_turns": 0, "heldout": 0, "duplicates": 0, "unusable": 0}
    seen: set[str] = set()
    uses: Counter[str] = Counter()
    for source in sources:
        taken = 0
        buffer: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
        for n, record in enumerate(tqdm(read_records(source), desc=f"import {source}", unit="chat",
                                        dynamic_ncols=True)):
            if limit is not None and taken >= limit:
                break
            messages = conversation(record) if isinstance(record, dict) else None
            if messages is None:
                counts["unusable"] += 1
                continue
            chat = Prompt(str(record.get("id", f"{Path(source).name}-{n}")), tuple(messages), source)
            if chat.fingerprint() in seen:
                counts["duplicates"] += 1
                continue
            seen.add(chat.fingerprint())
            uses[chat.id] += 1  # different chats under one id (sources reuse ids) stay apart
            record_id = chat.id if uses[chat.id] == 1 else f"{chat.id}#{uses[chat.id]}"
            split = "heldout" if is_held_out(chat.first_turn(), heldout_percent) else "train"
            buffer[split].append({"id": record_id, "source": source, "messages": messages})
            counts["conversations"] += 1
            counts["assistant_turns"] += sum(m["role"] == "assistant" for m in messages)
            counts["heldout"] += split == "heldout"
            taken += 1
        for s in SPLITS:
            writers[s].add(buffer[s])
    log.info("imported %s into %s", counts, folder)
    return counts

"""Compressed JSONL shards, written atomically and resumable.

A split is a series of `{split}-{index:05d}.jsonl.gz` files. The open (last) shard is rewritten whole
after each batch of records, atomically, so a kill loses at most the batch in flight.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

from blockdraft.files import atomic_path

SPLITS = ("train", "heldout")  # every data folder's splits; held-out records are never trained on


def shard_paths(folder: Path, split: str) -> list[Path]:
    return sorted(Path(folder).glob(f"{split}-[0-9][0-9][0-9][0-9][0-9].jsonl.gz"))


def read_shard(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_split(folder: Path, split: str) -> Iterator[dict[str, Any]]:
    for path in shard_paths(folder, split):
        yield from read_shard(path)


class ShardWriter:
    """Appends records to a split, `shard_size` records a file, continuing an existing series."""

    def __init__(self, folder: Path, split: str, shard_size: int = 256) -> None:
        self.folder, self.split, self.shard_size = Path(folder), split, shard_size
        existing = shard_paths(self.folder, split)
        self.index = len(existing) - 1 if existing else 0
        self.current: list[dict[str, Any]] = read_shard(existing[-1]) if existing else []
        if len(self.current) >= shard_size:
            self.index, self.current = self.index + 1, []

    def add(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            self.current.append(record)
            if len(self.current) >= self.shard_size:
                self._write()
                self.index, self.current = self.index + 1, []
        if self.current:
            self._write()

    def _write(self) -> None:
        path = self.folder / f"{self.split}-{self.index:05d}.jsonl.gz"
        with atomic_path(path) as tmp:
            with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as f:
                for record in self.current:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")

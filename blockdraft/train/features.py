"""Target features for training: computed online per batch, cached to disk (all at once before training, or
lazily, as steps first need them), or held in (GPU) memory.

The cache is fp16 safetensors shards (one tensor per sequence, keyed by its id) plus `index.json`; it is
built resumably (shards written atomically, the index after each shard) and checked against the layer ids.
"""
from __future__ import annotations

import fcntl
import json
import logging
import re
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from blockdraft.errors import InvalidArgumentError
from blockdraft.files import atomic_path
from blockdraft.modeling.target import TargetModel
from blockdraft.train.data import Sequence
from blockdraft.train.distill import TeacherTopK, teacher_topk

log = logging.getLogger(__name__)


class FeatureSource(Protocol):
    def __call__(self, seq: Sequence) -> torch.Tensor:
        """(T, K*D) features of the selected target layers for every token of `seq`."""


class OnlineFeatures:
    """Runs the (frozen) target on each sequence when it is needed.

    With `teacher_k` > 0 the same forward also keeps the target's top-k next-token distribution of the
    sequence, which `teacher(seq)` hands out once (distillation, see `blockdraft.train.distill`); with
    `greedy`, its greedy next token at every position, which `greedy_tokens(seq)` hands out once (target
    labels, see `blockdraft.train.blocks`).
    """

    def __init__(self, target: TargetModel, teacher_k: int = 0, greedy: bool = False) -> None:
        if teacher_k < 0:
            raise InvalidArgumentError(f"teacher top-k={teacher_k}: expected >= 0")
        self.target, self.teacher_k, self.greedy = target, teacher_k, greedy
        self._teachers: dict[str, TeacherTopK] = {}
        self._greedy: dict[str, torch.Tensor] = {}

    def __call__(self, seq: Sequence) -> torch.Tensor:
        ids = seq.input_ids[None].to(self.target.device)
        logits, feats = self.target.forward(ids, self.target.new_cache(), 0, features=True,
                                            last_only=not (self.teacher_k or self.greedy))
        if self.teacher_k:
            self._teachers[seq.id] = teacher_topk(logits[0], self.teacher_k)
        if self.greedy:
            self._greedy[seq.id] = logits[0].argmax(-1).cpu()
        return feats[0].clone()  # outside inference mode: a normal tensor autograd may use

    def greedy_tokens(self, seq: Sequence) -> torch.Tensor:
        """(T,) the target's greedy next token after each position of `seq` (call after its features)."""
        return _handed_out(self._greedy, seq, "greedy tokens", "greedy=True")

    def teacher(self, seq: Sequence) -> TeacherTopK:
        """The top-k distribution computed with `seq`'s features (call after them; handed out once)."""
        return _handed_out(self._teachers, seq, "teacher distribution", "teacher_k > 0")


def _handed_out(store: dict[str, Any], seq: Sequence, what: str, option: str) -> Any:
    if seq.id not in store:
        raise InvalidArgumentError(f"no {what} for {seq.id!r}: expected OnlineFeatures({option}) to have "
                                   "computed its features first")
    return store.pop(seq.id)


class MemoryFeatures:
    """Every sequence's features computed once, in length-sorted padded batches, and kept in memory.

    For accelerators with room to spare (an H200 holds ~10K sequences' features in bf16): training then never
    waits for the target. Right padding is exact here: attention is causal, so no real token sees a pad.
    With `greedy`, the target's greedy next tokens are kept too (`greedy_tokens`; unlike `OnlineFeatures`,
    kept for every epoch rather than handed out once); the batches are then 8x smaller, as they hold every
    position's logits.
    """

    def __init__(self, target: TargetModel, sequences: list[Sequence], dtype: torch.dtype,
                 tokens_per_batch: int = 65536, greedy: bool = False) -> None:
        self.store: dict[str, torch.Tensor] = {}
        self.greedy, self._greedy = greedy, {}
        tokens_per_batch = tokens_per_batch // 8 if greedy else tokens_per_batch
        order = sorted(sequences, key=lambda s: s.input_ids.numel(), reverse=True)
        size = feature_bytes(sum(s.input_ids.numel() for s in order), target.feature_layer_ids,
                             target.hidden_size, dtype)
        log.warning("features in memory on %s: %d sequences, %.2f GB (%s)", target.device, len(order), size / 1e9,
                    str(dtype).removeprefix("torch."))
        bar = tqdm(total=len(order), desc="features", unit="seq", dynamic_ncols=True)
        first = 0
        while first < len(order):
            longest = order[first].input_ids.numel()
            chunk = order[first:first + max(1, tokens_per_batch // longest)]
            self._compute(target, chunk, longest, dtype)
            first += len(chunk)
            bar.update(len(chunk))
        bar.close()

    def _compute(self, target: TargetModel, chunk: list[Sequence], longest: int, dtype: torch.dtype) -> None:
        ids = torch.zeros(len(chunk), longest, dtype=torch.long)
        for row, seq in enumerate(chunk):
            ids[row, : seq.input_ids.numel()] = seq.input_ids
        cache = target.new_cache(rows=len(chunk), capacity=longest)
        logits, feats = target.forward(ids.to(target.device), cache, 0, features=True,
                                       last_only=not self.greedy)  # feats (b, T, K*D)
        for row, seq in enumerate(chunk):
            self.store[seq.id] = feats[row, : seq.input_ids.numel()].to(dtype).clone()
            if self.greedy:
                self._greedy[seq.id] = logits[row, : seq.input_ids.numel()].argmax(-1).cpu()

    def __call__(self, seq: Sequence) -> torch.Tensor:
        feats = self.store.get(seq.id)
        if feats is None:
            raise InvalidArgumentError(f"sequence {seq.id!r} has no features in memory")
        return feats

    def greedy_tokens(self, seq: Sequence) -> torch.Tensor:
        if seq.id not in self._greedy:
            raise InvalidArgumentError(f"no greedy tokens for {seq.id!r}: expected MemoryFeatures(greedy=True)")
        return self._greedy[seq.id]


def feature_bytes(num_tokens: int, layer_ids: list[int], hidden: int, dtype: torch.dtype = torch.float16) -> int:
    return num_tokens * len(layer_ids) * hidden * torch.empty(0, dtype=dtype).element_size()


class CachedFeatures:
    """Features read back from a cache folder built by `build_feature_cache`.

    The cache may hold more layers than the drafter uses (one cache serves drafters with different
    target layer ids); the requested layers are sliced out in the requested order.
    """

    def __init__(self, folder: str | Path, layer_ids: list[int], dtype: torch.dtype = torch.float32) -> None:
        self.folder = Path(folder)
        index = json.loads((self.folder / "index.json").read_text())
        cached = index["layer_ids"]
        _check_layers(folder, cached, layer_ids)
        self.slots = [cached.index(i) for i in layer_ids]
        self.whole = self.slots == list(range(len(cached)))
        self.num_cached = len(cached)
        self.entries: dict[str, str] = index["entries"]
        self.dtype = dtype
        self._handles: dict[str, object] = {}

    def __call__(self, seq: Sequence) -> torch.Tensor:
        shard = self.entries.get(seq.id)
        if shard is None:
            raise InvalidArgumentError(f"sequence {seq.id!r} is not in the feature cache {self.folder}")
        if shard not in self._handles:
            self._handles[shard] = safe_open(str(self.folder / shard), framework="pt")
        return self._select(seq, self._handles[shard].get_tensor(seq.id))

    def _select(self, seq: Sequence, feats: torch.Tensor) -> torch.Tensor:
        """(T, K_cached*D) fp16 as stored -> (T, K*D) of the requested layers in `self.dtype`."""
        if feats.shape[0] != seq.input_ids.numel():
            raise InvalidArgumentError(f"cached features of {seq.id!r} have {feats.shape[0]} tokens, "
                                       f"the sequence has {seq.input_ids.numel()}: rebuild the cache")
        if not self.whole:
            feats = feats.view(feats.shape[0], self.num_cached, -1)[:, self.slots].flatten(1)
        return feats.to(self.dtype)


class LazyCachedFeatures(CachedFeatures):
    """A feature cache filled as training goes (`--features lazy`).

    A sequence missing from the cache is run through the target the first time a step needs it, rounded to
    fp16 as stored, and written with the next `shard_size` such sequences; later epochs, and later runs on the
    same machine, read it back. Training on a fresh machine thus starts at once, paying what online features
    cost for each sequence's first use only. A step sees the same values whether or not the cache held its
    sequences, so a resumed run goes on bitwise. `flush()` writes what is pending; sequences computed but not
    yet written when a process is killed are computed again by the next run.
    """

    def __init__(self, target: TargetModel, folder: str | Path, layer_ids: list[int],
                 cache_layer_ids: list[int] | None = None, shard_size: int = 64,
                 dtype: torch.dtype = torch.float32) -> None:
        """`cache_layer_ids`: the layers a new cache stores (default `layer_ids`); an existing cache keeps its own."""
        cache_layers = cached_layer_ids(folder) or cache_layer_ids or layer_ids
        _check_layers(folder, cache_layers, layer_ids)  # before anything is written
        self.writer = _CacheWriter(Path(folder), cache_layers)
        super().__init__(folder, layer_ids, dtype)
        self.entries = self.writer.entries  # one dict: a written shard is readable at once
        self.target, self.online, self.shard_size = target, OnlineFeatures(target), shard_size
        self.pending: dict[str, torch.Tensor] = {}

    def __call__(self, seq: Sequence) -> torch.Tensor:
        if seq.id in self.entries:
            return super().__call__(seq)
        if seq.id not in self.pending:
            self.pending[seq.id] = self._compute(seq)
        feats = self._select(seq, self.pending[seq.id])
        if len(self.pending) >= self.shard_size:
            self.flush()
        return feats

    def flush(self) -> None:
        """Write the pending sequences' features as one shard (atomic; nothing to do when none are pending)."""
        if self.pending:
            self.writer.write(self.pending)
            self.pending = {}

    def close(self) -> None:
        """Flush, and let another process write to the cache."""
        try:
            self.flush()
        finally:
            self.writer.close()

    def _compute(self, seq: Sequence) -> torch.Tensor:
        """(T, K_cached*D) fp16: the cache's layers, whichever layers the target captures for the drafter."""
        drafter_layers = self.target.feature_layer_ids
        if drafter_layers != self.writer.layer_ids:
            self.target.set_feature_layers(self.writer.layer_ids)
        try:
            return self.online(seq).to("cpu", torch.float16).contiguous()
        finally:
            if drafter_layers != self.writer.layer_ids:
                self.target.set_feature_layers(drafter_layers)


class _CacheWriter:
    """A cache folder's index and its next shard: each shard is written atomically, then the index. One
    process writes to a folder at a time: it holds an exclusive lock on `.lock` there until `close()` or its
    exit, and a second writer is refused (two would number their shards alike and overwrite each other's index)."""

    def __init__(self, folder: Path, layer_ids: list[int]) -> None:
        self.folder, self.index_path = folder, folder / "index.json"
        folder.mkdir(parents=True, exist_ok=True)
        self._lock = open(folder / ".lock", "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise InvalidArgumentError(f"feature cache {folder} is being written by another process (it holds "
                                       f"{folder / '.lock'}): wait for it, or give this run another folder") from None
        self.index = json.loads(self.index_path.read_text()) if self.index_path.is_file() else \
            {"layer_ids": list(layer_ids), "dtype": "float16", "entries": {}}
        if self.index["layer_ids"] != list(layer_ids):
            raise InvalidArgumentError(f"feature cache {folder} holds layers {self.index['layer_ids']}, "
                                       f"expected {list(layer_ids)}")
        self.layer_ids: list[int] = self.index["layer_ids"]
        self.entries: dict[str, str] = self.index["entries"]
        # past every shard there, indexed or not (one a killed process wrote but never indexed stays unread)
        numbers = [int(m.group(1)) for f in folder.iterdir() if (m := SHARD_NAME.fullmatch(f.name))]
        self.shard_no = 1 + max(numbers, default=-1)
        if not self.index_path.is_file():
            self._write_index()

    def write(self, tensors: dict[str, torch.Tensor]) -> None:
        name = f"feats-{self.shard_no:05d}.safetensors"
        self.shard_no += 1  # even if what follows fails, the next shard gets a name of its own
        with atomic_path(self.folder / name) as tmp:
            save_file(tensors, str(tmp))
        self.entries.update({key: name for key in tensors})
        self._write_index()

    def close(self) -> None:
        self._lock.close()  # releases the lock

    def _write_index(self) -> None:
        with atomic_path(self.index_path) as tmp:
            tmp.write_text(json.dumps(self.index))


SHARD_NAME = re.compile(r"feats-(\d+)\.safetensors")


def _check_layers(folder: str | Path, cached: list[int], layer_ids: list[int]) -> None:
    missing = [i for i in layer_ids if i not in cached]
    if missing:
        raise InvalidArgumentError(f"feature cache {folder} holds layers {cached}, not {missing}: "
                                   "rebuild it with those layers or use another folder")


def cached_layer_ids(folder: str | Path) -> list[int] | None:
    """The layers a cache folder holds, or None when there is no cache there yet."""
    index = Path(folder) / "index.json"
    return json.loads(index.read_text())["layer_ids"] if index.is_file() else None


def build_feature_cache(target: TargetModel, sequences: list[Sequence], folder: str | Path,
                        shard_size: int = 128) -> Path:
    """Compute and store fp16 features for every sequence not cached yet (resumable)."""
    folder = Path(folder)
    writer = _CacheWriter(folder, target.feature_layer_ids)
    todo = [s for s in sequences if s.id not in writer.entries]
    total = sum(s.input_ids.numel() for s in sequences)
    size = feature_bytes(total, target.feature_layer_ids, target.hidden_size)
    log.warning("feature cache %s: %d sequences, %d tokens, %.2f GB on disk (%d to compute)",
                folder, len(sequences), total, size / 1e9, len(todo))
    online = OnlineFeatures(target)
    try:
        for first in tqdm(range(0, len(todo), shard_size), desc="features", unit="shard", dynamic_ncols=True):
            writer.write({s.id: online(s).to("cpu", torch.float16).contiguous()
                          for s in todo[first:first + shard_size]})
    finally:
        writer.close()
    return folder

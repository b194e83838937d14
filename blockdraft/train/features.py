"""Target features for training: computed online per batch, cached once to disk, or held in (GPU) memory.

The cache is fp16 safetensors shards (one tensor per sequence, keyed by its id) plus `index.json`; it is
built resumably (shards written atomically, the index after each shard) and checked against the layer ids.
"""
from __future__ import annotations

import json
import logging
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
        missing = [i for i in layer_ids if i not in cached]
        if missing:
            raise InvalidArgumentError(f"feature cache {folder} holds layers {cached}, not {missing}: "
                                       "rebuild it with those layers or use another folder")
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
        feats = self._handles[shard].get_tensor(seq.id)
        if feats.shape[0] != seq.input_ids.numel():
            raise InvalidArgumentError(f"cached features of {seq.id!r} have {feats.shape[0]} tokens, "
                                       f"the sequence has {seq.input_ids.numel()}: rebuild the cache")
        if not self.whole:  # (T, K_cached*D) -> (T, K*D)
            feats = feats.view(feats.shape[0], self.num_cached, -1)[:, self.slots].flatten(1)
        return feats.to(self.dtype)


def cached_layer_ids(folder: str | Path) -> list[int] | None:
    """The layers a cache folder holds, or None when there is no cache there yet."""
    index = Path(folder) / "index.json"
    return json.loads(index.read_text())["layer_ids"] if index.is_file() else None


def build_feature_cache(target: TargetModel, sequences: list[Sequence], folder: str | Path,
                        shard_size: int = 128) -> Path:
    """Compute and store fp16 features for every sequence not cached yet (resumable)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index_path = folder / "index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else \
        {"layer_ids": target.feature_layer_ids, "dtype": "float16", "entries": {}}
    if index["layer_ids"] != target.feature_layer_ids:
        raise InvalidArgumentError(f"feature cache {folder} holds layers {index['layer_ids']}, "
                                   f"expected {target.feature_layer_ids}")
    todo = [s for s in sequences if s.id not in index["entries"]]
    total = sum(s.input_ids.numel() for s in sequences)
    size = feature_bytes(total, target.feature_layer_ids, target.hidden_size)
    log.warning("feature cache %s: %d sequences, %d tokens, %.2f GB on disk (%d to compute)",
                folder, len(sequences), total, size / 1e9, len(todo))
    online = OnlineFeatures(target)
    shard_no = len({v for v in index["entries"].values()})
    for first in tqdm(range(0, len(todo), shard_size), desc="features", unit="shard", dynamic_ncols=True):
        chunk = todo[first:first + shard_size]
        tensors = {s.id: online(s).to("cpu", torch.float16).contiguous() for s in chunk}
        name = f"feats-{shard_no:05d}.safetensors"
        with atomic_path(folder / name) as tmp:
            save_file(tensors, str(tmp))
        index["entries"].update({s.id: name for s in chunk})
        with atomic_path(index_path) as tmp:
            tmp.write_text(json.dumps(index))
        shard_no += 1
    return folder

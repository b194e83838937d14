"""A drafter's own output vocabulary: the tokens it may propose, a subset of the target's.

The drafter scores its slots with the target's LM head, and on a CPU that head is most of a drafter call's
weight traffic (SmolLM2: 49,152 x 576 fp32 = 113 MB against 35 MB for two draft layers). Drafts only need
to be right often, so a drafter folder may carry `draft_vocab.json`: the K tokens the target writes most
often in its own answers. The engine then scores only those K rows (one contiguous copy of them, made once).

Output stays exactly the target's: verification never depends on which tokens a drafter can propose. At
T = 0 a draft outside the set simply cannot occur; at T > 0 the draft distribution q is 0 outside the set,
and the rejection rule (accept with min(1, p/q), resample from max(0, p - q)) is exact for any q. What the
set costs is acceptance: a slot whose right token is not in it is rejected.

JSON, not safetensors, so that vLLM / SGLang, which load every `*.safetensors` in a folder as weights, see
the folder as a plain published drafter.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import torch
from torch import nn

from blockdraft.errors import CheckpointError, IncompatibleModelsError, InvalidArgumentError
from blockdraft.files import atomic_path
from blockdraft.modeling.packing import PackedLinear

FILE = "draft_vocab.json"


def frequent_tokens(token_lists: Iterable[torch.Tensor], k: int) -> tuple[torch.Tensor, float]:
    """The k most frequent ids over `token_lists` (ties: lower id first), sorted, and the share of all
    tokens they cover."""
    if k < 1:
        raise InvalidArgumentError(f"draft vocabulary size {k}: expected >= 1")
    counts: dict[int, int] = {}
    for tokens in token_lists:
        ids, n = torch.unique(tokens, return_counts=True)
        for i, c in zip(ids.tolist(), n.tolist()):
            counts[i] = counts.get(i, 0) + c
    ranked = sorted(counts, key=lambda i: (-counts[i], i))[:k]
    total = sum(counts.values())
    coverage = sum(counts[i] for i in ranked) / total if total else 0.0
    return torch.tensor(sorted(ranked), dtype=torch.long), coverage


def save_draft_vocab(folder: str | Path, ids: torch.Tensor) -> Path:
    path = Path(folder) / FILE
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({"size": int(ids.numel()), "ids": ids.tolist()}) + "\n")
    return path


def read_draft_vocab(folder: str | Path) -> torch.Tensor | None:
    """The draft vocabulary of a drafter folder (sorted unique ids), or None when it has none."""
    path = Path(folder) / FILE
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())["ids"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: unreadable draft vocabulary ({e})") from e
    if not ids or not all(isinstance(i, int) and i >= 0 for i in ids) or len(set(ids)) != len(ids):
        raise CheckpointError(f"{path}: expected a non-empty list of distinct token ids >= 0")
    return torch.tensor(sorted(ids), dtype=torch.long)


def draft_head(lm_head: nn.Module, ids: torch.Tensor, vocab_size: int) -> nn.Module:
    """The rows `ids` of the target's LM head as their own linear layer, prepacked when the head is (so
    `--no-pack` and `--compile` runs stay dense)."""
    if int(ids.max()) >= vocab_size:
        raise IncompatibleModelsError(f"draft vocabulary holds token id {int(ids.max())}, outside the target's "
                                      f"vocabulary [0, {vocab_size}): not a pair")
    weight = lm_head.weight.detach()
    rows = ids.to(weight.device)
    bias = getattr(lm_head, "bias", None)
    head = nn.Linear(weight.shape[1], rows.numel(), bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(weight[rows])
        if bias is not None:
            head.bias.copy_(bias.detach()[rows])
    head.requires_grad_(False)
    return PackedLinear(head) if isinstance(lm_head, PackedLinear) else head

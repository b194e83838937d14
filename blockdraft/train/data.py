"""Training sequences: regenerated chats tokenised with the chat template, loss on assistant tokens only."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from blockdraft.train.shards import read_split

log = logging.getLogger(__name__)


@dataclass
class Sequence:
    id: str
    input_ids: torch.Tensor  # (T,) long
    loss_mask: torch.Tensor  # (T,) bool: assistant tokens (content and end-of-turn)


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool, kwargs: dict) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True,
                                              return_dict=True, **kwargs)["input_ids"])


def tokenize_chat(tokenizer: Any, messages: list[dict[str, str]], max_len: int,
                  chat_template_kwargs: dict[str, Any] | None = None) -> tuple[list[int], list[bool]]:
    """Token ids of a whole chat and a mask that is True on assistant-written tokens.

    Each assistant turn spans from the end of the prefix rendered with a generation prompt to the end of
    the prefix that includes the turn, so template tokens (role headers, system prompt) stay unsupervised
    while the turn's end-of-turn token is supervised.
    """
    kwargs = chat_template_kwargs or {}
    ids = _render(tokenizer, messages, False, kwargs)
    mask = [False] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = _render(tokenizer, messages[:i], True, kwargs)
        turn = _render(tokenizer, messages[: i + 1], False, kwargs)
        if ids[: len(head)] != head or ids[: len(turn)] != turn:
            # The template renders earlier turns differently (e.g. drops their reasoning): leave this turn
            # unsupervised rather than supervise the wrong tokens.
            log.debug("assistant turn %d does not render as a prefix of the chat: not supervised", i)
            continue
        for j in range(len(head), len(turn)):
            mask[j] = True
    return ids[:max_len], mask[:max_len]


def load_sequences(folder: str | Path, split: str, tokenizer: Any, max_len: int,
                   chat_template_kwargs: dict[str, Any] | None = None, limit: int | None = None) -> list[Sequence]:
    """Tokenised sequences of a regenerated split, skipping ones with nothing to learn."""
    out: list[Sequence] = []
    for record in read_split(Path(folder), split):
        ids, mask = tokenize_chat(tokenizer, record["messages"], max_len, chat_template_kwargs)
        if sum(mask) < 2:
            continue
        out.append(Sequence(record["id"], torch.tensor(ids), torch.tensor(mask)))
        if limit is not None and len(out) >= limit:
            break
    log.info("%s/%s: %d sequences, %d tokens (%d supervised)", folder, split, len(out),
             sum(s.input_ids.numel() for s in out), sum(int(s.loss_mask.sum()) for s in out))
    return out

"""Benchmark prompt sets, formatted as the paper's harness formats them.

Shipped inside the package (`blockdraft/prompt_sets`, no wheel needed): `mt-bench` (80 questions, turn 2 as a
follow-up), `humaneval` (164, code-fence wording), `sharegpt-heldout` (the 2% content-hash split of the
ShareGPT chats that training never sees).
Online or from a local JSONL: `gsm8k`, `math500` (math wording), `mbpp` (code wording), and any JSONL of
prompts or chats. Selection is deterministic: a seeded sample of `max_samples` in source order.
"""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from blockdraft.errors import InvalidArgumentError
from blockdraft.prompts import HUMANEVAL_TEMPLATE, Prompt, load_prompts, shipped_prompts

MATH_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
_HUB = {"gsm8k": ("hf:openai/gsm8k:test", "math"), "math500": ("hf:HuggingFaceH4/MATH-500:test", "math"),
        "mbpp": ("hf:google-research-datasets/mbpp:test", "code")}


def _reword(prompt: Prompt, kind: str) -> Prompt:
    text = prompt.text
    if kind == "math":
        text = f"{text}\n{MATH_SUFFIX}"
    elif kind == "code":
        text = HUMANEVAL_TEMPLATE.format(text.strip())
    messages = prompt.messages[:-1] + ({"role": "user", "content": text},)
    return replace(prompt, messages=messages, category=prompt.category or kind)


def bench_prompts(name: str, max_samples: int | None = None, seed: int = 0, local: str | None = None) -> list[Prompt]:
    """Prompts of a benchmark by name (or a JSONL path), deterministically sub-sampled."""
    if name in ("mt-bench", "humaneval"):
        prompts = load_prompts(name)
    elif name == "sharegpt-heldout":
        prompts = shipped_prompts(name)
    elif name in _HUB:
        source, kind = _HUB[name]
        prompts = [_reword(p, kind) for p in load_prompts(local or source)]
    elif Path(name).expanduser().is_file():
        prompts = load_prompts(name)
    else:
        raise InvalidArgumentError(f"dataset {name!r}: expected mt-bench, humaneval, sharegpt-heldout, "
                                   f"{', '.join(_HUB)} or a JSONL file")
    if max_samples is not None and max_samples < len(prompts):
        keep = sorted(random.Random(seed).sample(range(len(prompts)), max_samples))
        prompts = [prompts[i] for i in keep]
    return prompts


def dataset_label(dataset: str) -> str:
    """The name a dataset is reported under: a JSONL path's file name without extensions."""
    return Path(dataset).name.split(".")[0] if Path(dataset).expanduser().is_file() else dataset

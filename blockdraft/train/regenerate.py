"""Regeneration: the target writes the responses, so the drafter learns the target's own distribution.

Batched generation through the target's chat template (thinking flag passed through), written as JSONL
shards with a deterministic held-out split. A killed run resumes where it stopped; settings are recorded
in `meta.json` and a resume with different settings is refused.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from tqdm import tqdm

from blockdraft.decoding.batch_decode import decode_many
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.errors import InvalidArgumentError
from blockdraft.files import atomic_path
from blockdraft.modeling.fast_target import FastTarget, supports_fast_path
from blockdraft.modeling.target import TargetModel
from blockdraft.prompts import Prompt, conversation, is_held_out, read_records
from blockdraft.train.shards import SPLITS, ShardWriter, read_split

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class RegenSettings:
    target: str
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    max_prompt_tokens: int = 768
    batch_size: int = 32  # rows decoded together
    seed: int = 0
    heldout_percent: float = 2.0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


def _check_meta(folder: Path, settings: RegenSettings) -> None:
    meta = folder / "meta.json"
    wanted = {k: v for k, v in asdict(settings).items() if k != "batch_size"}  # batching changes no output
    if meta.is_file():
        found = json.loads(meta.read_text())["settings"]
        if found != wanted:
            diff = {k: (found.get(k), v) for k, v in wanted.items() if found.get(k) != v}
            raise InvalidArgumentError(f"{folder} was generated with other settings {diff} (found, asked): "
                                       "use another --out folder or the same settings")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(meta) as tmp:
            tmp.write_text(json.dumps({"settings": wanted}, indent=2) + "\n")


def done_fingerprints(folder: Path) -> set[str]:
    """Content hashes of the prompts already answered (ids may repeat across sources; content may not)."""
    return {Prompt(r["id"], tuple(r["messages"][:-1]), r["source"]).fingerprint()
            for split in SPLITS for r in read_split(folder, split)}


def followup_prompts(folder: str | Path, sources: list[str]) -> list[Prompt]:
    """Multi-turn regeneration: for each training answer in `folder` that ended on a stop token, the chat's next
    user turn (from the same chat in `sources`), asked after the target's own answers so far. The target then
    writes every context it is trained on; a folder of such answers gives the turn after (chains of turns).

    Held-out chats never come back: only the train split is continued, and `regenerate` splits a follow-up by
    its first user turn."""
    chats: dict[str, list[dict[str, str]]] = {}  # first-turn fingerprint -> the whole chat as written
    for source in sources:
        for record in read_records(source):
            messages = conversation(record) if isinstance(record, dict) else None
            if messages is not None:
                chats.setdefault(Prompt("", tuple(messages), source).first_turn().fingerprint(), messages)
    out = []
    for r in read_split(Path(folder), "train"):
        if r.get("finish_reason") != "stop":
            continue
        context = tuple(r["messages"])  # ... user, the target's answer
        chat = chats.get(Prompt(r["id"], context, r["source"]).first_turn().fingerprint())
        if chat is None or len(chat) <= len(context) or chat[len(context)]["role"] != "user":
            continue
        turn = sum(m["role"] == "user" for m in context) + 1
        out.append(Prompt(f"{r['id'].split('@')[0]}@turn{turn}", context + (chat[len(context)],), r["source"]))
    log.info("%d follow-up turns after the answers in %s", len(out), folder)
    return out


def encode_prompt(tokenizer: Any, prompt: Prompt, chat_kwargs: dict[str, Any]) -> list[int]:
    return list(tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=True,
                                              return_dict=True, **chat_kwargs)["input_ids"])


@torch.inference_mode()
def _hf_batches(target: TargetModel, prompts: list[list[int]], settings: RegenSettings,
                stops: set[int]) -> Iterator[tuple[int, list[int], bool]]:
    """Fallback for families without a fast path: left-padded `generate`, batch by batch."""
    tok, model = target.tokenizer, target.model
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    sample = settings.temperature > 0
    for first in range(0, len(prompts), settings.batch_size):
        batch = prompts[first:first + settings.batch_size]
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=target.device)
        mask = (torch.arange(width)[None] >= torch.tensor([width - len(ids) for ids in batch])[:, None]).long()
        torch.manual_seed(settings.seed + first)
        out = model.generate(input_ids=input_ids, attention_mask=mask.to(target.device),
                             max_new_tokens=settings.max_new_tokens, do_sample=sample,
                             temperature=settings.temperature if sample else None,
                             top_p=settings.top_p if sample else None, top_k=None, pad_token_id=pad)
        for k, row in enumerate(out[:, width:].tolist()):
            end = next((i for i, t in enumerate(row) if t in stops), None)
            yield first + k, (row[: end + 1] if end is not None else row), end is not None


def responses(target: TargetModel, prompts: list[list[int]], settings: RegenSettings,
              stops: set[int]) -> Iterator[tuple[int, list[int], bool]]:
    """(prompt index, response ids, stopped) for every prompt, in completion order."""
    if not supports_fast_path(target.model):
        return _hf_batches(target, prompts, settings, stops)
    fast = target if isinstance(target, FastTarget) else FastTarget(target.model, target.tokenizer)
    return decode_many(fast, prompts, max_new_tokens=settings.max_new_tokens, rows=settings.batch_size,
                       sampling=SamplingParams(settings.temperature, 0, settings.top_p, settings.seed),
                       stop_token_ids=sorted(stops))


def stop_ids(target: TargetModel) -> set[int]:
    ids = target.model.generation_config.eos_token_id
    ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
    return set(ids) | ({target.tokenizer.eos_token_id} if target.tokenizer.eos_token_id is not None else set())


def regenerate(target: TargetModel, prompts: list[Prompt], folder: str | Path, settings: RegenSettings,
               shard_size: int = 256) -> dict[str, int]:
    """Generate the target's responses for `prompts` into `folder`; returns counts of this run."""
    folder = Path(folder)
    _check_meta(folder, settings)
    done = done_fingerprints(folder)
    tok = target.tokenizer
    todo: list[tuple[Prompt, list[int]]] = []
    skipped = 0
    for p in prompts:
        if p.fingerprint() in done:
            continue
        done.add(p.fingerprint())  # also drops duplicates across sources
        ids = encode_prompt(tok, p, settings.chat_template_kwargs)
        if len(ids) > settings.max_prompt_tokens:
            skipped += 1
            continue
        todo.append((p, ids))
    already = len(done) - len(todo) - skipped
    log.info("%d prompts already done, %d to generate, %d skipped (prompt > %d tokens)",
             already, len(todo), skipped, settings.max_prompt_tokens)
    writers = {s: ShardWriter(folder, s, shard_size) for s in SPLITS}
    counts = {"generated": 0, "tokens": 0, "skipped_long_prompt": skipped, "already_done": already}
    buffer: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    bar = tqdm(total=len(todo), desc="regenerate", unit="prompt", dynamic_ncols=True)
    t0 = time.perf_counter()

    def flush() -> None:
        for s in SPLITS:
            if buffer[s]:
                writers[s].add(buffer[s])
                buffer[s] = []

    try:
        for n, (i, resp, stopped) in enumerate(responses(target, [ids for _, ids in todo], settings,
                                                         stop_ids(target)), 1):
            p, ids = todo[i]
            split = "heldout" if is_held_out(p.first_turn(), settings.heldout_percent) else "train"
            text = tok.decode(resp, skip_special_tokens=True)
            buffer[split].append({"id": p.id, "source": p.source,
                                  "messages": list(p.messages) + [{"role": "assistant", "content": text}],
                                  "prompt_tokens": len(ids), "response_tokens": len(resp),
                                  "finish_reason": "stop" if stopped else "length"})
            counts["generated"] += 1
            counts["tokens"] += len(resp)
            if n % settings.batch_size == 0:
                flush()
            bar.update(1)
            bar.set_postfix(tok_s=f"{counts['tokens'] / (time.perf_counter() - t0):.0f}")
    finally:  # on Ctrl-C or SIGTERM (the CLI raises KeyboardInterrupt for both) keep every finished answer
        flush()
    bar.close()
    return counts

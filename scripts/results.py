"""The README's one results table, composed from the runs of `scripts/results.sh` (`make results`).

    .venv/bin/python scripts/results.py docs/figures/results --readme README.md

reads DIR/{t0,t07,batch8,acceptance}/bench.json, writes DIR/README.md, and replaces the README's table
between its `<!-- results:start -->` and `<!-- results:end -->` markers.
"""
from __future__ import annotations

import argparse
import json
import re
from datetime import date
from pathlib import Path
from typing import Any

from blockdraft.bench.provenance import commit_label, machine
from blockdraft.errors import InvalidArgumentError
from blockdraft.files import atomic_path

START, END = "<!-- results:start -->", "<!-- results:end -->"
DEFAULT, DRAFTER_ONLY = "dflash-b16-adaptive-ngram", "dflash-b16-adaptive"  # generate's default; --no-ngram
TREE, DRAFTER_ONLY_TREE = "dflash-b16-adaptive-treeauto-ngram", "dflash-b16-adaptive-treeauto"  # --tree auto
DRAFTING = (("**default** (drafter + looked-up drafts, adaptive verify)", DEFAULT),
            ("default + draft trees (`--tree auto`)", TREE),
            ("drafter only (`--no-ngram`)", DRAFTER_ONLY),
            ("drafter only + draft trees (`--no-ngram --tree auto`)", DRAFTER_ONLY_TREE))


def load_runs(folder: Path) -> dict[str, dict[str, Any]]:
    runs = {}
    for name in ("t0", "t07", "batch8", "acceptance"):
        path = folder / name / "bench.json"
        if not path.is_file():
            raise InvalidArgumentError(f"{path}: missing; expected the runs of scripts/results.sh")
        runs[name] = json.loads(path.read_text())
    return runs


def _x(row: dict[str, Any], base: str) -> str:
    value = row["speedup"].get(base)
    return f"{value:.2f}x" if value is not None else "-"


def _present(runs: dict[str, dict[str, Any]], method: str) -> bool:
    """Whether both single-stream runs hold `method`: the tree rows are optional (runs with `--tree off,auto`),
    the others are not, and a row measured at one temperature only is an error."""
    have = [run for run in ("t0", "t07") if method in runs[run]["summaries"]["overall"]]
    if len(have) == 2 or (not have and method in (TREE, DRAFTER_ONLY_TREE)):
        return bool(have)
    missing = sorted({"t0", "t07"} - set(have))
    raise InvalidArgumentError(f"{'/'.join(missing)}/bench.json has no {method!r}: expected the single-stream runs "
                               "of scripts/results.sh, both with the same --methods and --tree")


def single_stream_rows(runs: dict[str, dict[str, Any]]) -> list[str]:
    rows = []
    for label, method in DRAFTING:
        if not _present(runs, method):
            continue
        cells = []
        for run in ("t0", "t07"):
            r = runs[run]["summaries"]["overall"][method]
            cells += [f"{r['tokens_per_second']:.1f}", _x(r, "no_draft"), _x(r, "hf_generate")]
        same = runs["t0"]["summaries"]["overall"][method]
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {same['identical_to_no_draft']}/{same['compared']} |")
    for label, method in (("plain decoding (ours)", "no_draft"), ("Hugging Face `generate()`", "hf_generate")):
        _present(runs, method)
        cells = []
        for run in ("t0", "t07"):
            r = runs[run]["summaries"]["overall"][method]
            cells += [f"{r['tokens_per_second']:.1f}", _x(r, "no_draft"), _x(r, "hf_generate")]
        rows.append(f"| {label} | " + " | ".join(cells) + " | |")
    return rows


def batch_line(runs: dict[str, dict[str, Any]]) -> str:
    parts = []
    for dataset, table in runs["batch8"]["batch_by_dataset"].items():
        fast, plain = table[DEFAULT], table["no_draft"]
        parts.append(f"{dataset} {fast['tokens_per_second']:.1f} vs {plain['tokens_per_second']:.1f} tok/s = "
                     f"{fast['tokens_per_second'] / plain['tokens_per_second']:.2f}x "
                     f"({fast['identical_to_no_draft']}/{fast['requests']} identical)")
    rows = next(iter(runs["batch8"]["batch_by_dataset"].values()))[DEFAULT]["rows"]
    return f"| batch of {rows} (continuous batching), total tok/s, default vs plain | " + "; ".join(parts) + " |"


def acceptance_line(runs: dict[str, dict[str, Any]]) -> str:
    t0 = runs["t0"]["summaries"]["overall"]
    replays = runs["acceptance"]["replay_by_dataset"]
    block = next(iter(next(iter(replays.values()))["mean_acceptance_length"]))  # 'b16': the trained size
    parts = [f"{d} {r['mean_acceptance_length'][block]:.2f}" for d, r in replays.items()]
    return (f"| drafter's own acceptance length (T=0, block {block[1:]}, by replay; goal >= 3.5) | " + "; ".join(parts) +
            f"; with looked-up drafts the default commits {t0[DEFAULT]['mean_acceptance_length']:.2f} tokens per "
            "verify |")


def table(runs: dict[str, dict[str, Any]]) -> str:
    t0 = runs["t0"]
    n = t0["config"]["datasets"]
    prompts = " + ".join(f"{v} {k}" for k, v in n.items())
    commits = commit_label(run["environment"] for run in runs.values() if "environment" in run)
    head = (f"Default pair (SmolLM2-135M-Instruct + the shipped drafter), {prompts} first turns, "
            f"{t0['config']['settings']['max_new_tokens']} new tokens, one process side by side; "
            f"{machine(t0['environment'])}; commit {commits}, "
            f"{date.today().isoformat()}.")
    lines = [head, "",
             "| single stream | T=0 tok/s | x plain | x HF | T=0.7 tok/s | x plain | x HF | identical (T=0) |",
             "|---|---|---|---|---|---|---|---|", *single_stream_rows(runs), "",
             "| | |", "|---|---|", batch_line(runs), acceptance_line(runs)]
    return "\n".join(lines) + "\n"


def update_readme(readme: Path, text: str) -> None:
    body = readme.read_text()
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), flags=re.S)
    if not pattern.search(body):
        raise InvalidArgumentError(f"{readme}: no {START} ... {END} markers to put the table between")
    with atomic_path(readme) as tmp:
        tmp.write_text(pattern.sub(lambda _m: f"{START}\n{text}{END}", body))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/results.py", description=__doc__.splitlines()[0])
    p.add_argument("folder", help="the output folder of scripts/results.sh")
    p.add_argument("--readme", default=None, help="also put the table into this README, between the markers")
    args = p.parse_args(argv)
    folder = Path(args.folder)
    text = table(load_runs(folder))
    with atomic_path(folder / "README.md") as tmp:
        tmp.write_text("# Results table (`make results`)\n\n" + text)
    if args.readme:
        update_readme(Path(args.readme), text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

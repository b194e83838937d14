"""Drafter v2's scaling measurement (docs/training.md): held-out acceptance against data size, data kind
and drafter depth, every run at the same small compute, from random weights.

Each run is `blockdraft train` (its own process, resumable: a killed run goes on from its last checkpoint when
this script runs again) for COMPUTE sequence passes (steps x sequences x ANCHORS blocks each), with the epochs
set so that the learning-rate schedule ends there whatever the data size. w15 starts from drafter v1's
weights (taken out of git: v1_drafter) instead of random ones: what a campaign that continues v1 on all the data
gets from the same compute. Then the engine's greedy acceptance length is measured by replay
(`blockdraft.decoding.replay`: the engine's own cycles on plain decoding's greedy continuation, fixed verify,
block 16, no lookups) on the first EVAL_PROMPTS MT-Bench and held-out ShareGPT first turns x EVAL_TOKENS; the
continuations are decoded once and kept in the results folder.

    python scripts/drafter_scaling.py [--results docs/figures/drafter-scaling] [--runs r04,r15] [--dry-run]

Results: RESULTS/results.jsonl (one line per run, appended when its eval ends) and RESULTS/scaling.md; run
folders (checkpoints, feature cache) under $BLOCKDRAFT_HOME/scaling (default ~/.cache/blockdraft/scaling), their
metrics.jsonl copied next to the results. Never run it next to a benchmark.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

REGEN = "data/regenerated/smollm2-135m-instruct-sharegpt"
IMPORTS = "data/imported/sharegpt"  # not in git: `blockdraft data import --source sharegpt --out data/imported/sharegpt`
FEATURES = [1, 8, 14, 20, 27]  # v1's target layers, for every depth (one feature cache serves all runs)
COMPUTE, BATCH, ANCHORS = 2400, 2, 64  # sequence passes per run, sequences per step, blocks per sequence
EVAL_PROMPTS, EVAL_TOKENS = 40, 256  # per prompt set (MT-Bench, held-out ShareGPT)
WEIGHTS = "blockdraft/weights/smollm2-135m-instruct-dflash"
V1_COMMIT = "2eaaefc^"  # the commit before v2 was shipped: WEIGHTS there hold v1, which the v1 and w15 rows use
# name: (what it varies, data folders, sequences per folder (None: all), draft layers[, initial weights])
RUNS = {
    "r04": ("regenerated ~0.4M response tokens", [REGEN], 1400, 2),
    "r08": ("regenerated ~0.8M response tokens", [REGEN], 2800, 2),
    "r15": ("regenerated, all (~1.5M response tokens)", [REGEN], None, 2),
    "i15": ("imported chats, target labels", [IMPORTS], 5100, 2),
    "b15": ("both: regenerated + imported, target labels", [REGEN, IMPORTS], None, 2),
    "d3": ("regenerated, all, 3 draft layers", [REGEN], None, 3),
    "d4": ("regenerated, all, 4 draft layers", [REGEN], None, 4),
    "w15": ("regenerated, all, from v1's weights (a warm start)", [REGEN], None, 2, "v1"),
}

BLOCKDRAFT = [sys.executable, "-m", "blockdraft.cli"]

log = logging.getLogger("scaling")


def train_records(folder: str) -> int:
    """Train records of a data folder (0 where it does not exist yet)."""
    return sum(1 for f in sorted(Path(folder).glob("train-*.jsonl.gz")) for _ in gzip.open(f, "rt"))


def v1_drafter(home: Path) -> Path:
    """Drafter v1's folder, taken out of git once (v3 is shipped now; the scaling's rows were measured with v1)."""
    folder = home / "v1"
    if not (folder / "model.safetensors").is_file():
        tmp = home / "v1.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", V1_COMMIT, WEIGHTS], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp), "--strip-components", str(WEIGHTS.count("/") + 1)],
                       input=archive, check=True)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.replace(folder)
    return folder


def train_command(name: str, home: Path, autocast: str = "off") -> list[str]:
    _, folders, limit, layers, *init = RUNS[name]
    sequences = sum(min(limit or 1 << 30, train_records(f) or limit or 0) for f in folders)
    target_labels = IMPORTS in folders
    cmd = [*BLOCKDRAFT, "train", "--out", str(home / "runs" / name),
           "--layers", str(layers), "--block-size", "16", "--target-layer-ids", ",".join(map(str, FEATURES)),
           "--loss", "acceptance", "--vocab", "data", "--max-anchors", str(ANCHORS), "--batch-size", str(BATCH),
           "--epochs", f"{COMPUTE / sequences:.6f}", "--max-len", "1024", "--save-every", "100",
           "--eval-prompts", "0", "--seed", "0", "--autocast", autocast, "--resume"]
    for folder in folders:
        cmd += ["--data", folder]
    if limit:
        cmd += ["--limit", str(limit)]
    if init:  # "v1": its weights as they were shipped
        cmd += ["--init", str(v1_drafter(home))]
    if target_labels:  # the target's greedy tokens are the labels; its forward runs per batch
        cmd += ["--labels", "target", "--features", "online"]
    else:
        cmd += ["--features", "cache", "--feature-cache", str(home / "features")]
    return cmd


def schedule(run: Path, autocast: str) -> str:
    """The passes and epochs a run trained, from its last metrics row: the trainer drops sequences with fewer
    than 2 supervised tokens inside --max-len (long imported first turns), so a run over many imports
    trains a little under COMPUTE."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "epoch" in r][-1]
    return f"{last['step'] * BATCH} passes, {last['epoch']:.2f} epochs" + ("" if autocast == "off" else ", bf16")


def evaluate(drafter: Path, results: Path) -> dict[str, float]:
    """Replayed greedy acceptance length per prompt set (block 16, fixed verify, no lookups)."""
    import torch

    from blockdraft.api import Pipeline
    from blockdraft.bench.metrics import mean_acceptance_length
    from blockdraft.decoding.replay import replay_acceptance
    from blockdraft.decoding.batch_engine import BatchEngine
    from blockdraft.decoding.engine import DecodeOptions
    from blockdraft.prompts import shipped_prompts

    pipe = Pipeline.load(drafter=str(drafter))
    stops = tuple(pipe.stop_token_ids())
    out = {}
    for name in ("mt-bench", "sharegpt-heldout"):
        ids = [pipe.encode(messages=p.first_turn().messages) for p in shipped_prompts(name)[:EVAL_PROMPTS]]
        continuations = plain_continuations(pipe, ids, stops, results / f"continuations-{name}.json", BatchEngine)
        options = DecodeOptions(max_new_tokens=EVAL_TOKENS, block_size=16, stop_token_ids=stops)
        with torch.inference_mode():
            lengths = [replay_acceptance(pipe.engine, p, c, options) for p, c in zip(ids, continuations)]
        out[name] = round(mean_acceptance_length(lengths), 4)
    return out


def plain_continuations(pipe, ids: list[list[int]], stops: tuple[int, ...], path: Path, batch_engine) -> list[list[int]]:
    """The target's greedy continuations of `ids`, decoded once and kept in `path` (checked against the prompts)."""
    from blockdraft.decoding.engine import DecodeOptions

    if path.is_file():
        saved = json.loads(path.read_text())
        if saved["prompts"] == ids and saved["max_new_tokens"] == EVAL_TOKENS:
            return saved["continuations"]
    options = DecodeOptions(max_new_tokens=EVAL_TOKENS, no_draft=True, stop_token_ids=stops)
    done = {i: tokens for i, tokens, _ in batch_engine(pipe.engine, 16).run(ids, [options] * len(ids))}
    continuations = [done[i] for i in range(len(ids))]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"prompts": ids, "max_new_tokens": EVAL_TOKENS, "continuations": continuations}))
    tmp.replace(path)
    return continuations


def render(results: Path) -> None:
    rows = [json.loads(line) for line in (results / "results.jsonl").read_text().splitlines()]
    lines = ["| run | varies | sequences x epochs | MT-Bench tau | held-out tau | mean |", "|---|---|---|---|---|---|"]
    for r in rows:
        tau = r["tau"]
        lines.append(f"| {r['run']} | {r['varies']} | {r.get('schedule', '-')} | {tau['mt-bench']:.3f} | "
                     f"{tau['sharegpt-heldout']:.3f} | {(tau['mt-bench'] + tau['sharegpt-heldout']) / 2:.3f} |")
    (results / "scaling.md").write_text(
        f"Replayed greedy acceptance, block 16, fixed verify, no lookups, first {EVAL_PROMPTS} MT-Bench and "
        f"{EVAL_PROMPTS} held-out ShareGPT first turns x {EVAL_TOKENS} tokens; every run {COMPUTE} sequence passes "
        f"({BATCH} sequences x {ANCHORS} blocks a step), from random weights unless the run says otherwise "
        f"(scripts/drafter_scaling.py).\n\n"
        + "\n".join(lines) + "\n")


def done_runs(results: Path) -> set[str]:
    path = results / "results.jsonl"
    return {json.loads(line)["run"] for line in path.read_text().splitlines()} if path.is_file() else set()


def record(results: Path, row: dict) -> None:
    with open(results / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    render(results)


def main() -> int:
    import os

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="docs/figures/drafter-scaling")
    parser.add_argument("--runs", default=",".join(["v1", *RUNS]), help="comma-separated; v1 = drafter v1")
    parser.add_argument("--autocast", choices=("off", "bf16"), default="off",
                        help="train in bf16 autocast (1.5x on a CPU with AVX512-BF16, losses within 1%%; the "
                             "first runs were fp32, so it is recorded with the run)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    home = Path(os.environ.get("BLOCKDRAFT_HOME", Path.home() / ".cache" / "blockdraft")) / "scaling"
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    for name in args.runs.split(","):
        if name not in ("v1", *RUNS):
            parser.error(f"run {name!r}: expected v1 or one of {', '.join(RUNS)}")
        if name in done_runs(results):
            log.info("%s: measured already (%s)", name, results / "results.jsonl")
            continue
        if name == "v1":
            if not args.dry_run:
                record(results, {"run": "v1", "varies": "v1, shipped until 2026-12-04 (2 layers, 2,177 answers, GPU)",
                                 "tau": evaluate(v1_drafter(home), results)})
            continue
        if IMPORTS in RUNS[name][1] and not Path(IMPORTS).is_dir() and not args.dry_run:  # 6 s, 17 MB, not in git
            subprocess.run([*BLOCKDRAFT, "data", "import", "--source", "sharegpt", "--out", IMPORTS], check=True)
        cmd = train_command(name, home, args.autocast)
        if args.dry_run:
            print(" ".join(cmd))
            continue
        log.info("%s: %s", name, " ".join(cmd))
        subprocess.run(cmd, check=True)
        run = home / "runs" / name
        shutil.copy(run / "metrics.jsonl", results / f"{name}-metrics.jsonl")
        record(results, {"run": name, "varies": RUNS[name][0], "schedule": schedule(run, args.autocast),
                         "tau": evaluate(run / "final", results)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

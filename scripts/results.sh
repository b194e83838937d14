#!/usr/bin/env bash
# Regenerates the README's results table (`make results`): ~35 min on a 2-core CPU, nothing else running.
# Every run is side by side in one process; the table is composed by scripts/results.py.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/figures/results}
BD=${BD:-.venv/bin/blockdraft}
PY=${PY:-.venv/bin/python}
SINGLE="--dataset mt-bench --dataset humaneval --max-samples 8 --turns 1 --max-new-tokens 256"
# single stream: generate's default, the drafter alone, each with and without draft trees, our plain decoding and
# HF generate(), at T=0 and T=0.7
$BD bench $SINGLE --methods dflash_ngram,dflash,no_draft,hf_generate --tree off,auto --out "$OUT/t0"
$BD bench $SINGLE --methods dflash_ngram,dflash,no_draft,hf_generate --tree off,auto --temperature 0.7 \
    --out "$OUT/t07"
# throughput of a batch of 8 with continuous batching, 2 rounds in alternating order (ABBA)
$BD bench --dataset mt-bench --dataset humaneval --max-samples 16 --turns 1 --max-new-tokens 256 \
    --methods dflash_ngram,no_draft --batch 8 --batch-only --batch-rounds 2 --out "$OUT/batch8"
# the drafter's own greedy acceptance at its trained block size, by replaying plain greedy answers
$BD bench --dataset mt-bench --dataset sharegpt-heldout --max-samples 16 --turns 1 --max-new-tokens 256 \
    --replay --batch 16 --out "$OUT/acceptance"
$PY scripts/results.py "$OUT" --readme README.md

#!/usr/bin/env bash
# Measure a drafter checkpoint against the shipped one on what decides whether it ships: its greedy acceptance
# length, whether its outputs stay identical to plain decoding's, and its end-to-end speed:
#
#   scripts/ship_drafter.sh CHECKPOINT [OUT]       # a drafter folder, e.g. ~/.cache/blockdraft/campaign/v2-stage1/final,
#                                                  # or a stash: data/checkpoints/v2-campaign/stage4 (its latest step)
#   DRY=1 scripts/ship_drafter.sh CHECKPOINT /tmp/ship-dry   # every step at tiny scale (a minute or two)
#
# The tables name the shipped drafter $SHIPPED (default v3) and the candidate $CANDIDATE (default v4);
# SHIPPED_DIR compares against another drafter folder than the shipped one (e.g. an older one taken out of git).
#
# 1. export: CHECKPOINT in the published layout (bf16) with a 16K draft vocabulary built from all the answers its
#    lineage trained on ($VOCAB_DATA, space-separated folders; default the three stage 4 trains on: regenerated
#    first turns, second turns, synthetic answers), into OUT/drafter: the folder to copy into blockdraft/weights/
#    if it ships
#    (git ignores it under docs/figures; a fresh clone exports it again from the same CHECKPOINT in a minute);
# 2. acceptance: the engine's greedy acceptance at block 16 with fixed verify and no lookups, of both drafters over
#    the same plain continuations (`bench --replay`: cycle for cycle the engine's), 80 MT-Bench + 80 held-out
#    ShareGPT first turns x 256 tokens (OUT/replay);
# 3. lossless: the candidate in the engine itself, batched, fixed verify, no lookups, on the same 160 prompts:
#    its tau and how many greedy outputs equal plain decoding's (OUT/identical; ~40 min on 2 cores);
# 4. speed: the README's benchmark (8 MT-Bench + 8 HumanEval first turns, 256 tokens) with both drafters side by
#    side in one process, the default (lookups) and the drafter alone, at T=0 and T=0.7 (OUT/t0, OUT/t07).
# About 1.5 h on a 2-core CPU with nothing else running: pause the campaign first (scripts/campaign.sh).
# A step whose results are in OUT already is skipped, so a run stopped between steps goes on with the same
# command; OUT/candidate.sha256 ties OUT to CHECKPOINT's weights, and another CHECKPOINT is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
CAND=${1:?usage: scripts/ship_drafter.sh CHECKPOINT [OUT]}
OUT=${2:-docs/figures/drafter-v4}
SHIPPED=${SHIPPED:-v3} CANDIDATE=${CANDIDATE:-v4}
BD=${BD:-.venv/bin/blockdraft}
SHIPPED_DIR=${SHIPPED_DIR:-blockdraft/weights/smollm2-135m-instruct-dflash}  # the shipped drafter (or an older one)
REGEN=data/regenerated/smollm2-135m-instruct-sharegpt
TURN2=data/regenerated/smollm2-135m-instruct-sharegpt-turn2  # stage 2's second folder
SYNTH=data/regenerated/smollm2-135m-instruct-synthetic  # stage 3's, and stage 4's third
read -r -a folders <<< "${VOCAB_DATA:-$REGEN $TURN2 $SYNTH}"
VOCAB=(); for d in "${folders[@]}"; do VOCAB+=(--data "$d"); done
if [[ -n "${DRY:-}" ]]; then N=2 SPEED=1 TOKENS=16; else N=80 SPEED=8 TOKENS=256; fi
HELD="--dataset mt-bench --dataset sharegpt-heldout --max-samples $N --turns 1 --max-new-tokens $TOKENS"
SINGLE="--dataset mt-bench --dataset humaneval --max-samples $SPEED --turns 1 --max-new-tokens $TOKENS"
BOTH=(--drafter "$SHIPPED=$SHIPPED_DIR" --drafter "$CANDIDATE=$OUT/drafter")
mkdir -p "$OUT"
weights=$(find "$CAND" -name 'model.safetensors*' | sort | xargs -r sha256sum | cut -d' ' -f1 | sha256sum | cut -d' ' -f1)
[ -n "$(find "$CAND" -name 'model.safetensors*')" ] || { echo "$CAND: expected a drafter folder or a stash" >&2; exit 2; }
[ -f "$OUT/candidate.sha256" ] || echo "$weights $CAND" > "$OUT/candidate.sha256"
[ "$(cut -d' ' -f1 "$OUT/candidate.sha256")" = "$weights" ] || {
    echo "$OUT holds the results of $(cut -d' ' -f2- "$OUT/candidate.sha256"), not $CAND: expected a fresh OUT" >&2
    exit 2; }
have() { [ -e "$OUT/$1" ] && echo "ship_drafter.sh: $OUT/$1 is there already: step skipped" >&2; }
have drafter/model.safetensors ||
    $BD export --drafter "$CAND" --out "$OUT/drafter" --dtype bfloat16 --draft-vocab 16384 \
        "${VOCAB[@]}"
have replay/bench.json || $BD bench $HELD --replay --block-sizes 16 --batch 16 "${BOTH[@]}" --out "$OUT/replay"
have identical/bench.json || $BD bench $HELD --drafter "$OUT/drafter" --methods dflash,no_draft --verify fixed \
    --block-sizes 16 --batch 16 --batch-only --out "$OUT/identical"
have t0/bench.json || $BD bench $SINGLE "${BOTH[@]}" --methods dflash_ngram,dflash,no_draft --out "$OUT/t0"
have t07/bench.json ||
    $BD bench $SINGLE "${BOTH[@]}" --methods dflash_ngram,dflash,no_draft --temperature 0.7 --out "$OUT/t07"

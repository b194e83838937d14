#!/usr/bin/env bash
# Drafter v2's training campaign on this CPU (issue 36; recipe and reasons in docs/training.md, "The v2 campaign").
# One command for every session: it trains in the background on both cores and keeps its latest checkpoint
# (weights, AdamW moments, step, metrics) in data/checkpoints/v2-campaign as pieces of at most 32 MiB, to commit once
# at the end of a session (a replacement of the ~101 MB stash is ~200 MB of the 256 MiB of diffs a session may
# submit: two in one session would pass it, and then none of the session's work lands). On a fresh machine the
# same command restores that stash and goes on bitwise. Stage 1 built its feature cache first (~70 min for the
# 5,101 answers here); stage 2 fills its cache as it goes (--features lazy), so a fresh machine trains at once and
# pays the target's forward for a sequence's first use only.
#
#   nohup scripts/campaign.sh > /tmp/campaign.log 2>&1 &
#   kill -STOP $(pgrep -f "train --out .*campaign/v2")      # pause it for a benchmark (never measure next to it)
#   kill -CONT $(pgrep -f "train --out .*campaign/v2")      # and go on
#   kill -TERM $(pgrep -f "train --out .*campaign/v2")      # stop: it saves the step it is on and stashes it
#
# Stages 1 and 2 need a CPU with native bf16 (AVX512-BF16 or AMX; `lscpu | grep -o 'avx512_bf16\|amx_bf16'`): they
# train in bf16 autocast, which an AVX2-only CPU emulates at ~90 s a step, and a stage cannot resume in fp32.
# Stages 3 and 4 train in fp32 and run anywhere.
#
# STAGE picks the schedule; a new stage starts from the previous stage's stash with a schedule of its own (the
# data or the settings changed, so `--resume` would refuse the old checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=${STAGE:-1}
HOME_DIR=${BLOCKDRAFT_HOME:-$HOME/.cache/blockdraft}
FEATURES=${FEATURES:-$HOME_DIR/scaling/features}  # the scaling runs' fp16 cache: layers 1,8,14,20,27 of every answer
STASH=${STASH:-data/checkpoints/v2-campaign}
REGEN=data/regenerated/smollm2-135m-instruct-sharegpt
TURN2=data/regenerated/smollm2-135m-instruct-sharegpt-turn2
SYNTH=data/regenerated/smollm2-135m-instruct-synthetic
V1=blockdraft/weights/smollm2-135m-instruct-dflash
# A stage's data must not change while it runs (--resume refuses a changed sequence list): new answers go to a
# folder of their own, for the next stage. Stage 2 starts from the repository's stage-1 stash whatever STASH says
# (a dry run with another STASH still continues the real lineage). Its sequence ids carry their folder's index
# (0/..., 1/...), so stage 1's cache in $FEATURES does not serve it: its own cache fills during its first epoch.
# Stage 3 fine-tunes stage 2's drafter (its stash, step 9,242) on the synthetic prompts' answers (MT-Bench's kinds,
# which the ShareGPT first turns under-serve) in fp32, so that it runs on an AVX2-only CPU too (~2.6 s a step there).
# It moved acceptance from ShareGPT to MT-Bench without adding any (docs/training.md, "Stage 3"), so stage 4 trains
# stage 2's drafter on all three folders together, also in fp32: start it once the synthetic prompts are all
# answered (data/regenerated/README.md), since the synthetic folder must not change while it runs.
AUTOCAST=bf16
case "$STAGE" in
  1) INIT=$V1 DATA=(--data "$REGEN") EPOCHS=4 LR=2e-4 FEATS=(--features cache --feature-cache "$FEATURES") ;;
  2) INIT=data/checkpoints/v2-campaign/stage1 DATA=(--data "$REGEN" --data "$TURN2") EPOCHS=2 LR=2e-4 FEATS=(--features lazy) ;;
  3) INIT=data/checkpoints/v2-campaign/stage2 DATA=(--data "$SYNTH") EPOCHS=1 LR=1e-4 FEATS=(--features lazy)
     AUTOCAST=off ;;
  4) INIT=data/checkpoints/v2-campaign/stage2 DATA=(--data "$REGEN" --data "$TURN2" --data "$SYNTH") EPOCHS=1 LR=1e-4
     FEATS=(--features lazy) AUTOCAST=off ;;
  *) echo "campaign.sh: STAGE=$STAGE: expected 1, 2, 3 or 4" >&2; exit 2 ;;
esac
# a finished stage has nothing to do: say so before a fresh machine spends ~70 min rebuilding the feature cache
last=$(ls -d "$STASH/stage$STAGE"/step-[0-9]* 2>/dev/null | tail -1 || true)  # none yet: a new stage
if [ -n "$last" ] && "${PY:-.venv/bin/python}" -c "import json, sys; t = json.load(open(sys.argv[1]))
sys.exit(t['step'] != t['total_steps'])" "$last/trainer.json"; then
    echo "campaign.sh: stage $STAGE finished at $(basename "$last") ($STASH/stage$STAGE); nothing to do" >&2
    exit 0
fi
exec "${PY:-.venv/bin/python}" -m blockdraft.cli train --out "$HOME_DIR/campaign/v2-stage$STAGE" \
    --stash "$STASH/stage$STAGE" --resume --init "$INIT" "${DATA[@]}" \
    --layers 2 --block-size 16 --target-layer-ids 1,8,14,20,27 --loss acceptance --vocab data \
    --max-anchors 64 --batch-size 2 --epochs "$EPOCHS" --lr "$LR" --max-len 1024 --autocast "$AUTOCAST" \
    "${FEATS[@]}" --save-every 250 \
    --eval-every 1000 --eval-prompts 24 --eval-max-new-tokens 128 --seed 0 "$@"

#!/usr/bin/env bash
# The default drafter's training, stage by stage (recipe and reasons: docs/training.md; the stages so far and their
# curves: the model card and docs/figures/drafter-campaign). One command starts or resumes a stage: it trains in the
# background on every core and keeps its latest checkpoint (weights, AdamW moments, step, metrics) in
# data/checkpoints/v2-campaign/stageN as pieces of at most 32 MiB with a sha256 manifest, so that a stage can move to
# another machine; there the same command restores it and goes on bitwise. Stages 1-3 are finished and only their
# metrics are kept; stage 4 is the one that trains now:
#
#   STAGE=4 nohup scripts/campaign.sh > /tmp/campaign.log 2>&1 &
#   kill -STOP $(pgrep -f "train --out .*campaign/v2")      # pause it for a benchmark (never measure next to it)
#   kill -CONT $(pgrep -f "train --out .*campaign/v2")      # and go on
#   kill -TERM $(pgrep -f "train --out .*campaign/v2")      # stop: it saves the step it is on and stashes it
#
# Stage 4 continues the shipped drafter v3 for one epoch over all three folders of data/regenerated/ (first turns,
# second turns, synthetic prompts of MT-Bench's kinds) in fp32, so it runs on any CPU (~3-4 s a step on 2 cores).
# Its first run started from v3's fp32 weights (stage 2's last step); a fresh start today starts from the shipped
# bf16 folder instead. Stages 1-2 trained in bf16 autocast, which needs AVX512-BF16 or AMX on a CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=${STAGE:-4}
HOME_DIR=${BLOCKDRAFT_HOME:-$HOME/.cache/blockdraft}
STASH=${STASH:-data/checkpoints/v2-campaign}
REGEN=data/regenerated/smollm2-135m-instruct-sharegpt
TURN2=data/regenerated/smollm2-135m-instruct-sharegpt-turn2
SYNTH=data/regenerated/smollm2-135m-instruct-synthetic
SHIPPED=blockdraft/weights/smollm2-135m-instruct-dflash
# A stage's data must not change while it runs (--resume refuses a changed sequence list): new answers go to a
# folder of their own, for the next stage. --features lazy fills the feature cache as it goes, so a fresh machine
# trains at once and pays the target's forward for a sequence's first use only.
case "$STAGE" in
  4) INIT=$SHIPPED DATA=(--data "$REGEN" --data "$TURN2" --data "$SYNTH") EPOCHS=1 LR=1e-4
     FEATS=(--features lazy) AUTOCAST=off ;;
  *) echo "campaign.sh: STAGE=$STAGE: expected 4 (stages 1-3 are finished: docs/figures/drafter-campaign)" >&2; exit 2 ;;
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

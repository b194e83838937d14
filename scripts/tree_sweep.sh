#!/usr/bin/env bash
# Server sweep of draft trees: three servers up together, draft trees (--tree auto), the default (chains) and plain
# decoding (--no-draft); closed-loop clients on 8 MT-Bench first turns, 256 tokens, T=0, c = 1..32, ABBA per
# level, 2 rounds (~20 min on a 2-core CPU, nothing else running). Results in docs/figures/trees-v*/serve.
#   scripts/tree_sweep.sh OUT [extra scripts/serve_sweep.py flags]
#   DRAFTER=FOLDER scripts/tree_sweep.sh OUT     # every server with another drafter than the shipped one
# OUT is relative to the repository root. BIN (default .venv/bin) picks the installation.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/tree_sweep.sh OUT [serve_sweep flags]}
shift
BIN=${BIN:-.venv/bin}
S="$BIN/blockdraft serve --port {port}${DRAFTER:+ --drafter $DRAFTER}"
exec "$BIN/python" scripts/serve_sweep.py \
  --server "trees=$S --tree auto" --server "dflash=$S" --server "plain=$S --no-draft" \
  --baseline dflash --baseline plain --reference plain \
  --concurrency 1,2,4,8,16,32 --samples 8 --max-tokens 256 --rounds 2 --overhead-rounds 0 \
  --port 0 --out "$OUT" "$@"

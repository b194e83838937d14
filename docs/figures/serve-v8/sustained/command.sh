#!/usr/bin/env bash
# serve-v8/sustained: our server with and without speculation as shipped, under sustained load (24 prompts, so
# max(c, 24) requests a level: three per client at 8 clients), 2 ABBA rounds. Run from anywhere; OUT defaults to
# ./serve-v8-sustained under the repository. Ran on 2026-12-03 at d46b622 with OUT=/tmp/x/v8sus, then copied here,
# as `.venv/bin/python -m blockdraft.bench.serve_sweep`; the sweep is scripts/serve_sweep.py now (same flags).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${1:-serve-v8-sustained}
.venv/bin/python scripts/serve_sweep.py \
  --server "dflash=.venv/bin/blockdraft serve --port {port}" \
  --server "plain=.venv/bin/blockdraft serve --port {port} --no-draft" \
  --baseline plain --reference plain \
  --concurrency 8,16,32 --samples 24 --max-tokens 256 --rounds 2 --overhead-rounds 0 --port 0 --out "$OUT"

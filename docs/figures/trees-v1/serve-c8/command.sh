#!/usr/bin/env bash
# The c=8 level again (2026-12-04), 3 rounds, both servers timed cycle by cycle (cycles.txt: scripts/serve_cycles.py
# --summary). Ran as `.venv/bin/python -m blockdraft.bench.serve_sweep`; the sweep is scripts/serve_sweep.py now.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
W=".venv/bin/python scripts/serve_cycles.py"
.venv/bin/python scripts/serve_sweep.py \
  --server "trees=$W /tmp/t-{port}.json serve --port {port} --tree auto" --server "dflash=$W /tmp/d-{port}.json serve --port {port}" \
  --baseline dflash --concurrency 8 --samples 8 --max-tokens 256 --rounds 3 --overhead-rounds 0 --port 0 \
  --out docs/figures/trees-v1/serve-c8

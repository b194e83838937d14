#!/usr/bin/env bash
# issue 35: the c=8 level again, 3 rounds, both servers timed cycle by cycle (cycles.txt: scripts/serve_cycles.py --summary)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
W=".venv/bin/python scripts/serve_cycles.py"
.venv/bin/python -m blockdraft.bench.serve_sweep \
  --server "trees=$W /tmp/t-{port}.json serve --port {port} --tree auto" --server "dflash=$W /tmp/d-{port}.json serve --port {port}" \
  --baseline dflash --concurrency 8 --samples 8 --max-tokens 256 --rounds 3 --overhead-rounds 0 --port 0 \
  --out docs/figures/trees-v1/serve-c8

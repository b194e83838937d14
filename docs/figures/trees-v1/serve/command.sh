#!/usr/bin/env bash
# issue 35: server sweep with trees (--tree auto) vs today's default (chains) vs plain decoding
set -euo pipefail
cd "$(dirname "$0")/../../../.."
S=".venv/bin/blockdraft serve --port {port}"
.venv/bin/python -m blockdraft.bench.serve_sweep \
  --server "trees=$S --tree auto" --server "dflash=$S" --server "plain=$S --no-draft" \
  --baseline dflash --baseline plain --reference plain \
  --concurrency 1,2,4,8,16,32 --samples 8 --max-tokens 256 --rounds 2 --overhead-rounds 0 \
  --port 0 --out docs/figures/trees-v1/serve

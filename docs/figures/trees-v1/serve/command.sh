#!/usr/bin/env bash
# The server sweep of this folder (2026-12-04), trees vs chains vs plain decoding, as it ran with drafter v1 (the
# shipped drafter until 2eaaefc). Run as is, it would measure today's shipped drafter into this v1 folder, so
# it needs v1's weights: git worktree add /tmp/v1 2eaaefc~1 && DRAFTER=/tmp/v1/blockdraft/weights/smollm2-135m-instruct-dflash
set -euo pipefail
: "${DRAFTER:?set DRAFTER to the folder of drafter v1, as the header of this script says}"
cd "$(dirname "$0")/../../../.." && exec scripts/tree_sweep.sh docs/figures/trees-v1/serve "$@"

#!/usr/bin/env bash
# issue 35: the server sweep of this folder (drafter v2 at the time): trees vs chains vs plain decoding
cd "$(dirname "$0")/../../../.." && exec scripts/tree_sweep.sh docs/figures/trees-v2/serve "$@"

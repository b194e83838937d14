#!/usr/bin/env bash
# issue 35: the server sweep of this folder (drafter v1 at the time): trees vs chains vs plain decoding
cd "$(dirname "$0")/../../../.." && exec scripts/tree_sweep.sh docs/figures/trees-v1/serve "$@"

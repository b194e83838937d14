#!/usr/bin/env bash
# The server sweep of this folder (2026-12-04, drafter v2 at the time): trees vs chains vs plain decoding
cd "$(dirname "$0")/../../../.." && exec scripts/tree_sweep.sh docs/figures/trees-v2/serve "$@"

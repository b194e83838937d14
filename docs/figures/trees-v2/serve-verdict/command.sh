#!/usr/bin/env bash
# The server sweep again (2026-12-05) after the measured tree/chain verdict per batch size
# (AdaptiveVerify.chain_cycle): trees vs chains vs plain decoding, drafter v2
cd "$(dirname "$0")/../../../.." && exec scripts/tree_sweep.sh docs/figures/trees-v2/serve-verdict "$@"

#!/usr/bin/env bash
# issue 35: the server sweep again after the measured tree/chain verdict per batch size (AdaptiveVerify.chain_cycle,
# session 31): trees vs chains vs plain decoding, drafter v2
cd "$(dirname "$0")/../../../.." && exec scripts/tree_sweep.sh docs/figures/trees-v2/serve-verdict "$@"

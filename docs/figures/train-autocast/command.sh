#!/usr/bin/env bash
# ABBA: fp32 vs bf16 autocast training steps on the cached features (scaling run settings)
cd /work/main
for a in off bf16 bf16 off; do
  i=$((i+1)); out=/tmp/s26/ac-$i-$a; rm -rf $out
  .venv/bin/python -m blockdraft.cli train --out $out --layers 2 --block-size 16 --target-layer-ids 1,8,14,20,27 \
    --loss acceptance --vocab data --max-anchors 64 --batch-size 2 --epochs 1 --max-len 1024 --save-every 100000 \
    --eval-prompts 0 --seed 0 --data data/regenerated/smollm2-135m-instruct-sharegpt --limit 400 --features cache \
    --feature-cache /root/.cache/blockdraft/scaling/features --max-steps 24 --log-every 4 --autocast $a > $out.log 2>&1
  echo "$a $(.venv/bin/python -c "
import json,sys; r=[json.loads(l) for l in open('$out/metrics.jsonl')]; r=[x for x in r if 'loss' in x][1:]
print('tok/s %.0f' % (sum(x['tokens_per_second'] for x in r)/len(r)), 'losses', [round(x['loss'],3) for x in r])")"
done

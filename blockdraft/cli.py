"""Command line: `blockdraft generate ...`, `blockdraft serve ...` and the train / bench / export commands."""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import tempfile
from pathlib import Path

from blockdraft.api import DEFAULT_SAMPLER, DEFAULT_TREE
from blockdraft.bench.command import add_parser as add_bench_parser
from blockdraft.qualify.command import add_parser as add_qualify_parser
from blockdraft.qualify.command import run_qualify
from blockdraft.bench.command import run_bench_command
from blockdraft.decoding.sampling import SAMPLERS
from blockdraft.errors import BlockdraftError, InvalidArgumentError, require_extra
from blockdraft.modeling.export import ENGINES
from blockdraft.modeling.registry import DEFAULT_TARGET, add_draft_vocab_argument, add_pack_argument, pack_choice
from blockdraft.serving.scheduler import (DEFAULT_DRAIN_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_MAX_MODEL_LEN,
                                          DEFAULT_MAX_QUEUE, DEFAULT_PREFILL_CHUNK)
from blockdraft.train.command import add_parsers as add_training_parsers
from blockdraft.train.command import run_data, run_train

log = logging.getLogger(__name__)
# The import names of the `serve` extra's packages (pyproject.toml); the core install has none of them.
SERVE_MODULES = ("fastapi", "uvicorn", "pydantic", "prometheus_client")


def needed_extra(args: argparse.Namespace) -> tuple[str, str, tuple[str, ...]] | None:
    """(the command, the extra, its modules) when the parsed command needs an optional extra; checked first, so a
    missing one stops the command in one line before any work (not with a traceback at the end of a long run)."""
    if args.command == "serve":
        return "blockdraft serve", "serve", SERVE_MODULES
    if args.command == "train" and args.plot:
        return "blockdraft train --plot", "train", ("matplotlib",)
    if args.command == "bench" and not args.base_url:  # a local run plots; a server sweep (--base-url) does not
        return "blockdraft bench", "bench", ("matplotlib",)
    if args.command == "qualify":  # plots, and measures through `blockdraft serve` unless --no-server
        return "blockdraft qualify", "bench", ("matplotlib",) + (() if args.no_server else SERVE_MODULES)
    return None


def _model_arguments(p: argparse.ArgumentParser) -> None:
    """The target / drafter pair and how to load it (generate and serve)."""
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"short id, local folder or hub id (default {DEFAULT_TARGET})")
    p.add_argument("--drafter", default=None, help="DFlash drafter folder (published z-lab format or ours); default: the "
                   "one shipped for the target (blockdraft/weights/), or 'untrained'")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16")
    p.add_argument("--compile", nargs="?", const="default", default=None,
                   help="torch.compile the per-layer blocks (mode: default | reduce-overhead = CUDA graphs)")
    p.add_argument("--draft-window", type=int, default=None, help="keep only this many context tokens in the drafter's cache")
    add_pack_argument(p)
    add_draft_vocab_argument(p)


def _decoding_arguments(p: argparse.ArgumentParser) -> None:
    """How speculation runs (generate and serve; a server applies them to every request)."""
    p.add_argument("--block-size", type=int, default=None, help="run-time block size (<= the trained one)")
    p.add_argument("--draft", choices=("sample", "greedy"), default="sample",
                   help="with temperature > 0: sample drafts from the drafter or propose its argmax")
    p.add_argument("--no-draft", action="store_true", help="plain autoregressive decoding (the baseline)")
    p.add_argument("--verify", choices=("fixed", "adaptive"), default="adaptive",
                   help="adaptive (default): verify only the draft prefix worth its cost on this device (cost curve "
                        "measured once and cached); fixed: verify every draft of the block")
    p.add_argument("--sampler", choices=SAMPLERS, default=DEFAULT_SAMPLER,
                   help="with temperature > 0: auto (default: gumbel given a seed, rejection without), gumbel (given a "
                        "seed, exactly the tokens plain decoding gives with it) or rejection (the min(1, "
                        "p/q) rule, which accepts more drafts); all sample the target exactly")
    p.add_argument("--no-ngram", dest="ngram", action="store_false",
                   help="draft with the drafter only (default: also look the context up, prompt-lookup style, in the "
                        "cycles where that should commit more; lossless either way)")
    p.add_argument("--tree", type=tree_setting, default=DEFAULT_TREE,
                   help=f"draft trees from the drafter's one pass: off, auto (the adaptive policy picks the size) or "
                        f"a node budget N (default {DEFAULT_TREE}; looked-up drafts join as one branch)")


def _generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text with a target + DFlash drafter pair")
    _model_arguments(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw text prompt (no chat template)")
    src.add_argument("--chat", help="one user message, formatted with the target's chat template")
    p.add_argument("--max-new-tokens", type=int, default=256, help="at most this many new tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the smallest set of tokens "
                   "whose probability reaches this (default 1.0 = all)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (default 0 = all)")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler (default: a fresh one per call)")
    _decoding_arguments(p)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--stats", action="store_true", help="print the stats and memory lines after the text (stderr)")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    p.add_argument("--compare", action="store_true",
                   help="then decode the same prompt plainly (no drafts) in this process and print both speeds and "
                        "whether the outputs are identical (stderr)")


def _info_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe a target + drafter pair from their folders (no weights loaded)")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"short id, .gguf file, local folder or hub id "
                   f"(default {DEFAULT_TARGET})")
    p.add_argument("--drafter", default=None, help="DFlash drafter folder (default: the one shipped for the target; "
                   "'none': the target alone)")
    p.add_argument("--context", type=int, default=2048, help="tokens per request for the memory line (default 2048)")
    p.add_argument("--dtype", default="auto", help="dtype for the memory line: auto (fp32 on CPU, bf16 on GPU), "
                   "float32, bfloat16, float16")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /metrics) "
                                     "with continuous batching across requests (docs/serve.md)")
    _model_arguments(p)
    _decoding_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 = all)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    p.add_argument("--api-key", default=os.environ.get("BLOCKDRAFT_API_KEY"),
                   help="answer /v1/* only with the header 'Authorization: Bearer KEY' (default: $BLOCKDRAFT_API_KEY; "
                        "none: no check)")
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                   help=f"cache rows: requests decoding together (default {DEFAULT_MAX_BATCH}; 1 = one request at a "
                        "time, in arrival order)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help=f"tokens per row, prompt + answer (default {DEFAULT_MAX_MODEL_LEN} or the target's context if "
                        "smaller); longer requests get a 400")
    p.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help=f"requests that may wait for a row; more get a 429 with Retry-After (default {DEFAULT_MAX_QUEUE})")
    p.add_argument("--max-queue-wait", type=float, default=None, metavar="SECONDS",
                   help="a request that waited this long for a row gets a 503 (default: no limit)")
    p.add_argument("--drain-timeout", type=float, default=DEFAULT_DRAIN_TIMEOUT, metavar="SECONDS",
                   help="on SIGTERM / Ctrl-C, how long admitted requests may take to finish before they are "
                        f"cancelled (default {DEFAULT_DRAIN_TIMEOUT:g})")
    p.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK,
                   help="prompt tokens prefilled between two decode cycles: a long prompt never freezes running "
                        f"streams for longer (default {DEFAULT_PREFILL_CHUNK})")


def _export_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a drafter folder that vLLM and SGLang load as it is (docs/export.md)")
    p.add_argument("--drafter", required=True,
                   help="drafter folder (ours or z-lab), or a training stash (`train --stash`): its latest step's")
    p.add_argument("--out", required=True, help="output folder (replaced atomically)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                   help="dtype of the written weights (default bfloat16, as published drafters)")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="K",
                   help="give the drafter its own vocabulary: the K tokens the target writes most often in --data "
                        "(blockdraft.modeling.draft_vocab); 0 removes one")
    p.add_argument("--data", action="append", default=None,
                   help="regenerated data folder for --draft-vocab (its train split); repeatable: the tokens of all "
                        "of them are counted together, e.g. every folder the drafter was trained on")
    p.add_argument("--target", default=None,
                   help="the target the drafter was trained on: its tokenizer gives the mask token's string and "
                        "reads --data, and the folder records it (default: the one the drafter records, else "
                        f"{DEFAULT_TARGET})")
    p.add_argument("--serve-command", choices=ENGINES, default=None,
                   help="then print the command that serves the pair on this engine (method, draft folder, number of "
                        "draft tokens, attention backend), with a warning when it serves another target")
    p.add_argument("--serve-target", default=None,
                   help="the target the printed command serves (default: the training target; an embedded id or a "
                        ".gguf file becomes its converted fp32 folder)")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="GPUs the printed command splits the pair over (vLLM --tensor-parallel-size, SGLang --tp-size; "
                        "default 1)")


def run_export(args: argparse.Namespace) -> int:
    import torch

    from blockdraft.modeling.checkpoint import load_drafter, save_drafter
    from blockdraft.modeling.export import export_target, serving, stamp, warn_engine_problems
    from blockdraft.train.stash import stashed_drafter

    with tempfile.TemporaryDirectory() as tmp:
        stashed = stashed_drafter(Path(args.drafter), Path(tmp))
        try:
            drafter = load_drafter(stashed or args.drafter)
        except BlockdraftError as e:  # name the stash the user gave, not the folder rebuilt from it
            if stashed is None:
                raise
            raise type(e)(f"--drafter {args.drafter} (its latest stashed step, {stashed.parent.name}): {e}") from e
    target = export_target(drafter.config, args.target)
    if args.draft_vocab is not None:
        drafter.draft_vocab = _draft_vocab(args, target[0] if target else DEFAULT_TARGET) if args.draft_vocab else None
    if target is not None:
        stamp(drafter.config, *target)
    command = None
    if args.serve_command:  # checked before writing: a pair the engine cannot run leaves no folder behind
        command = serving(drafter.config, args.out, args.serve_command, args.serve_target, args.tensor_parallel,
                          args.dtype)
    else:
        warn_engine_problems(drafter.config, None if target is None else target[1])
    print(save_drafter(drafter, args.out, dtype=getattr(torch, args.dtype), metadata={"source": str(args.drafter)}))
    if command:
        print(command)
    return 0


def _draft_vocab(args: argparse.Namespace, target: str):
    from blockdraft.modeling.draft_vocab import frequent_tokens
    from blockdraft.modeling.registry import load_tokenizer
    from blockdraft.train.data import load_sequences

    if not args.data:
        raise InvalidArgumentError("--draft-vocab needs --data: the regenerated answers whose tokens it counts")
    tokenizer = load_tokenizer(target)
    sequences = [s for folder in args.data for s in load_sequences(folder, "train", tokenizer, max_len=1 << 20)]
    ids, coverage = frequent_tokens((s.input_ids[s.loss_mask] for s in sequences), args.draft_vocab)
    log.warning("draft vocabulary: %d tokens covering %.2f%% of the %d answers' tokens", ids.numel(), 100 * coverage,
                len(sequences))
    return ids


def _load_pipeline(args: argparse.Namespace):
    """The Pipeline named by `_model_arguments`."""
    from blockdraft.api import Pipeline

    return Pipeline.load(args.target, args.drafter, device=args.device, dtype=args.dtype,
                         draft_window=args.draft_window, compile=args.compile, pack=pack_choice(args),
                         draft_vocab=not args.full_vocab_drafts)


def _decoding_options(args: argparse.Namespace) -> dict:
    """`Pipeline.stream` keywords from `_decoding_arguments`."""
    return dict(block_size=args.block_size, no_draft=args.no_draft, draft=args.draft, verify=args.verify,
                ngram=args.ngram, sampler=args.sampler, tree=args.tree)


def tree_setting(text: str) -> str | int:
    """An argparse type for --tree: off, auto or a node budget >= 1."""
    from blockdraft.decoding.engine import parse_tree
    from blockdraft.errors import InvalidArgumentError

    try:
        return parse_tree(text)
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run_info(args: argparse.Namespace) -> int:
    from blockdraft.modeling.device import default_device, parse_dtype
    from blockdraft.modeling.pair import describe_pair, drafter_summary, format_pair, target_summary
    from blockdraft.modeling.registry import resolve_target, shipped_drafter

    if args.context < 1:
        raise InvalidArgumentError(f"--context {args.context}: expected an integer >= 1")
    drafter = shipped_drafter(args.target) if args.drafter is None else args.drafter
    target = target_summary(resolve_target(args.target))
    pair = drafter_summary(drafter) if drafter is not None and str(drafter) != "none" else None
    info = describe_pair(target, pair, context=args.context, dtype=parse_dtype(args.dtype, default_device()))
    print(json.dumps(info, default=str) if args.json else format_pair(info))
    return 0 if not info["problems"] else 1


def _generate(pipe, args: argparse.Namespace, echo: bool, **overrides):
    """One `generate` request from the command line; the text goes to stdout as it comes when `echo`."""
    kwargs = dict(chat=args.chat, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                  top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=args.stop) | _decoding_options(args)
    stream = pipe.stream(args.prompt, **(kwargs | overrides))
    for delta in stream:
        if echo:
            print(delta, end="", flush=True)
    return stream.output


def comparison(fast, plain) -> dict:
    """End-to-end speeds of the same prompt decoded with speculation and plainly, and whether they agree."""
    a, b = fast.stats.tokens_per_second, plain.stats.tokens_per_second
    return {"speedup": a / b, "tokens_per_second": a, "plain_tokens_per_second": b,
            "identical": fast.token_ids == plain.token_ids,
            "common_prefix": next((i for i, (x, y) in enumerate(zip(fast.token_ids, plain.token_ids)) if x != y),
                                  min(len(fast.token_ids), len(plain.token_ids)))}


def comparison_line(c: dict, temperature: float, sampler: str = DEFAULT_SAMPLER) -> str:
    """'1.62x plain decoding (34.1 vs 21.3 tok/s), output identical'."""
    verdict = "output identical" if c["identical"] else (
        "outputs differ (the rejection sampler: the same distribution, other draws)"
        if temperature > 0 and sampler == "rejection"
        else f"outputs differ after {c['common_prefix']} tokens (a floating-point near-tie between a verify "
             "forward and a one-token step)")
    return (f"{c['speedup']:.2f}x plain decoding ({c['tokens_per_second']:.1f} vs {c['plain_tokens_per_second']:.1f} "
            f"tok/s), {verdict}")


def run_generate(args: argparse.Namespace) -> int:
    from blockdraft.modeling.memory import describe

    if args.compare and args.no_draft:
        raise InvalidArgumentError("--compare with --no-draft: expected speculation to compare with plain decoding")
    if args.compare and args.temperature > 0 and args.seed is None:
        args.seed = random.randrange(2**31)  # both runs draw with the same seed (gumbel: the same tokens)
    pipe = _load_pipeline(args)
    if args.compare:  # warm both paths up: a process's first calls pay one-off costs
        _generate(pipe, args, False, max_new_tokens=8)
        _generate(pipe, args, False, max_new_tokens=8, no_draft=True)
    out = _generate(pipe, args, not args.json)
    compared = comparison(out, _generate(pipe, args, False, no_draft=True)) if args.compare else None
    if args.json:
        print(json.dumps(out.to_dict() | ({"compare": compared} if compared else {})))
        return 0
    print()
    if args.stats:
        print(f"[stats] {out.stats.summary()}", file=sys.stderr)
        context = out.stats.prompt_tokens + out.stats.new_tokens
        print(f"[memory] {describe(pipe.memory_report(context))}", file=sys.stderr)
    if compared:
        print(comparison_line(compared, args.temperature, args.sampler), file=sys.stderr)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C, then drain: admitted requests finish (up to --drain-timeout), then close."""
    from blockdraft.serving.server import BlockdraftServer

    pipe = _load_pipeline(args)
    try:
        server = BlockdraftServer(pipe, (args.host, args.port), model_id=args.target, api_key=args.api_key,
                                  max_batch=args.max_batch, max_model_len=args.max_model_len,
                                  max_queue=args.max_queue, max_queue_wait=args.max_queue_wait,
                                  drain_timeout=args.drain_timeout, prefill_chunk=args.prefill_chunk,
                                  options=_decoding_options(args))
    except OSError as exc:
        raise BlockdraftError(f"cannot listen on {args.host}:{args.port} ({exc.strerror or exc})") from None
    if args.api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"blockdraft: WARNING: listening on {args.host} without an API key: anyone who can reach it can use "
              "it (--api-key or BLOCKDRAFT_API_KEY)", file=sys.stderr, flush=True)
    print(f"blockdraft: {server.describe()}", file=sys.stderr, flush=True)
    print(f"blockdraft: serving {args.target} at {server.url}/v1 ({args.max_batch} rows, up to {args.max_queue} "
          f"queued{', API key required' if args.api_key else ''}); Ctrl-C or SIGTERM drains and stops",
          file=sys.stderr, flush=True)
    server.serve()  # the model runs on this (the main) thread
    print("blockdraft: stopped", file=sys.stderr, flush=True)
    return 0


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    """The whole `blockdraft` command line (also what the docs' commands are checked against)."""
    parser = argparse.ArgumentParser(prog="blockdraft", description="DFlash speculative decoding")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    _info_parser(sub)
    _serve_parser(sub)
    add_training_parsers(sub)
    add_bench_parser(sub)
    add_qualify_parser(sub)
    _export_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # long jobs stop as on Ctrl-C: finished work is kept
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)  # a caller that runs main() in-process gets its handler back


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:  # from the first import on: a SIGTERM while transformers loads stops as quietly as one later
        if (extra := needed_extra(args)) is not None:
            require_extra(*extra)
        if not args.verbose:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # its per-load "Loading weights" bar; ours (tqdm) stay
        return {"generate": run_generate, "info": run_info, "data": run_data, "train": run_train,
                "bench": run_bench_command, "qualify": run_qualify, "export": run_export,
                "serve": run_serve}[args.command](args)
    except BlockdraftError as e:
        print(f"blockdraft: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

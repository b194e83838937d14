"""`blockdraft bench`: side-by-side runs on benchmark prompts (or a server sweep), JSON + Markdown + plots."""
from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path
from typing import Any

from blockdraft.bench.runner import BenchSettings, method_sampler
from blockdraft.modeling.registry import DEFAULT_TARGET, add_draft_vocab_argument, add_pack_argument, pack_choice

log = logging.getLogger(__name__)


def _list_of(convert: type, what: str, example: str):
    """An argparse type for comma-separated values."""
    def parse(text: str) -> tuple:
        try:
            return tuple(convert(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated {what}, e.g. {example}") from None
    return parse


int_list = _list_of(int, "integers", "4,8,16")


def tree_list(text: str) -> tuple[str | int, ...]:
    """An argparse type for --tree: comma-separated off / auto / node budgets."""
    from blockdraft.decoding.engine import parse_tree
    from blockdraft.errors import InvalidArgumentError

    try:
        return tuple(parse_tree(x) for x in text.split(","))
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
float_list = _list_of(float, "numbers", "0,0.7")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark DFlash against plain decoding and peer baselines")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"short id, .gguf file, local folder or hub id "
                   f"(default {DEFAULT_TARGET})")
    p.add_argument("--drafter", action="append", default=None, metavar="[LABEL=]FOLDER",
                   help="drafter folder (default: the shipped one for the target); repeat it to run every DFlash "
                        "method (and --replay) once per drafter, side by side on the same target (names get an "
                        "@LABEL suffix; LABEL defaults to the folder's name)")
    p.add_argument("--dataset", action="append", default=None,
                   help="mt-bench, humaneval, sharegpt-heldout, gsm8k, math500, mbpp or a JSONL file; repeatable "
                        "(default mt-bench)")
    p.add_argument("--local", default=None, help="local JSONL standing in for an online dataset (gsm8k/math500/mbpp)")
    p.add_argument("--max-samples", type=int, default=None, help="deterministic seeded subset per dataset")
    p.add_argument("--turns", type=int, default=2, help="turns of multi-turn prompts (MT-Bench has 2)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per answer (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (default 1.0 = off)")
    p.add_argument("--block-sizes", type=int_list, default=(), help="DFlash run-time block sizes (default: trained)")
    p.add_argument("--verify", default="adaptive",
                   help="DFlash verify modes, comma-separated: adaptive (default, as generate), fixed")
    p.add_argument("--methods", default=",".join(BenchSettings.methods),
                   help="comma-separated subset of dflash,dflash_fullvocab,dflash_ngram,dflash_hf,no_draft,hf_generate,"
                        "hf_prompt_lookup (docs/bench.md); default dflash_ngram (what generate does by default: the "
                        "drafter with looked-up drafts), no_draft, hf_generate")
    p.add_argument("--sampler", default=",".join(BenchSettings.samplers),
                   help="samplers at T > 0, comma-separated: auto (default, as generate: the runs are seeded to "
                        "repeat, but auto measures what an unseeded request gets, rejection), gumbel, rejection; "
                        "several run every DFlash method once per sampler, side by side (names get a +SAMPLER suffix)")
    p.add_argument("--tree", type=tree_list, default=BenchSettings.trees,
                   help="DFlash draft trees, comma-separated, run side by side: off (default), auto, node budgets "
                        "(e.g. off,8,32,auto; with --replay, the acceptance of each)")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10,
                   help="draft length of the hf_prompt_lookup baseline (default 10)")
    p.add_argument("--thinking", choices=("on", "off", "default"), default="default",
                   help="chat templates with an enable_thinking flag get it (recorded in the JSON)")
    p.add_argument("--batch", type=int, default=0,
                   help="also decode all first turns together, this many rows at a time (0: skip)")
    p.add_argument("--batch-rounds", type=int, default=1,
                   help="run the batched methods this many times, in reverse order every other round, and report "
                        "tokens/s over all rounds (cancels a machine's drift between methods)")
    p.add_argument("--batch-only", action="store_true",
                   help="only the batched run, per dataset (first turns): a quick tau and agreement check over "
                        "many prompts; needs --batch")
    p.add_argument("--replay", action="store_true",
                   help="only greedy acceptance per block size, by replaying each first turn's plain greedy output "
                        "through the drafter (no verify forwards; blockdraft.decoding.replay); rows: --batch (16)")
    p.add_argument("--compile", nargs="?", const="default", default=None,
                   help="torch.compile the per-layer blocks of the pair (see blockdraft.modeling.compile)")
    add_pack_argument(p)
    add_draft_vocab_argument(p)
    p.add_argument("--no-cost", action="store_true", help="skip the verify cost curve")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt subset and of sampled runs (default 0)")
    p.add_argument("--out", default="bench-results", help="folder for bench.json, bench.md and the plots")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16")
    s = p.add_argument_group("server mode (any OpenAI-compatible server)")
    s.add_argument("--base-url", default=None, help="sweep this server instead of running models here")
    s.add_argument("--baseline-url", default=None, help="a second server (e.g. plain decoding) for the speed-up column")
    s.add_argument("--model", default=None, help="model name to request (default: the server's first)")
    s.add_argument("--concurrency", type=int_list, default=(1, 2, 4, 8, 16, 32),
                   help="closed-loop client counts to sweep, comma-separated (default 1,2,4,8,16,32)")
    s.add_argument("--requests-per-level", type=int, default=None,
                   help="requests per concurrency level (default: every prompt once, at least the concurrency)")
    s.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")


def run_bench_command(args: argparse.Namespace) -> int:
    from blockdraft.bench.datasets import bench_prompts, dataset_label
    from blockdraft.errors import InvalidArgumentError

    if args.batch_only and args.batch < 1:
        raise InvalidArgumentError(f"--batch-only needs --batch ROWS >= 1, got --batch {args.batch}")
    if args.replay and args.temperature != 0:
        raise InvalidArgumentError(f"--replay measures greedy acceptance: expected --temperature 0, got {args.temperature}")
    if args.max_new_tokens < 1 or (args.max_samples is not None and args.max_samples < 1) or args.turns < 1:
        raise InvalidArgumentError(f"max_new_tokens={args.max_new_tokens}, max_samples={args.max_samples}, "
                                   f"turns={args.turns}: expected integers >= 1")
    drafters = drafter_labels(args.drafter or [])
    if args.compile and len(drafters) > 1:  # only the pipeline's own drafter would be compiled
        raise InvalidArgumentError(f"--compile with {len(drafters)} drafters: expected one drafter to compile")
    datasets = args.dataset or ["mt-bench"]
    prompts = {dataset_label(d): bench_prompts(d, args.max_samples, args.seed, args.local) for d in datasets}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = _server(args, prompts) if args.base_url else _local(args, prompts, out, drafters)
    _write(out, result)
    return 0


def _local(args: argparse.Namespace, prompts: dict[str, list], out: Path, drafters: dict[str, str]
           ) -> dict[str, Any]:
    from blockdraft.api import Pipeline
    from blockdraft.bench.report import cost_accounting, curve_context, plots, summaries
    from blockdraft.bench.runner import method_names, register_drafters, run_batched, run_bench, run_replay
    from blockdraft.decoding.costs import report_cost_curve

    kwargs = {} if args.thinking == "default" else {"enable_thinking": args.thinking == "on"}
    settings = BenchSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                             block_sizes=tuple(args.block_sizes), verify=tuple(args.verify.split(",")),
                             methods=tuple(args.methods.split(",")), samplers=tuple(args.sampler.split(",")),
                             prompt_lookup_tokens=args.prompt_lookup_tokens, turns=args.turns, seed=args.seed,
                             trees=tuple(args.tree),
                             chat_template_kwargs=kwargs)
    pipe = Pipeline.load(args.target, next(iter(drafters.values()), None), device=args.device, dtype=args.dtype,
                         compile=args.compile, pack=pack_choice(args), draft_vocab=not args.full_vocab_drafts)
    labels = register_drafters(pipe, drafters) if len(drafters) > 1 else ()
    if args.replay:
        return _header(args, pipe, prompts, [], settings) | {"summaries": {}, "replay_by_dataset": {
            d: run_replay(pipe, ps, settings, args.batch or 16) for d, ps in prompts.items()}}
    if args.batch_only:
        trained = pipe.drafter.config.block_size if pipe.drafter is not None else None
        methods = method_names(settings, trained, labels)
        result = _header(args, pipe, prompts, methods, settings) | {"summaries": {}, "batch_by_dataset": {
            d: run_batched(pipe, {d: ps}, methods, settings, args.batch, args.batch_rounds) for d, ps in prompts.items()}}
        return result
    log.warning("bench: %s", settings_line(settings))
    methods, records = run_bench(pipe, prompts, settings, drafters=labels)
    result = _header(args, pipe, prompts, methods, settings) | {
        "summaries": summaries(records, methods, compared_methods(methods, settings)),
        "records": [r.to_dict() for r in records],
    }
    result["memory"] = pipe.memory_report(max(r.prompt_tokens + r.new_tokens for r in records))
    if args.batch:
        result["batch"] = run_batched(pipe, prompts, methods, settings, args.batch, args.batch_rounds)
    blocks = [r.block_size for r in records if r.block_size > 1]
    if blocks and not args.no_cost:
        context = curve_context(records)
        # up to the largest verify that ran: a draft tree's 1 + nodes can pass the block
        curve = report_cost_curve(pipe.target, max([*blocks, *(1 + v for r in records for v in r.verified)]), context)
        result["cost"] = cost_accounting(result["summaries"]["overall"], curve, context)
    result["plots"] = [p.name for p in plots(result, out)]
    return result


def drafter_labels(values: list[str]) -> dict[str, str]:
    """--drafter values ([LABEL=]FOLDER, in order) as {label: folder}; a label defaults to the folder's name (other
    characters than letters, digits, '_', '.' and '-' become '_')."""
    from blockdraft.bench.runner import check_drafter_label
    from blockdraft.errors import InvalidArgumentError

    out: dict[str, str] = {}
    for value in values:
        label, eq, folder = value.partition("=")
        if not eq or "/" in label or Path(value).exists():  # a folder whose path holds '=' (runs/lr=3e-4/final)
            label, folder = re.sub(r"[^\w.-]", "_", Path(value.rstrip("/")).name) or "drafter", value
        if label in out:
            raise InvalidArgumentError(f"--drafter {value!r}: the label {label!r} is taken by {out[label]!r}; "
                                       "expected distinct labels (write LABEL=FOLDER)")
        out[check_drafter_label(label)] = folder
    return out


def compared_methods(methods: list[str], settings: Any) -> list[str]:
    """Methods whose output must be plain decoding's token for token: all at T = 0; at T > 0 those sampling
    with the gumbel sampler (seeded: the bench gives every method the same seed per prompt) when no_draft
    does too."""
    if settings.temperature == 0:
        return methods

    def gumbel(method: str) -> bool:  # dflash-...[+SAMPLER][@DRAFTER]
        return method_sampler(method, settings.samplers[0]) == "gumbel"

    return [m for m in methods if gumbel(m) and gumbel("no_draft") and not m.startswith("hf_")]


def settings_line(settings: Any, replay: bool = False) -> str:
    """Which settings a run measures, in words (printed at the start and kept in the Markdown)."""
    if replay:  # run_replay: no method runs, the drafters replay plain greedy continuations
        blocks = (f"block {','.join(map(str, settings.block_sizes))}" if settings.block_sizes
                  else "the drafter's trained block size")
        return (f"replay of plain greedy continuations, {settings.max_new_tokens} new tokens: the engine's greedy "
                f"acceptance at {blocks}, trees {','.join(map(str, settings.trees))}, fixed verify, "
                "no looked-up drafts")
    trees = tuple(map(str, settings.trees))
    default = (settings.verify == ("adaptive",) and "dflash_ngram" in settings.methods and "off" in trees)
    return (f"methods {','.join(settings.methods)}, verify {','.join(settings.verify)}"
            + (f", trees {','.join(trees)}" if trees != ("off",) else "") + f", T={settings.temperature:g}"
            + (f", sampler {','.join(settings.samplers)}" if settings.temperature > 0 else "") + ", "
            f"top-p {settings.top_p:g}, {settings.max_new_tokens} new tokens"
            + ("; dflash_ngram + adaptive is what `blockdraft generate` does by default" if default else
               "; not generate's default (that is --methods dflash_ngram --verify adaptive --tree off)"))


def _header(args: argparse.Namespace, pipe: Any, prompts: dict[str, list], methods: list[str],
            settings: Any) -> dict[str, Any]:
    from blockdraft.bench.report import environment

    return {"schema": "blockdraft.bench/1", "environment": environment(pipe.target.device, pipe.target.dtype),
            "config": {"target": args.target, "drafter": ",".join(args.drafter or ["default"]),
                       "compile": args.compile,
                       "untrained_drafter": pipe.untrained_drafter,
                       "datasets": {d: len(p) for d, p in prompts.items()}, "methods": methods,
                       "measures": settings_line(settings, args.replay),
                       "settings": vars(settings) | {"block_sizes": list(settings.block_sizes)}}}


def _server(args: argparse.Namespace, prompts: dict[str, list]) -> dict[str, Any]:
    from blockdraft.bench.load_client import server_sweep

    flat = [p for ps in prompts.values() for p in ps]
    kw = dict(model=args.model, max_tokens=args.max_new_tokens, temperature=args.temperature,
              requests_per_level=args.requests_per_level, api_key=args.api_key)
    result = {"schema": "blockdraft.bench.server/1", "sweep": server_sweep(args.base_url, flat, list(args.concurrency), **kw)}
    if args.baseline_url:
        result["baseline"] = server_sweep(args.baseline_url, flat, list(args.concurrency), **kw)
    return result


def _write(out: Path, result: dict[str, Any]) -> None:
    from blockdraft.files import atomic_path

    if "sweep" in result:
        from blockdraft.bench.load_client import server_table

        table = server_table(result["sweep"], result.get("baseline"))
    else:
        from blockdraft.bench.report import markdown

        table = markdown(result)
    with atomic_path(out / "bench.json") as tmp:
        tmp.write_text(json.dumps(result, indent=1))
    with atomic_path(out / "bench.md") as tmp:
        tmp.write_text(table)
    print(table)
    log.warning("wrote %s and %s", out / "bench.json", out / "bench.md")

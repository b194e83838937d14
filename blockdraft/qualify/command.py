"""`blockdraft qualify`: a deployment pilot of a target + drafter pair in one command, with a verdict."""
from __future__ import annotations

import argparse
import logging
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from blockdraft.bench.command import float_list, int_list
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.registry import DEFAULT_TARGET

log = logging.getLogger(__name__)

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str) -> int:
    """'8GiB', '512MiB', '2GB', '1000000' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise InvalidArgumentError(f"memory budget {text!r}: expected a size such as 8GiB, 512MiB or 2GB")
    return int(float(m.group(1)) * _UNITS[unit])


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("qualify", help="qualify a target + drafter pair: correctness, acceptance, work, speed, "
                                       "memory and a verdict, in one report (docs/qualify.md)")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"short id, .gguf file or folder (default {DEFAULT_TARGET})")
    p.add_argument("--drafter", default=None, help="drafter folder (default: the shipped one for the target)")
    p.add_argument("--datasets", default="mt-bench,humaneval,sharegpt-heldout",
                   help="comma-separated: mt-bench, humaneval, sharegpt-heldout, gsm8k, math500, mbpp or JSONL files "
                        "(default mt-bench,humaneval,sharegpt-heldout)")
    p.add_argument("--samples", type=int, default=4, help="prompts per dataset (default 4)")
    p.add_argument("--temperatures", type=float_list, default=(0.0, 0.7), help="comma-separated (default 0,0.7)")
    p.add_argument("--concurrency", type=int_list, default=(1, 4, 8),
                   help="server concurrencies, with and without drafting (default 1,4,8)")
    p.add_argument("--server-samples", type=int, default=2,
                   help="first prompts of each dataset the server runs send (default 2)")
    p.add_argument("--no-server", action="store_true", help="leave the server out of the speed section")
    p.add_argument("--memory-budget", default="8GiB", help="memory for the capacity figures (default 8GiB)")
    p.add_argument("--context", type=int, default=2048, help="tokens per request for the capacity figures (default 2048)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer (default 128)")
    p.add_argument("--sampler-samples", type=int, default=300,
                   help="answers per side of the sampler's statistical test (default 300)")
    p.add_argument("--seed", type=int, default=0, help="prompt sample and sampling seed (default 0)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on GPU)")
    p.add_argument("--out", required=True, help="folder for report.html, report.md, report.json and the plots")


def settings_line(s: Any) -> str:
    return (f"datasets {', '.join(s.datasets)}, {s.samples} prompts each, T = {', '.join(f'{t:g}' for t in s.temperatures)}, "
            f"{s.max_new_tokens} new tokens, verify {s.verify}"
            + (f", server at concurrency {', '.join(map(str, s.concurrency))} ({s.server_samples} prompts of each "
               "dataset)" if s.server else ", no server"))


def run_qualify(args: argparse.Namespace) -> int:
    from blockdraft.api import Pipeline
    from blockdraft.bench.datasets import bench_prompts, dataset_label
    from blockdraft.modeling.registry import resolve_target, shipped_drafter
    from blockdraft.qualify.measure import QualifySettings, Subject

    settings = QualifySettings(datasets=tuple(d for d in args.datasets.split(",") if d), samples=args.samples,
                               temperatures=tuple(args.temperatures), concurrency=tuple(args.concurrency),
                               memory_budget=parse_bytes(args.memory_budget), context=args.context,
                               max_new_tokens=args.max_new_tokens, sampler_samples=args.sampler_samples,
                               server=not args.no_server, server_samples=args.server_samples, seed=args.seed)
    if not settings.datasets:
        raise InvalidArgumentError(f"--datasets {args.datasets!r}: expected at least one dataset")
    prompts = {dataset_label(d): bench_prompts(d, settings.samples, settings.seed) for d in settings.datasets}
    drafter = args.drafter or shipped_drafter(args.target)
    if drafter is None or str(drafter) == "untrained" or not Path(drafter).is_dir():
        raise InvalidArgumentError(f"drafter {drafter!r}: expected a trained drafter folder (--drafter FOLDER; the "
                                   f"target {args.target!r} has no shipped one)" if drafter is None else
                                   f"drafter {str(drafter)!r}: expected a trained drafter folder")
    pipe = Pipeline.load(args.target, drafter, device=args.device, dtype=args.dtype)
    subject = Subject(pipe, args.target, resolve_target(args.target), None if drafter is None else str(drafter),
                      drafter_arg=args.drafter, device=args.device, dtype=args.dtype)
    report = qualify(subject, prompts, settings, Path(args.out))
    print(f"verdict: {report['mark'].upper()}: {report['verdict']}")
    print(f"report: {Path(args.out) / 'report.html'} (and report.md, report.json); {report['seconds']:.0f} s")
    return 0


def qualify(subject: Any, prompts: dict[str, list], settings: Any, out: Path, progress: bool = True) -> dict[str, Any]:
    """Measure, mark, judge and write the report; returns it."""
    import torch

    from blockdraft.bench.report import environment
    from blockdraft.bench.provenance import machine
    from blockdraft.qualify.measure import measure
    from blockdraft.qualify.render import section_dicts, write
    from blockdraft.qualify.verdict import sections, verdict

    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    figures = measure(subject, prompts, settings, out, progress)
    figures["settings"] = asdict(settings)
    marks = sections(figures)
    mark, text = verdict(figures, marks)
    env = environment(subject.pipe.target.device, subject.pipe.target.dtype)
    report = {"mark": mark, "verdict": text, "sections": section_dicts(marks), "figures": figures,
              "settings_line": settings_line(settings), "seconds": time.perf_counter() - start,
              "machine": machine(env), "environment": env, "torch_threads": torch.get_num_threads()}
    write(report, out)
    return report

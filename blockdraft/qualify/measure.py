"""The measurements of a qualification, each through the bench harness (`blockdraft.bench`), as JSON-ready figures.

    pair         both folders read and checked against each other (`blockdraft.modeling.pair`), plus the
                 drafter's own greedy acceptance (replayed over plain decoding's outputs)
    runs         per temperature: the default engine (adaptive verify, looked-up drafts) and plain decoding,
                 side by side on every prompt (`bench.runner.run_bench`)
    correctness  greedy outputs vs plain (the first divergence as text, labelled near-tie by the target's own
                 top-2 logit gap there); seeded gumbel samples vs plain sampling with the same seed; a
                 chi-square test of the default (unseeded) sampler's first tokens against plain sampling
    acceptance   tau per dataset and temperature, histogram and per-position acceptance (replay, T = 0)
    work         target tokens per committed token, drafter share, estimated FLOPs per committed token, the
                 verify cost curve, break-even tau, predicted vs measured speed-up (`bench.report`)
    speed        end-to-end single-request speed-up per dataset and temperature; optionally our server with
                 and without drafting per concurrency (`bench.servers`)
    memory       parameters and per-request caches, and how many requests fit in a memory budget
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from tqdm import tqdm

from blockdraft.api import Pipeline
from blockdraft.bench.metrics import mean_acceptance_length, pooled_histogram, pooled_per_position
from blockdraft.bench.report import cost_accounting, curve_context, summaries
from blockdraft.bench.runner import BenchSettings, Record, run_bench
from blockdraft.bench.servers import ServerSpec, run_server
from blockdraft.decoding.batch_engine import BatchEngine
from blockdraft.decoding.costs import report_cost_curve
from blockdraft.decoding.engine import DecodeOptions
from blockdraft.decoding.replay import replay_acceptance
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.export import RECORD
from blockdraft.modeling.pair import describe_pair, drafter_summary, target_summary
from blockdraft.prompts import Prompt

log = logging.getLogger(__name__)

DFLASH, PLAIN = "dflash_ngram", "no_draft"  # the default engine (adaptive verify + lookups), plain decoding
SAMPLER_PROMPT = "Count from 1 to 30, separated by commas."  # predictable: drafts get accepted several at a time


@dataclass
class QualifySettings:
    datasets: tuple[str, ...] = ("mt-bench", "humaneval", "sharegpt-heldout")
    samples: int = 4
    temperatures: tuple[float, ...] = (0.0, 0.7)
    concurrency: tuple[int, ...] = (1, 4, 8)
    memory_budget: int = 8 * 2**30
    context: int = 2048          # tokens per request for the capacity figures
    max_new_tokens: int = 128
    sampler_samples: int = 300   # per side of the sampler test
    server_samples: int = 2      # first prompts of each dataset the server runs send
    sampler_tokens: int = 4      # first tokens compared
    seeded_samples: int = 6      # prompts of the seeded-identity check
    server: bool = True
    seed: int = 0
    verify: str = "adaptive"

    def __post_init__(self) -> None:
        for name in ("samples", "max_new_tokens", "sampler_samples", "sampler_tokens", "context", "server_samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name}={value!r}: expected an integer >= 1")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise InvalidArgumentError(f"temperatures={self.temperatures!r}: expected one or more values >= 0")
        if self.server and (not self.concurrency or any(c < 1 for c in self.concurrency)):
            raise InvalidArgumentError(f"concurrency={self.concurrency!r}: expected positive integers")
        if self.memory_budget <= 0:
            raise InvalidArgumentError(f"memory_budget={self.memory_budget}: expected a positive number of bytes")


@dataclass
class Subject:
    """What is qualified: the loaded pair and where it came from."""

    pipe: Pipeline
    target_name: str
    target_folder: str
    drafter_folder: str | None
    drafter_arg: str | None = None  # as given on the command line (for the server runs)
    device: str | None = None
    dtype: str | None = None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------- pair
def pair_figures(subject: Subject, context: int) -> dict[str, Any]:
    target = target_summary(subject.target_folder)
    drafter = drafter_summary(subject.drafter_folder) if subject.drafter_folder else None
    info = describe_pair(target, drafter, context=context, dtype=subject.pipe.target.dtype)
    template = target["_tokenizer"].chat_template or ""
    info["tokenizer"] = {"chat_template": bool(template), "thinking_mode": "enable_thinking" in template,
                         "same_vocabulary": drafter is None or drafter["config"].vocab_size == target["vocab_size"]}
    info["target_name"] = subject.target_name
    info["trained_for"] = _trained_for(subject.drafter_folder)
    return _plain(info)


def _trained_for(folder: str | None) -> str | None:
    if folder is None or not (Path(folder) / "config.json").is_file():
        return None
    record = json.loads((Path(folder) / "config.json").read_text()).get(RECORD) or {}
    return record.get("target")


def _plain(value: Any) -> Any:
    """JSON-ready: tensors to lists, paths to strings, dataclasses (configs) left out."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not hasattr(v, "__dataclass_fields__")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return value


# ---------------------------------------------------------------------- runs
def runs(pipe: Pipeline, prompts: dict[str, list[Prompt]], s: QualifySettings, progress: bool
         ) -> dict[float, tuple[list[str], list[Record]]]:
    """Per temperature: the default engine and plain decoding on every prompt's first turn, side by side."""
    out = {}
    for t in s.temperatures:
        settings = BenchSettings(max_new_tokens=s.max_new_tokens, temperature=t, methods=(DFLASH, PLAIN),
                                 verify=(s.verify,), turns=1, seed=s.seed)
        log.info("qualify: the default engine and plain decoding at T=%g", t)
        out[t] = run_bench(pipe, prompts, settings, progress)
    return out


def _by(records: list[Record], method_prefix: str) -> dict[tuple[str, str], Record]:
    return {(r.dataset, r.prompt_id): r for r in records if r.method.startswith(method_prefix)}


# ---------------------------------------------------------------------- correctness
def tie_threshold(dtype: torch.dtype) -> float:
    """Top-2 logit gap under which a divergence counts as a near-tie: fp32 rounding between a verify
    forward and a one-token step moves logits by ~1e-5..1e-4; bf16 / fp16 by ~1e-2."""
    return 1e-3 if dtype in (torch.float32, torch.float64) else 0.1


@torch.inference_mode()
def logit_gap(pipe: Pipeline, ids: list[int]) -> float:
    """The target's top-2 logit gap for the token after `ids` (plain forward, its own cache)."""
    target = pipe.target
    logits, _ = target.forward(torch.tensor([ids], device=target.device), target.new_cache(), 0, features=False,
                               last_only=True)
    top = logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def greedy_identity(pipe: Pipeline, records: list[Record], encoded: dict[tuple[str, str], list[int]]
                    ) -> dict[str, Any]:
    ours, plain = _by(records, "dflash"), _by(records, PLAIN)
    threshold = tie_threshold(pipe.target.dtype)
    divergences = []
    for key, rec in ours.items():
        ref = plain[key].token_ids
        if rec.token_ids == ref:
            continue
        i = next((k for k, (a, b) in enumerate(zip(rec.token_ids, ref)) if a != b), min(len(ref), len(rec.token_ids)))
        gap = logit_gap(pipe, encoded[key] + ref[:i])
        decode = pipe.tokenizer.decode
        divergences.append({"dataset": key[0], "prompt_id": key[1], "position": i, "logit_gap": gap,
                            "near_tie": gap < threshold, "tie_threshold": threshold,
                            "context": decode(ref[max(0, i - 12):i]), "ours": decode(rec.token_ids[i:i + 16]),
                            "plain": decode(ref[i:i + 16])})
    return {"compared": len(ours), "identical": len(ours) - len(divergences), "divergences": divergences}


def seeded_identity(pipe: Pipeline, prompts: dict[str, list[Prompt]], s: QualifySettings, progress: bool
                    ) -> dict[str, Any] | None:
    """Seeded requests (the gumbel sampler: plain decoding's tokens for a seed) vs plain sampling, same seeds."""
    hot = [t for t in s.temperatures if t > 0]
    if not hot:
        return None
    subset = _first(prompts, s.seeded_samples)
    settings = BenchSettings(max_new_tokens=min(64, s.max_new_tokens), temperature=hot[0], methods=(DFLASH, PLAIN),
                             verify=(s.verify,), samplers=("gumbel",), turns=1, seed=s.seed + 1)
    _, records = run_bench(pipe, subset, settings, progress)
    ours, plain = _by(records, "dflash"), _by(records, PLAIN)
    same = sum(ours[k].token_ids == plain[k].token_ids for k in ours)
    return {"temperature": hot[0], "compared": len(ours), "identical": same, "max_new_tokens": settings.max_new_tokens}


def _first(prompts: dict[str, list[Prompt]], n: int) -> dict[str, list[Prompt]]:
    """n prompts in all, taken in turn from each dataset."""
    picked: dict[str, list[Prompt]] = {d: [] for d in prompts}
    for i in range(max((len(v) for v in prompts.values()), default=0)):
        for d, ps in prompts.items():
            if sum(map(len, picked.values())) < n and i < len(ps):
                picked[d].append(ps[i])
    return {d: ps for d, ps in picked.items() if ps}


def chi_square_two_sample(a: Counter, b: Counter, least: float = 5.0) -> tuple[float, int, int]:
    """(statistic, degrees of freedom, categories) of the chi-square test that two samples share a
    distribution; categories expected fewer than `least` times on either side are pooled into one."""
    na, nb = sum(a.values()), sum(b.values())
    keys = set(a) | set(b)
    big = [k for k in keys if min((a[k] + b[k]) * na, (a[k] + b[k]) * nb) / (na + nb) >= least]
    cells = [(a[k], b[k]) for k in big]
    rest = (sum(a[k] for k in keys - set(big)), sum(b[k] for k in keys - set(big)))
    if sum(rest):
        cells.append(rest)
    stat = 0.0
    for x, y in cells:
        total = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            stat += (observed - expected) ** 2 / expected if expected else 0.0
    return stat, max(len(cells) - 1, 0), len(cells)


def chi_square_pvalue(stat: float, dof: int) -> float:
    """P(chi2_dof >= stat): the regularised upper incomplete gamma function Q(dof / 2, stat / 2)."""
    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def sampler_test(pipe: Pipeline, s: QualifySettings) -> dict[str, Any] | None:
    """The default sampler for an unseeded request (the rejection rule), drafting with fixed verify so the
    drafts are really verified, against plain sampling: the first `sampler_tokens` tokens of
    `sampler_samples` answers each to one predictable prompt, compared as joint outcomes."""
    hot = [t for t in s.temperatures if t > 0]
    if not hot or pipe.drafter is None:
        return None
    ids = pipe.encode(chat=SAMPLER_PROMPT)
    stops = pipe.stop_token_ids()
    counts, committed = {}, []
    for name, no_draft in (("dflash", False), ("plain", True)):
        # speculative answers run one whole block past the prefill's token, so the first cycle verifies every
        # draft (a shorter limit would cap the drafts); plain ones need only the compared tokens
        length = s.sampler_tokens if no_draft else max(s.sampler_tokens, pipe.drafter.config.block_size + 1)
        options = [DecodeOptions(max_new_tokens=length, no_draft=no_draft, stop_token_ids=stops,
                                 sampling=SamplingParams(hot[0], 0, 1.0, s.seed * 7919 + i + (0 if no_draft else 10**6),
                                                         sampler="rejection"), verify="fixed")
                   for i in range(s.sampler_samples)]
        counts[name] = Counter()
        for _, tokens, stats in tqdm(BatchEngine(pipe.engine, 16).run([ids] * s.sampler_samples, options),
                                     total=s.sampler_samples, desc=f"sampler test ({name})", unit="sample",
                                     dynamic_ncols=True):
            counts[name][tuple(tokens[: s.sampler_tokens])] += 1
            committed += stats.acceptance_lengths if not no_draft else []
    stat, dof, cells = chi_square_two_sample(counts["dflash"], counts["plain"])
    return {"sampler": "rejection (the default without a seed)", "temperature": hot[0], "prompt": SAMPLER_PROMPT,
            "samples": s.sampler_samples, "tokens": s.sampler_tokens, "categories": cells, "chi_square": stat,
            "dof": dof, "p_value": chi_square_pvalue(stat, dof),
            "mean_committed_per_cycle": sum(committed) / len(committed) if committed else 0.0,
            "cycles_with_2_or_more_accepted": sum(n >= 3 for n in committed)}


# ---------------------------------------------------------------------- acceptance
def replay_tau(pipe: Pipeline, records: list[Record], encoded: dict[tuple[str, str], list[int]]
               ) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Per dataset, per prompt: the drafter's own (acceptance lengths, drafts verified) per cycle at its trained
    block size, fixed verify, replayed over plain decoding's greedy outputs (what the drafter alone commits:
    no lookups, no policy)."""
    block = pipe.drafter.config.block_size
    out: dict[str, list[tuple[list[int], list[int]]]] = {}
    for key, rec in _by(records, PLAIN).items():
        if rec.token_ids:
            options = DecodeOptions(max_new_tokens=len(rec.token_ids) + 1, block_size=block,
                                    stop_token_ids=pipe.stop_token_ids())
            drafted: list[int] = []
            lengths = replay_acceptance(pipe.engine, encoded[key], rec.token_ids, options, drafted)
            out.setdefault(key[0], []).append((lengths, drafted))
    return out


def cost_curve(pipe: Pipeline, results: dict[float, tuple[list[str], list[Record]]]
               ) -> tuple[int, dict[int, float]]:
    """The verify cost curve at the median context of the lowest temperature's default-engine runs."""
    ours = [r for r in results[min(results)][1] if r.method.startswith("dflash")]
    context = curve_context(ours)
    return context, report_cost_curve(pipe.target, pipe.drafter.config.block_size, context)


def acceptance_figures(pipe: Pipeline, results: dict[float, tuple[list[str], list[Record]]],
                       replay: dict[str, list[tuple[list[int], list[int]]]], curve: tuple[int, dict[int, float]]
                       ) -> dict[str, Any]:
    """Per dataset and temperature: tau three ways, and the break-even tau of that row's own cycles (a verify of
    its mean length plus its drafter's seconds per cycle: a row whose policy verifies little needs little)."""
    block = pipe.drafter.config.block_size
    rows = []
    for t, (methods, records) in results.items():
        table = summaries(records, methods)
        for dataset, by_method in table.items():
            name, row = next((m, v) for m, v in by_method.items() if m.startswith("dflash"))
            own = [lengths for lengths, _ in (replay.get(dataset, []) if dataset != "overall"
                                              else [x for v in replay.values() for x in v])]
            cost = cost_accounting({name: row}, curve[1], curve[0])["methods"].get(name, {})
            rows.append({"dataset": dataset, "temperature": t, "tau": row.get("mean_acceptance_length"),
                         "tau_drafter_cycles": row.get("drafter_mean_acceptance_length"),
                         "tau_own": mean_acceptance_length(own) if t == 0 and own else None,
                         "break_even_tau": cost.get("break_even_acceptance"), "verify_tokens": cost.get("verify_tokens"),
                         "lookup_cycles": row.get("lookup_cycles", 0), "cycles": row.get("cycles", 0)})
    pooled = [x for v in replay.values() for x in v]
    return {"block_size": block, "rows": rows,
            "histogram": pooled_histogram([lengths for lengths, _ in pooled], block),
            "per_position": pooled_per_position([lengths for lengths, _ in pooled], [d for _, d in pooled], block)}


# ---------------------------------------------------------------------- work
def flops_per_token(pipe: Pipeline, pair: dict[str, Any]) -> tuple[float, float]:
    """(target per token, drafter per drafted slot) FLOPs, estimated as 2 x the weights a token multiplies
    (from the checkpoints' parameter counts): the target's layers and LM head, not its embedding lookup; the
    drafter's layers and fc, and the rows of the head it scores drafts with. Attention over the context is
    left out of both."""
    t = pair["target"]
    embedding = t["vocab_size"] * t["hidden_size"]
    params = t["parameters"] or sum(p.numel() for p in pipe.target.model.parameters())  # a hub id: no local files
    target = params if t["tie_word_embeddings"] else params - embedding  # a tied head is the embedding's matrix
    rows = pipe.engine.draft_ids.numel() if pipe.engine.draft_ids is not None else t["vocab_size"]
    drafter = (pair.get("drafter") or {}).get("parameters") or 0
    return 2.0 * target, 2.0 * (drafter + rows * t["hidden_size"])


def work_figures(pipe: Pipeline, results: dict[float, tuple[list[str], list[Record]]], pair: dict[str, Any],
                 curve_at: tuple[int, dict[int, float]]) -> dict[str, Any]:
    t0 = min(results)
    methods, records = results[t0]
    overall = summaries(records, methods)["overall"]
    name = next(m for m in overall if m.startswith("dflash"))
    row = overall[name]
    ours = [r for r in records if r.method == name]
    context, curve = curve_at
    cost = cost_accounting(overall, curve, context)["methods"].get(name, {})
    target_flops, slot_flops = flops_per_token(pipe, pair)
    drafted_slots = sum(d for r in ours for d, src in zip(r.drafted, r.sources) if not src)
    drafter_cycles = sum(1 for r in ours for src in r.sources if not src)
    committed = row.get("cycle_tokens", 0)
    # every decode cycle: 1 + its drafts through the target (a plain step: 1), per token it committed
    processed = sum(d + 1 for r in ours for d in r.verified) + row.get("plain_cycles", 0)
    per_committed = processed / committed if committed else 1.0
    flops = target_flops * per_committed + (slot_flops * (drafted_slots + drafter_cycles) / committed if committed else 0.0)
    return {"temperature": t0, "context_tokens": context, "verify_cost_s": {str(q): c for q, c in curve.items()},
            "break_even_tau": cost.get("break_even_acceptance"), "verify_tokens": cost.get("verify_tokens"),
            "predicted_speedup": cost.get("predicted_speedup"), "measured_speedup": row["speedup"].get(PLAIN),
            "target_tokens_per_committed": per_committed,
            "drafter_share_of_decode": row.get("drafter_share_of_decode"),
            "flops_per_committed_token": flops, "plain_flops_per_token": target_flops,
            "flops_ratio": flops / target_flops, "plain_cycles": row.get("plain_cycles"), "cycles": row.get("cycles")}


# ---------------------------------------------------------------------- speed
def single_speed(results: dict[float, tuple[list[str], list[Record]]]) -> list[dict[str, Any]]:
    """End to end: all new tokens over all wall time, prefill included, per dataset and temperature."""
    rows = []
    for t, (methods, records) in results.items():
        for dataset, by_method in summaries(records, methods).items():
            name = next(m for m in by_method if m.startswith("dflash"))
            ours, plain = by_method[name], by_method[PLAIN]
            rows.append({"dataset": dataset, "temperature": t, "speedup": ours["speedup"][PLAIN],
                         "tokens_per_s": ours["tokens_per_second"], "plain_tokens_per_s": plain["tokens_per_second"],
                         "seconds_per_response": ours["seconds"] / ours["generations"],
                         "plain_seconds_per_response": plain["seconds"] / plain["generations"],
                         "ttft_ms": ours["ttft_ms_median"], "plain_ttft_ms": plain["ttft_ms_median"]})
    return rows


def server_speed(subject: Subject, prompts: list[Prompt], s: QualifySettings, out: Path) -> list[dict[str, Any]]:
    """Our server with and without drafting, one at a time in ABBA order (plain, ours, ours, plain), closed loop
    per concurrency; throughput and p95 latency are the means of the two runs, errors their sum."""
    base = [sys.executable, "-c", "import sys; from blockdraft.cli import main; sys.exit(main())", "serve",
            "--port", "{port}", "--target", subject.target_name]
    if subject.drafter_arg:
        base += ["--drafter", subject.drafter_arg]
    for flag, value in (("--device", subject.device), ("--dtype", subject.dtype)):
        if value:
            base += [flag, value]
    specs = [ServerSpec("plain", base + ["--no-draft"], tuple(s.concurrency)),
             ServerSpec("dflash", base, tuple(s.concurrency))]
    runs: dict[str, list[dict[int, dict[str, Any]]]] = {"plain": [], "dflash": []}
    for spec in specs + specs[::-1]:  # ABBA: a machine whose speed drifts biases neither
        result = run_server(spec, 0, prompts, s.max_new_tokens, out / f"server-{spec.name}.log")
        runs[spec.name].append({lv["concurrency"]: lv for lv in result["levels"]})
    levels = {name: {c: _mean_level([r[c] for r in rounds]) for c in s.concurrency} for name, rounds in runs.items()}
    rows = []
    for c in s.concurrency:
        ours, plain = levels["dflash"][c], levels["plain"][c]
        a, b = ours["output_tokens_per_s"], plain["output_tokens_per_s"]
        rows.append({"concurrency": c, "tokens_per_s": a, "plain_tokens_per_s": b,
                     "speedup": a / b if a and b else None, "latency_p95_s": ours["latency_p95_s"],
                     "plain_latency_p95_s": plain["latency_p95_s"], "errors": ours["errors"] + plain["errors"],
                     "requests": ours["requests"] + plain["requests"]})
    return rows


def _mean_level(levels: list[dict[str, Any]]) -> dict[str, Any]:
    def mean_of(key: str) -> float | None:
        values = [lv[key] for lv in levels if lv.get(key) is not None]
        return sum(values) / len(values) if values else None

    return {"output_tokens_per_s": mean_of("output_tokens_per_s"), "latency_p95_s": mean_of("latency_p95_s"),
            "errors": sum(lv["errors"] for lv in levels), "requests": sum(lv["requests"] for lv in levels)}


# ---------------------------------------------------------------------- memory
def memory_figures(pipe: Pipeline, s: QualifySettings) -> dict[str, Any]:
    report = pipe.memory_report(s.context)
    fixed = report["target_parameters_bytes"]
    per_request = report["target_kv_bytes"]
    drafter_fixed = report.get("drafter_parameters_bytes", 0)
    drafter_request = report.get("drafter_cache_bytes", 0)
    fit = lambda free, each: max(0, math.floor(free / each)) if each else 0  # noqa: E731
    return {**report, "budget_bytes": s.memory_budget,
            "per_request_bytes_without_drafter": per_request,
            "per_request_bytes_with_drafter": per_request + drafter_request,
            "fit_without_drafter": fit(s.memory_budget - fixed, per_request),
            "fit_with_drafter": fit(s.memory_budget - fixed - drafter_fixed, per_request + drafter_request)}


# ---------------------------------------------------------------------- all of it
def measure(subject: Subject, prompts: dict[str, list[Prompt]], s: QualifySettings, out: Path,
            progress: bool = True) -> dict[str, Any]:
    pipe = subject.pipe
    encoded = {(d, p.id): pipe.encode(messages=p.messages) for d, ps in prompts.items() for p in ps}
    clock = _Stages()
    fig: dict[str, Any] = {"pair": pair_figures(subject, s.context)}
    with clock("runs"):
        results = runs(pipe, prompts, s, progress)
    greedy_records = results.get(0.0, (None, []))[1]
    with clock("replay"):
        replay = replay_tau(pipe, greedy_records, encoded) if greedy_records else {}
        curve = cost_curve(pipe, results)
    fig["acceptance"] = acceptance_figures(pipe, results, replay, curve)
    pooled = [lengths for v in replay.values() for lengths, _ in v]
    fig["pair"]["greedy_tau_own"] = mean_acceptance_length(pooled) if pooled else None
    with clock("greedy check"):
        greedy = greedy_identity(pipe, greedy_records, encoded) if greedy_records else \
            {"compared": 0, "identical": 0, "divergences": []}
    with clock("seeded check"):
        seeded = seeded_identity(pipe, prompts, s, progress)
    with clock("sampler test"):
        fig["correctness"] = {"greedy": greedy, "seeded": seeded, "sampler_test": sampler_test(pipe, s)}
    fig["work"] = work_figures(pipe, results, fig["pair"], curve)
    fig["speed"] = {"single": single_speed(results), "server": None}
    if s.server:
        with clock("server"):
            fig["speed"]["server"] = server_speed(subject, [p for ps in prompts.values() for p in ps[:s.server_samples]],
                                                  s, out)
    fig["memory"] = memory_figures(pipe, s)
    fig["notes"] = subject.notes
    fig["stage_seconds"] = clock.seconds
    return fig


class _Stages:
    """Seconds per stage of a qualification (`with clock("name"): ...`), for the report's run line."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 1)

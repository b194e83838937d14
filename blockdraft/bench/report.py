"""From runner records to the benchmark's outputs: summaries, cost accounting, JSON, Markdown, plots.

Per (dataset, method) and overall: acceptance length (per cycle, bonus included, averaged per prompt then
over prompts), its pooled histogram and per-position rates, TTFT, time per output token, tokens/s
(all new tokens over all wall time), speed-ups over every baseline, greedy agreement with our plain
decoding, target tokens processed per committed token and the drafter's share of decode time. The cost
section puts the measured verify cost curve next to each DFlash method: break-even acceptance length and
predicted vs measured speed-up.
"""
from __future__ import annotations

import os
import platform
from collections import Counter, defaultdict
from importlib import metadata
from pathlib import Path
from statistics import mean, median
from typing import Any, Collection

import torch

from blockdraft.bench.metrics import (
    break_even_acceptance,
    mean_acceptance_length,
    pooled_histogram,
    pooled_per_position,
    predicted_speedup,
    speedup,
    target_tokens_per_committed,
)
from blockdraft.bench.provenance import git_provenance
from blockdraft.bench.runner import Record
from blockdraft.files import atomic_path

SCHEMA = "blockdraft.bench/1"
BASELINES = ("no_draft", "hf_generate")
OVERALL = "overall"


def _per_prompt(records: list[Record], attr: str) -> list[list[int]]:
    """Concatenate a per-cycle list over the turns of each prompt (a prompt counts once)."""
    by_prompt: dict[str, list[int]] = defaultdict(list)
    for r in records:
        by_prompt[f"{r.dataset}/{r.prompt_id}"].extend(getattr(r, attr))
    return list(by_prompt.values())


def summarize(records: list[Record], reference: dict[tuple, list[int]] | None = None) -> dict[str, Any]:
    """Metrics of one method's records (one dataset or all). reference: greedy no_draft outputs by key."""
    tokens = sum(r.new_tokens for r in records)
    seconds = sum(r.total_s for r in records)
    decode_s = sum(r.total_s - r.ttft_s for r in records)
    out: dict[str, Any] = {
        "generations": len(records), "new_tokens": tokens, "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds else 0.0,
        "ttft_ms_mean": 1000 * mean(r.ttft_s for r in records),
        "ttft_ms_median": 1000 * median(r.ttft_s for r in records),
        "tpot_ms": 1000 * decode_s / max(sum(r.new_tokens - 1 for r in records), 1),
    }
    lengths, drafted = _per_prompt(records, "acceptance_lengths"), _per_prompt(records, "drafted")
    verified = _per_prompt(records, "verified")  # what the target verified: a tree's nodes, not its depth
    block = max(r.block_size for r in records)
    if block > 1:
        cycles = sum(len(x) for x in lengths)
        out.update({
            "block_size": block, "cycles": cycles,
            "mean_acceptance_length": mean_acceptance_length(lengths),
            "acceptance_histogram": pooled_histogram(lengths, block),
            "per_position_acceptance": pooled_per_position(lengths, drafted, block),
            "target_tokens_per_committed": target_tokens_per_committed(lengths, verified),
            "mean_verify_tokens": sum(d + 1 for ds in verified for d in ds) / cycles if cycles else 0.0,
            "drafter_share_of_decode": sum(r.drafter_s for r in records) / decode_s if decode_s else 0.0,
            "drafter_s_per_cycle": sum(r.drafter_s for r in records) / cycles if cycles else 0.0,
            "drafter_s": sum(r.drafter_s for r in records),
            "verify_counts": {str(q): n for q, n in sorted(Counter(d + 1 for ds in verified for d in ds).items())},
            # decode cycles that verified no draft: the prefill is one target forward, every cycle one more
            "plain_cycles": sum(max(0, r.target_forwards - 1 - len(r.drafted)) for r in records),
        })
        out["cycle_tokens"] = sum(sum(x) for x in lengths) + out["plain_cycles"]  # committed by decode cycles
        if any(r.sources for r in records):  # looked-up drafts: the drafter's own cycles apart
            own = [n for r in records for n, src in zip(r.acceptance_lengths, r.sources) if not src]
            out["lookup_cycles"] = sum(1 for r in records for src in r.sources if src)
            out["drafter_mean_acceptance_length"] = sum(own) / len(own) if own else None
    if reference is not None:
        keys = [(r.dataset, r.prompt_id, r.turn) for r in records]
        same = sum(1 for r, k in zip(records, keys) if k in reference and reference[k] == r.token_ids)
        out["identical_to_no_draft"] = same
        out["compared"] = sum(1 for k in keys if k in reference)
    return out


def summaries(records: list[Record], methods: list[str], compared: Collection[str] = ()
              ) -> dict[str, dict[str, dict[str, Any]]]:
    """{dataset or 'overall': {method: summary}}, with speed-ups over each baseline filled in; the `compared`
    methods also count the generations identical to no_draft's, token for token (greedy runs; seeded gumbel
    sampling)."""
    reference = {(r.dataset, r.prompt_id, r.turn): r.token_ids for r in records if r.method == "no_draft"}
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        groups[r.dataset].append(r)
    groups[OVERALL] = list(records)
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for name, recs in groups.items():
        table = {m: summarize([r for r in recs if r.method == m], reference if m in compared else None)
                 for m in methods if any(r.method == m for r in recs)}
        for m, row in table.items():
            row["speedup"] = {b: speedup(row["tokens_per_second"], table[b]["tokens_per_second"])
                              for b in BASELINES if b in table}
        result[name] = table
    return result


def curve_context(records: list[Record]) -> int:
    """The context length a run's verify cost curve is measured at: the median of the records' prompt plus
    half their answer (a verify's typical position)."""
    return int(median(r.prompt_tokens + r.new_tokens // 2 for r in records))


def cost_accounting(overall: dict[str, dict[str, Any]], curve: dict[int, float], context: int) -> dict[str, Any]:
    """Break-even acceptance and predicted vs measured speed-up of each DFlash method (vs no_draft); the
    prediction prices the cycles the method actually ran, plain steps included, by the cost curve."""
    rows: dict[str, Any] = {}
    for m, row in overall.items():
        if row.get("block_size", 1) <= 1 or row.get("mean_acceptance_length") is None:
            continue
        b = min(max(round(row["mean_verify_tokens"]), 1), max(curve))  # the adaptive length varies: its mean
        d = row["drafter_s_per_cycle"]
        rows[m] = {"verify_tokens": b, "break_even_acceptance": break_even_acceptance(curve, b, d),
                   "predicted_speedup": _predicted(curve, row),
                   "measured_speedup": row["speedup"].get("no_draft"),
                   "target_tokens_per_committed": row["target_tokens_per_committed"],
                   "drafter_share_of_decode": row["drafter_share_of_decode"]}
    return {"context_tokens": context, "verify_cost_s": {str(q): s for q, s in curve.items()},
            "verify_cost_ratio": {str(q): s / curve[1] for q, s in curve.items()}, "methods": rows}


def _predicted(curve: dict[int, float], row: dict[str, Any]) -> float:
    """The cost curve's prediction for the cycles a method's summary counts (speculative and plain)."""
    counts = {int(q): n for q, n in row["verify_counts"].items()}
    return predicted_speedup(curve, counts, row["plain_cycles"], row["drafter_s"], row["cycle_tokens"])


# ------------------------------------------------------------------ environment
def environment(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    return {
        "packages": {p: version(p) for p in ("blockdraft", "torch", "transformers", "tokenizers", "safetensors")},
        "python": platform.python_version(), "platform": platform.platform(), "processor": platform.processor(),
        "cpu_model": _cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).replace("torch.", ""), **git_provenance(),
    }


def _cpu_model() -> str | None:
    """The CPU's marketing name (Linux), e.g. 'AMD EPYC 7B13'."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


# ------------------------------------------------------------------ Markdown
def _f(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _batch_lines(title: str, batch: dict[str, dict[str, Any]]) -> list[str]:
    base = batch.get("no_draft", {}).get("tokens_per_second")
    first = next(iter(batch.values()))
    rows, rounds = first["rows"], len(first.get("rounds_tokens_per_second", [0]))
    lines = ["", f"Batched ({rows} rows, {title}, continuous batching"
             + (f", {rounds} interleaved rounds" if rounds > 1 else "") + "):", "",
             "| method | total tok/s | x no_draft | tau | identical |", "|---|---|---|---|---|"]
    for m, b in batch.items():
        same = f"{b['identical_to_no_draft']}/{b['requests']}" if "identical_to_no_draft" in b else "-"
        lines.append(f"| {m} | {b['tokens_per_second']:.1f} | {_f(speedup(b['tokens_per_second'], base) if base else None)} "
                     f"| {_f(b['mean_acceptance_length'])} | {same} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    measures = result.get("config", {}).get("measures")
    lines = [f"Settings: {measures}.", ""] if measures else []
    lines += ["| dataset | method | tau | tok/s | TTFT ms | TPOT ms | x no_draft | x hf_generate | identical |",
             "|---|---|---|---|---|---|---|---|---|"] if result["summaries"] else []
    for dataset, table in result["summaries"].items():
        for m, row in table.items():
            same = f"{row['identical_to_no_draft']}/{row['compared']}" if "compared" in row else "-"
            lines.append(f"| {dataset} | {m} | {_f(row.get('mean_acceptance_length'))} | "
                         f"{row['tokens_per_second']:.1f} | {row['ttft_ms_median']:.0f} | {row['tpot_ms']:.1f} | "
                         f"{_f(row['speedup'].get('no_draft'))} | {_f(row['speedup'].get('hf_generate'))} | {same} |")
    looked = [(d, m, row) for d, table in result["summaries"].items() for m, row in table.items()
              if row.get("lookup_cycles")]
    if looked:
        lines += ["", "Looked-up drafts (tau above counts every cycle):", ""]
        lines += [f"- {d} / {m}: {row['lookup_cycles']} of {row['cycles']} cycles looked up; the drafter's own "
                  f"tau {_f(row['drafter_mean_acceptance_length'])}" for d, m, row in looked]
    if result.get("batch"):
        lines += _batch_lines("first turns", result["batch"])
    for dataset, batch in result.get("batch_by_dataset", {}).items():
        lines += _batch_lines(dataset, batch)
    replays = result.get("replay_by_dataset", {})
    if replays:
        lines += ["", "Greedy acceptance length by replay (first turns):", "",
                  "| dataset | prompts | new tokens | " + " | ".join(next(iter(replays.values()))["mean_acceptance_length"]) + " |",
                  "|---|---|---|" + "---|" * len(next(iter(replays.values()))["mean_acceptance_length"])]
        for dataset, r in replays.items():
            lines.append(f"| {dataset} | {r['requests']} | {r['new_tokens']} | " +
                         " | ".join(_f(t) for t in r["mean_acceptance_length"].values()) + " |")
    cost = result.get("cost")
    if cost and cost["methods"]:
        ratio = cost["verify_cost_ratio"]
        lines += ["", f"Verify cost at context {cost['context_tokens']} (c(q)/c(1)): " +
                  ", ".join(f"q={q}: {r:.2f}" for q, r in ratio.items()), "",
                  "| method | verify tokens | break-even tau | tau | predicted x | measured x | target tok / committed | drafter share |",
                  "|---|---|---|---|---|---|---|---|"]
        overall = result["summaries"][OVERALL]
        for m, c in cost["methods"].items():
            lines.append(f"| {m} | {c['verify_tokens']} | {c['break_even_acceptance']:.2f} | "
                         f"{_f(overall[m]['mean_acceptance_length'])} | {c['predicted_speedup']:.2f} | "
                         f"{_f(c['measured_speedup'])} | {c['target_tokens_per_committed']:.2f} | "
                         f"{100 * c['drafter_share_of_decode']:.0f}% |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ plots
def plots(result: dict[str, Any], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    overall = result["summaries"][OVERALL]
    dflash = {m: r for m, r in overall.items() if r.get("block_size", 1) > 1}
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for m, r in dflash.items():
        ax.plot(range(1, len(r["acceptance_histogram"]) + 1), r["acceptance_histogram"], marker="o", label=m)
    ax.set(xlabel="tokens committed per cycle", ylabel="share of cycles", title="Acceptance length histogram")
    paths.append(_save(fig, ax, folder / "acceptance_histogram.png", bool(dflash)))

    fig, ax = plt.subplots(figsize=(6, 4))
    for m, r in dflash.items():
        rates = r["per_position_acceptance"]
        ax.plot(range(1, len(rates) + 1), [float("nan") if x is None else x for x in rates], marker="o", label=m)
    ax.set(xlabel="draft position", ylabel="accepted | proposed", title="Per-position acceptance", ylim=(0, 1.05))
    paths.append(_save(fig, ax, folder / "per_position_acceptance.png", bool(dflash)))

    fig, ax = plt.subplots(figsize=(7, 4))
    datasets = [d for d in result["summaries"] if d != OVERALL] + [OVERALL]
    methods = [m for m in overall if m != "no_draft"]
    width = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        ys = [result["summaries"][d].get(m, {}).get("speedup", {}).get("no_draft") or 0 for d in datasets]
        ax.bar([x + i * width for x in range(len(datasets))], ys, width, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(datasets))], datasets)
    ax.set(ylabel="tokens/s over no_draft", title="Speed-up per dataset")
    paths.append(_save(fig, ax, folder / "speedup.png", bool(methods)))

    cost = result.get("cost")
    fig, ax = plt.subplots(figsize=(6, 4))
    if cost:
        qs = [int(q) for q in cost["verify_cost_ratio"]]
        ax.plot(qs, list(cost["verify_cost_ratio"].values()), marker="o", label="c(q)/c(1): break-even tau, free drafter")
        for m, c in cost["methods"].items():
            ax.axhline(c["break_even_acceptance"], ls="--", lw=0.8, label=f"{m} break-even {c['break_even_acceptance']:.2f}")
            tau = overall[m]["mean_acceptance_length"]
            ax.scatter([c["verify_tokens"]], [tau], marker="*", s=120, zorder=3, label=f"{m} measured tau {tau:.2f}")
        ax.set(xlabel="tokens verified per cycle (q)", ylabel="cost relative to one decode step",
               title=f"Verify cost curve (context {cost['context_tokens']})")
    paths.append(_save(fig, ax, folder / "verify_cost.png", bool(cost)))
    return paths


def _save(fig: Any, ax: Any, path: Path, has_data: bool) -> Path:
    import matplotlib.pyplot as plt

    if has_data:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no data (no DFlash method in this run)", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path

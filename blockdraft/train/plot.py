"""Training curves from a run's metrics.jsonl, drawn to PNG, and its evaluations as a Markdown table; for runs that
continue one another (a campaign's stages), the engine's acceptance against the response tokens trained on."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blockdraft.errors import InvalidArgumentError
from blockdraft.files import atomic_path
from blockdraft.modeling.registry import load_tokenizer
from blockdraft.train.data import load_sequences


SMOOTH = 20  # log rows in the running mean drawn over noisy curves


def running_mean(values: list[float], n: int) -> list[float]:
    """Means of each window of `n` consecutive values (len(values) - n + 1 of them; a NaN spoils only its own
    windows)."""
    return [sum(values[i:i + n]) / n for i in range(len(values) - n + 1)]


def eval_table(run: str | Path) -> str:
    """The run's engine evaluations as Markdown: step, epoch, acceptance length, and the mean training loss of
    the log rows since the previous evaluation."""
    rows = _rows(Path(run))
    lines = ["| step | epoch | held-out acceptance length | mean loss since the previous eval |", "|---|---|---|---|"]
    epoch, losses = 0.0, []
    for r in rows:
        if "loss" in r:
            epoch = r.get("epoch", epoch)
            losses.append(r["loss"])
        elif "eval_acceptance_length" in r:
            loss = f"{sum(losses) / len(losses):.3f}" if losses else "-"
            lines.append(f"| {r['step']:,} | {epoch:.2f} | {r['eval_acceptance_length']:.3f} "
                         f"({r.get('eval_prompts', '?')} prompts) | {loss} |")
            losses = []
    return "\n".join(lines)


def _rows(run: Path) -> list[dict]:
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise InvalidArgumentError(f"{run}: no metrics.jsonl; expected a training run folder")
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def plot_run(run: str | Path, path: str | Path | None = None) -> Path:
    """Loss, estimated and engine-measured acceptance length, per-slot accuracy -> `run/curves.png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(run)
    rows = _rows(run)
    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "eval_acceptance_length" in r]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    steps = [r["step"] for r in train]
    for ax, key, label in ((axes[0], "loss", None), (axes[1], "tau_estimate", "estimate (train blocks)")):
        values = [r[key] for r in train]
        line, = ax.plot(steps, values, alpha=0.35 if len(values) > SMOOTH else 1.0, label=label)
        if len(values) > SMOOTH:  # one log row is a few steps: the trend is the running mean
            ax.plot(steps[SMOOTH - 1:], running_mean(values, SMOOTH), color=line.get_color(),
                    label=label and f"{label}, mean of {SMOOTH} rows")
    axes[0].set(title="loss", xlabel="step")
    if evals:
        axes[1].plot([r["step"] for r in evals], [r["eval_acceptance_length"] for r in evals], "o-",
                     label="engine, held-out prompts")
    axes[1].set(title="acceptance length", xlabel="step")
    axes[1].legend()
    if train and train[-1].get("epoch"):  # the same steps in passes over the data
        per_epoch = train[-1]["step"] / train[-1]["epoch"]
        top = axes[1].secondary_xaxis("top", functions=(lambda s: s / per_epoch, lambda e: e * per_epoch))
        top.set_xlabel("epochs")
    if train:
        slots = len(train[-1]["slot_accuracy"])
        for k in range(0, slots, max(1, slots // 5)):
            axes[2].plot([r["step"] for r in train], [r["slot_accuracy"][k] for r in train], label=f"slot {k + 1}")
        axes[2].legend()
    axes[2].set(title="per-slot accuracy", xlabel="step")
    fig.tight_layout()
    out = Path(path) if path else run / "curves.png"
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return out


def tokens_per_epoch(run: str | Path, tokenizer: Any = None) -> int:
    """Supervised (response) tokens one epoch of `run` trains on, earlier answers of a multi-turn record included:
    as the trainer recorded it (its config's `response_tokens`), or for runs from before it did, counted again
    over the first `sequences` training sequences of its data folders, in order (`tokenizer`: the target's)."""
    extra = _trainer_state(Path(run))["config"].get("extra", {})
    if "response_tokens" in extra:
        return int(extra["response_tokens"])
    missing = [k for k in ("data", "sequences", "max_len", "target") if k not in extra]
    if missing:
        raise InvalidArgumentError(f"{run}: its checkpoint does not say what it trained on (config extra {missing}); "
                                   "expected a run of `blockdraft train`")
    tokenizer = tokenizer or load_tokenizer(extra["target"])
    left, total = int(extra["sequences"]), 0
    for folder in extra["data"]:
        for seq in load_sequences(folder, "train", tokenizer, extra["max_len"], limit=left) if left else []:
            total, left = total + int(seq.loss_mask.sum()), left - 1
    if left:
        raise InvalidArgumentError(f"{run}: trained on {extra['sequences']} sequences, but {extra['data']} now hold "
                                   f"{extra['sequences'] - left}; expected its data folders as they were")
    return total


def lineage_rows(runs: list[str | Path], tokenizer: Any = None) -> list[dict]:
    """The engine evaluations of `runs`, each started from the previous one's weights, placed by the response
    tokens trained on since the first one started (epochs x the tokens of one epoch, repeats counted)."""
    out, seen = [], 0.0
    for run in map(Path, runs):
        rows, per_epoch, state = _rows(run), tokens_per_epoch(run, tokenizer), _trainer_state(run)
        steps_per_epoch = state.get("steps_per_epoch") or _logged_steps_per_epoch(run, rows)
        for r in rows:
            if "eval_acceptance_length" in r:
                epoch = r["step"] / steps_per_epoch
                out.append({"run": run.name, "step": r["step"], "epoch": epoch, "tokens_seen": seen + epoch * per_epoch,
                            "acceptance": r["eval_acceptance_length"]})
        seen += state["step"] / steps_per_epoch * per_epoch  # the next run starts from this checkpoint
    return out


def _logged_steps_per_epoch(run: Path, rows: list[dict]) -> float:
    """Steps per epoch of a run that did not record it, from its last log row (epochs are logged to 4 digits)."""
    train = [r for r in rows if "loss" in r and r.get("epoch")]
    if not train:
        raise InvalidArgumentError(f"{run}: no training steps logged yet; expected a run that has trained")
    return train[-1]["step"] / train[-1]["epoch"]


def lineage_table(rows: list[dict]) -> str:
    lines = ["| run | step | epoch | response tokens trained on | held-out acceptance length |", "|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['step']:,} | {r['epoch']:.2f} | {r['tokens_seen'] / 1e6:.2f}M | {r['acceptance']:.3f} |"
              for r in rows]
    return "\n".join(lines)


def plot_lineage(rows: list[dict], path: str | Path) -> Path:
    """Acceptance against the response tokens trained on (millions), one series per run -> `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == run]
        ax.plot([r["tokens_seen"] / 1e6 for r in mine], [r["acceptance"] for r in mine], "o-", label=run)
    ax.set(xlabel="response tokens trained on (millions, repeats counted)", ylabel="acceptance length",
           title="engine acceptance on held-out prompts")
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return Path(path)


def _trainer_state(run: Path) -> dict:
    """The latest checkpoint's trainer.json of a run folder (checkpoints/step-N) or of a stash (step-N)."""
    steps = sorted([*run.glob("checkpoints/step-[0-9]*/trainer.json"), *run.glob("step-[0-9]*/trainer.json")],
                   key=lambda p: int(p.parent.name.split("-")[1]))
    if not steps:
        raise InvalidArgumentError(f"{run}: no checkpoint (checkpoints/step-N or step-N with a trainer.json); "
                                   "expected a training run folder or its stash")
    return json.loads(steps[-1].read_text())

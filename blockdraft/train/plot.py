"""Training curves from a run's metrics.jsonl, drawn to PNG, and its evaluations as a Markdown table."""
from __future__ import annotations

import json
from pathlib import Path

from blockdraft.errors import InvalidArgumentError


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
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out

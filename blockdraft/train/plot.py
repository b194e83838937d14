"""Training curves from a run's metrics.jsonl, drawn to PNG."""
from __future__ import annotations

import json
from pathlib import Path

from blockdraft.errors import InvalidArgumentError


def plot_run(run: str | Path, path: str | Path | None = None) -> Path:
    """Loss, estimated and engine-measured acceptance length, per-slot accuracy -> `run/curves.png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(run)
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise InvalidArgumentError(f"{run}: no metrics.jsonl; expected a training run folder")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "eval_acceptance_length" in r]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train])
    axes[0].set(title="loss", xlabel="step")
    axes[1].plot([r["step"] for r in train], [r["tau_estimate"] for r in train], label="estimate (train blocks)")
    if evals:
        axes[1].plot([r["step"] for r in evals], [r["eval_acceptance_length"] for r in evals], "o-",
                     label="engine, held-out prompts")
    axes[1].set(title="acceptance length", xlabel="step")
    axes[1].legend()
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

"""Training curves (`blockdraft.train.plot`): the running mean drawn over noisy logs, and the figure itself."""
import json

import pytest

from blockdraft.errors import InvalidArgumentError
from blockdraft.train.plot import SMOOTH, eval_table, plot_run, running_mean


def test_running_mean_is_the_mean_of_each_window():
    assert running_mean([1.0, 2.0, 3.0, 6.0], 2) == [1.5, 2.5, 4.5]
    assert running_mean([1.0, 2.0, 3.0], 3) == [2.0]
    assert running_mean([1.0, 2.0], 3) == []


def test_a_long_run_draws_its_curves_with_epochs(tmp_path):
    rows = [{"step": 10 * i, "epoch": i / 40, "loss": 4 - i / 100, "tau_estimate": 1 + i / 100,
             "slot_accuracy": [0.5, 0.2, 0.1]} for i in range(1, 3 * SMOOTH)]
    rows.insert(30, {"step": 300, "eval_acceptance_length": 1.5, "eval_prompts": 4})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = plot_run(tmp_path)
    assert out == tmp_path / "curves.png" and out.stat().st_size > 10_000
    with pytest.raises(InvalidArgumentError, match="no metrics.jsonl"):
        plot_run(tmp_path / "nothing")


def test_the_evaluations_table_has_each_eval_and_the_loss_before_it(tmp_path):
    rows = [{"step": 1, "epoch": 0.1, "loss": 4.0}, {"step": 2, "epoch": 0.2, "loss": 3.0},
            {"step": 2, "eval_acceptance_length": 1.5, "eval_prompts": 24},
            {"step": 3, "epoch": 0.3, "loss": 2.0}, {"step": 3, "eval_acceptance_length": 1.75, "eval_prompts": 24}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert eval_table(tmp_path).splitlines()[2:] == ["| 2 | 0.20 | 1.500 (24 prompts) | 3.500 |",
                                                     "| 3 | 0.30 | 1.750 (24 prompts) | 2.000 |"]

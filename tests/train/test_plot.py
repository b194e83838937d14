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



def _stage(folder, data: list[str], sequences: int, epochs: int, steps_per_epoch: int, evals: dict[int, float],
           stash: bool, **extra):
    """A finished run (or its stash) with log rows every step and engine evaluations at `evals`."""
    last = epochs * steps_per_epoch
    step_dir = folder / (f"step-{last:07d}" if stash else f"checkpoints/step-{last:07d}")
    step_dir.mkdir(parents=True)
    extra = {"data": data, "sequences": sequences, "max_len": 64, "target": "unused", **extra}
    (step_dir / "trainer.json").write_text(json.dumps({"step": last, "config": {"epochs": epochs, "extra": extra}}))
    rows = []
    for step in range(1, last + 1):
        rows.append({"step": step, "epoch": round(step / steps_per_epoch, 4), "loss": 1.0})
        if step in evals:
            rows.append({"step": step, "eval_acceptance_length": evals[step], "eval_prompts": 2})
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def _chats(folder, n: int) -> None:
    """n records of one or two turns: every assistant turn is supervised, the earlier answer of a second turn too."""
    from blockdraft.train.shards import ShardWriter

    def chat(i: int) -> list[dict[str, str]]:
        first = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "abc" * (i + 1)}]
        return first + [{"role": "user", "content": "again"}, {"role": "assistant", "content": "xy"}] if i % 2 else first

    ShardWriter(folder, "train", shard_size=2).add([{"id": f"r{i}", "messages": chat(i)} for i in range(n)])


def test_a_lineage_places_each_evaluation_by_the_tokens_trained_on(tmp_path):
    from blockdraft.train.data import load_sequences
    from blockdraft.train.plot import lineage_rows, lineage_table, plot_lineage, tokens_per_epoch
    from tests.conftest import tiny_tokenizer

    tok = tiny_tokenizer()
    _chats(tmp_path / "regen", 5)
    # stage 1 trained on the first 3 sequences (the folder grew later), 4 epochs; it predates recorded tokens
    _stage(tmp_path / "s1", [str(tmp_path / "regen")], 3, epochs=4, steps_per_epoch=3, evals={6: 1.5, 12: 1.6},
           stash=True)
    first3 = sum(int(s.loss_mask.sum()) for s in load_sequences(tmp_path / "regen", "train", tok, 64)[:3])
    assert tokens_per_epoch(tmp_path / "s1", tok) == first3 > 0
    # stage 2 recorded its tokens itself: 1000 an epoch, 2 epochs
    _stage(tmp_path / "s2", [str(tmp_path / "regen")], 5, epochs=2, steps_per_epoch=5, evals={5: 1.7, 10: 1.8},
           stash=False, response_tokens=1000)
    rows = lineage_rows([tmp_path / "s1", tmp_path / "s2"], tok)
    s1 = 4 * first3
    assert [(r["run"], r["step"], r["acceptance"]) for r in rows] == [("s1", 6, 1.5), ("s1", 12, 1.6),
                                                                     ("s2", 5, 1.7), ("s2", 10, 1.8)]
    assert [r["tokens_seen"] for r in rows] == pytest.approx([s1 / 2, s1, s1 + 1000, s1 + 2000], rel=1e-3)
    assert lineage_table(rows).splitlines()[-1].startswith("| s2 | 10 | 2.00 | ")
    out = plot_lineage(rows, tmp_path / "lineage.png")
    assert out.stat().st_size > 10_000


def test_a_lineage_of_runs_it_cannot_count_is_a_clear_error(tmp_path):
    from blockdraft.train.plot import lineage_rows, tokens_per_epoch
    from tests.conftest import tiny_tokenizer

    with pytest.raises(InvalidArgumentError, match="no checkpoint"):
        tokens_per_epoch(tmp_path)
    _chats(tmp_path / "regen", 2)
    _stage(tmp_path / "gone", [str(tmp_path / "regen")], 3, epochs=1, steps_per_epoch=2, evals={2: 1.2}, stash=True)
    with pytest.raises(InvalidArgumentError, match=r"trained on 3 sequences, but .* now hold 2"):
        lineage_rows([tmp_path / "gone"], tiny_tokenizer())

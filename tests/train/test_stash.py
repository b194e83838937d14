import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from blockdraft.cli import main
from blockdraft.errors import InvalidArgumentError
from blockdraft.train.stash import MANIFEST, restore_checkpoint, stash_checkpoint
from tests.train.test_command import counting_chats


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    return {f"{f.relative_to(folder)}:{k}": v for f in sorted(folder.rglob("*.safetensors"))
            for k, v in load_file(str(f)).items()}


def test_a_stashed_run_goes_on_from_a_fresh_folder_to_the_same_weights(tiny_target_dir, tmp_path, caplog):
    data, stash = counting_chats(tmp_path / "data"), tmp_path / "stash"
    common = ["train", "--target", str(tiny_target_dir), "--data", str(data), "--layers", "1", "--block-size", "4",
              "--max-anchors", "8", "--epochs", "2", "--log-every", "1", "--eval-prompts", "0", "--save-every", "3"]
    assert main([*common, "--out", str(tmp_path / "whole")]) == 0
    assert main([*common, "--out", str(tmp_path / "first"), "--stash", str(stash), "--max-steps", "6"]) == 0
    assert [p.name for p in stash.glob("step-*")] == ["step-0000006"]  # the older step was replaced
    # a later run, on another machine: only the stash (from git) is there
    assert main([*common, "--out", str(tmp_path / "second"), "--stash", str(stash), "--resume", "--eval-prompts", "1",
                 "--eval-max-new-tokens", "4"]) == 0
    assert "restored step-0000006" in caplog.text and "resumed from step 6 of 10" in caplog.text
    whole, second = _tensors(tmp_path / "whole" / "final"), _tensors(tmp_path / "second" / "final")
    assert whole.keys() == second.keys() and all(torch.equal(whole[k], second[k]) for k in whole)
    rows = [json.loads(line) for line in (tmp_path / "second" / "metrics.jsonl").read_text().splitlines()]
    first = [json.loads(line) for line in (tmp_path / "first" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [*range(1, 11), 10] and rows[:6] == first[:6]  # they came with the stash
    assert [p.name for p in stash.glob("step-*")] == ["step-0000010"]
    # the final evaluation is in the stashed curve, and `export` takes the stash for its latest drafter
    curve = (stash / "metrics.jsonl").read_text()
    assert "eval_acceptance_length" in rows[-1] and curve == (tmp_path / "second" / "metrics.jsonl").read_text()
    # the finished run started again (the same command, later) evaluates nothing twice
    assert main([*common, "--out", str(tmp_path / "third"), "--stash", str(stash), "--resume", "--eval-prompts", "1",
                 "--eval-max-new-tokens", "4"]) == 0
    assert (stash / "metrics.jsonl").read_text() == curve
    assert main(["export", "--drafter", str(stash), "--out", str(tmp_path / "exported"), "--dtype", "float32"]) == 0
    exported = _tensors(tmp_path / "exported")
    assert exported.keys() == second.keys() and all(torch.equal(exported[k], second[k]) for k in second)
    # a later stage starts from the stash's weights (`--init STASH`) on a schedule of its own
    assert main([*common, "--out", str(tmp_path / "stage2"), "--init", str(stash), "--max-steps", "0"]) == 0
    stage2 = _tensors(tmp_path / "stage2" / "final")
    assert stage2.keys() == second.keys() and all(torch.equal(stage2[k], second[k]) for k in second)


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    step = tmp_path / "run" / "checkpoints" / "step-0000042"
    (step / "drafter").mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    save_file({f"state.{i}.exp_avg": torch.randn(64, 100, generator=gen) for i in range(5)},
              str(step / "optimizer.safetensors"), metadata={"format": "pt"})
    save_file({"big": torch.randn(300, 100, generator=gen), "small": torch.randn(3, generator=gen)},
              str(step / "drafter" / "model.safetensors"), metadata={"step": "42"})
    (step / "drafter" / "config.json").write_text('{"block_size": 16}')
    (step / "trainer.json").write_text('{"step": 42}')
    return step


def test_pieces_hold_whole_tensors_under_the_size_and_restore_exactly(checkpoint, tmp_path):
    stashed = stash_checkpoint(checkpoint, tmp_path / "stash", piece_bytes=64 * 100 * 4 * 2)
    files = json.loads((stashed / MANIFEST).read_text())["files"]
    assert files["optimizer.safetensors"] == [f"optimizer.safetensors.0{i}" for i in range(3)]  # 2 + 2 + 1 tensors
    assert files["drafter/model.safetensors"] == ["drafter/model.safetensors.00", "drafter/model.safetensors.01"]
    assert files["trainer.json"] == ["trainer.json"]
    restored = restore_checkpoint(tmp_path / "stash", tmp_path / "elsewhere")
    assert restored == tmp_path / "elsewhere" / "checkpoints" / "step-0000042"
    before, after = _tensors(checkpoint), _tensors(restored)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert (restored / "drafter" / "config.json").read_text() == '{"block_size": 16}'
    with safe_open(str(restored / "drafter" / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"step": "42"}


def test_a_damaged_piece_is_named_and_nothing_is_restored(checkpoint, tmp_path):
    stashed = stash_checkpoint(checkpoint, tmp_path / "stash", piece_bytes=1)
    piece = stashed / "optimizer.safetensors.01"
    piece.write_bytes(piece.read_bytes()[:-8])  # a truncated file
    with pytest.raises(InvalidArgumentError, match="optimizer.safetensors.01"):
        restore_checkpoint(tmp_path / "stash", tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere" / "checkpoints").exists()
    assert restore_checkpoint(tmp_path / "empty", tmp_path / "elsewhere") is None
    with pytest.raises(InvalidArgumentError, match="piece_bytes=0"):
        stash_checkpoint(checkpoint, tmp_path / "stash", piece_bytes=0)


def test_export_of_a_bad_stashed_drafter_names_the_stash(checkpoint, tmp_path, capsys):
    stash_checkpoint(checkpoint, tmp_path / "stash")  # its drafter's config.json is no drafter config
    assert main(["export", "--drafter", str(tmp_path / "stash"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--drafter {tmp_path / 'stash'} (its latest stashed step, step-0000042)" in err
    assert not (tmp_path / "out").exists()

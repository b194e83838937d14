import json
from pathlib import Path

import torch

from blockdraft.api import Pipeline
from blockdraft.cli import main
from blockdraft.modeling.checkpoint import load_drafter
from blockdraft.train.shards import ShardWriter


def counting_chats(data: Path) -> Path:
    """A data folder of 5 training chats and 1 held out, each answer counting up from 0."""
    chats = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"count to {i}"},
                                          {"role": "assistant", "content": " ".join(str(k) for k in range(i + 3))}]}
             for i in range(6)]
    ShardWriter(data, "train").add(chats[:5])
    ShardWriter(data, "heldout").add(chats[5:])
    return data


def test_train_command_end_to_end(tiny_target_dir, tmp_path, capsys):
    data = counting_chats(tmp_path / "data")
    run = tmp_path / "run"
    args = ["train", "--target", str(tiny_target_dir), "--data", str(data), "--out", str(run), "--layers", "1",
            "--block-size", "4", "--max-anchors", "8", "--epochs", "2", "--features", "cache", "--log-every", "1",
            "--eval-prompts", "1", "--eval-max-new-tokens", "6", "--save-every", "3"]
    assert main(args) == 0
    final = capsys.readouterr().out.strip().splitlines()[-1]
    drafter = load_drafter(final)
    assert drafter.config.block_size == 4 and drafter.config.mask_token_id == 258
    assert (run / "features" / "index.json").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 11))
    assert "eval_acceptance_length" in rows[-1]
    pipe = Pipeline.load(str(tiny_target_dir), final, device="cpu")
    assert pipe.generate("count", max_new_tokens=5).stats.new_tokens == 5
    assert main(["train", "--plot", str(run)]) == 0
    assert (run / "curves.png").stat().st_size > 10_000
    saved = json.loads(sorted((run / "checkpoints").glob("step-*/trainer.json"))[-1].read_text())
    assert saved["config"]["extra"]["response_tokens"] > 0 and len(saved["data_fingerprint"]) == 64
    from blockdraft.train.plot import tokens_per_epoch  # a run from before recorded tokens counts them again
    recorded = tokens_per_epoch(run)
    path = sorted((run / "checkpoints").glob("step-*/trainer.json"))[-1]
    del saved["config"]["extra"]["response_tokens"]
    path.write_text(json.dumps(saved))
    assert tokens_per_epoch(run) == recorded  # the same count
    assert main(["train", "--plot", str(run), "--plot", str(run)]) == 0  # a lineage (here the run twice)
    assert "| run | step | epoch | response tokens trained on |" in capsys.readouterr().out
    assert (run / "lineage.png").stat().st_size > 10_000
    assert main(["train", "--data", str(data)]) == 2  # --out missing: a clear error, not a traceback
    own = tmp_path / "own-vocab"
    assert main(["export", "--drafter", final, "--out", str(own), "--draft-vocab", "5", "--data", str(data),
                 "--target", str(tiny_target_dir)]) == 0
    assert load_drafter(own).draft_vocab.numel() == 5
    pipe = Pipeline.load(str(tiny_target_dir), own, device="cpu")
    assert pipe.engine.draft_ids.numel() == 5
    assert pipe.generate("count", max_new_tokens=8).token_ids == \
        pipe.generate("count", max_new_tokens=8, no_draft=True).token_ids
    assert main(["export", "--drafter", final, "--out", str(own), "--draft-vocab", "5"]) == 2  # no --data
    other = tmp_path / "other"  # a second folder whose answers are mostly one token: counted with the first
    ShardWriter(other, "train").add([{"id": "z", "messages": [{"role": "user", "content": "z"},
                                                              {"role": "assistant", "content": "z" * 200}]}])
    assert main(["export", "--drafter", final, "--out", str(own), "--draft-vocab", "5", "--data", str(data),
                 "--data", str(other), "--target", str(tiny_target_dir)]) == 0
    from blockdraft.modeling.registry import load_tokenizer
    tokenizer = load_tokenizer(str(tiny_target_dir))
    z, space = (tokenizer.encode(text, add_special_tokens=False) for text in ("z", " "))
    assert set(z + space) <= set(load_drafter(own).draft_vocab.tolist())  # z from the second, " " from the first


def test_a_lazy_feature_cache_trains_the_same_weights_as_a_built_one_and_keeps_every_sequence(
        tiny_target_dir, tmp_path, capsys):
    data = counting_chats(tmp_path / "data")
    common = ["train", "--target", str(tiny_target_dir), "--data", str(data), "--layers", "1", "--block-size", "4",
              "--max-anchors", "8", "--epochs", "2", "--eval-prompts", "0", "--save-every", "100"]
    finals = {}
    for mode in ("cache", "lazy"):
        assert main(common + ["--out", str(tmp_path / mode), "--features", mode]) == 0
        finals[mode] = load_drafter(capsys.readouterr().out.strip().splitlines()[-1]).state_dict()
    assert finals["cache"].keys() == finals["lazy"].keys()
    assert all(torch.equal(finals["cache"][k], finals["lazy"][k]) for k in finals["cache"])
    index = json.loads((tmp_path / "lazy" / "features" / "index.json").read_text())
    assert sorted(index["entries"]) == [f"c{i}" for i in range(5)]  # the last, partial shard is written at the end


def test_imported_chats_train_with_target_labels_next_to_regenerated_data(tiny_target_dir, tmp_path, capsys):
    regenerated = tmp_path / "regenerated"
    ShardWriter(regenerated, "train").add([{"id": f"r{i}", "messages": [
        {"role": "user", "content": f"count to {i}"}, {"role": "assistant", "content": " ".join(map(str, range(i + 3)))}]}
        for i in range(3)])
    src = tmp_path / "chats.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"hi {i}"}, {"from": "gpt", "value": f"hello there number {i}"},
        {"from": "human", "value": "and?"}, {"from": "gpt", "value": "that is all"}]}) for i in range(4)) + "\n")
    imported = tmp_path / "imported"
    assert main(["data", "import", "--source", str(src), "--out", str(imported), "--heldout-percent", "0"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["conversations"] == 4
    run = tmp_path / "run"
    common = ["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--data", str(imported),
              "--layers", "1", "--block-size", "4", "--max-anchors", "8", "--epochs", "1", "--labels", "target",
              "--eval-prompts", "0", "--vocab", "data", "--vocab-negatives", "4"]
    assert main(common + ["--out", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r][-1] == 7  # 3 + 4 sequences, batch 1
    assert main(common + ["--out", str(tmp_path / "cached"), "--features", "cache"]) == 2  # no greedy tokens there
    other = tmp_path / "other-split"
    assert main(["data", "import", "--source", str(src), "--out", str(other), "--heldout-percent", "5"]) == 0
    assert main(common + ["--data", str(other), "--out", str(tmp_path / "mixed")]) == 2  # 0% and 5% held out

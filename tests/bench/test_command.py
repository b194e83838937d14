"""`blockdraft bench` end to end on a tiny saved pair: JSON (schema), Markdown and plots."""
import json

import pytest
import torch

from blockdraft.cli import main
from blockdraft.modeling.checkpoint import save_drafter
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_drafter


def test_bench_writes_json_markdown_and_plots(tiny_target_dir, tmp_path, capsys):
    target = TargetModel.from_pretrained(tiny_target_dir)
    save_drafter(tiny_drafter(target, block_size=4).float(), tmp_path / "drafter")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": t}) for t in ("hello there", "count: 1 2 3")))
    out = tmp_path / "out"
    rc = main(["bench", "--target", str(tiny_target_dir), "--drafter", str(tmp_path / "drafter"),
               "--dataset", str(prompts), "--max-new-tokens", "8", "--block-sizes", "2,4", "--batch", "2", "--out", str(out),
               "--device", "cpu"])
    assert rc == 0
    result = json.loads((out / "bench.json").read_text())
    assert result["schema"] == "blockdraft.bench/1"
    assert set(result) >= {"environment", "config", "summaries", "records", "cost", "plots"}
    env = result["environment"]
    assert env["packages"]["torch"].split("+")[0] == torch.__version__.split("+")[0] and env["dtype"] == "float32"
    assert set(env) >= {"device", "torch_threads", "cpu_count", "git_commit", "git_dirty", "python"}
    # no method flags: what `blockdraft generate` does by default (adaptive verify + lookups), and the baselines
    default = ["dflash-b2-adaptive-ngram", "dflash-b4-adaptive-ngram"]
    assert result["config"]["methods"] == default + ["no_draft", "hf_generate"]
    assert "what `blockdraft generate` does by default" in result["config"]["measures"]
    overall = result["summaries"]["overall"]
    assert overall[default[1]]["identical_to_no_draft"] == 2 and overall[default[1]]["compared"] == 2
    for key in ("tokens_per_second", "ttft_ms_median", "tpot_ms", "speedup"):
        assert key in overall["hf_generate"]
    cost = result["cost"]
    assert set(cost["verify_cost_s"]) == {"1", "2", "3", "4"} and cost["verify_cost_ratio"]["1"] == 1.0
    assert set(cost["methods"]) == set(default)
    assert len(result["records"]) == 2 * 4 and all((out / p).is_file() for p in result["plots"])
    batch = result["batch"]
    assert set(batch) == {*default, "no_draft"} and batch[default[1]]["identical_to_no_draft"] == 2
    md = (out / "bench.md").read_text()
    assert md.strip() in capsys.readouterr().out and f"| p | {default[1]} |" in md and "break-even" in md
    assert "Batched (2 rows" in md and md.startswith("Settings: methods dflash_ngram,no_draft,hf_generate, verify adaptive")


def test_batch_only_reports_each_dataset(tiny_target_dir, tmp_path, capsys):
    target = TargetModel.from_pretrained(tiny_target_dir)
    save_drafter(tiny_drafter(target, block_size=4).float(), tmp_path / "drafter")
    files = []
    for name, texts in (("a", ("hello there", "count: 1 2 3", "x y z")), ("b", ("abc abc",))):
        files.append(tmp_path / f"{name}.jsonl")
        files[-1].write_text("\n".join(json.dumps({"prompt": t}) for t in texts))
    out = tmp_path / "out"
    rc = main(["bench", "--target", str(tiny_target_dir), "--drafter", str(tmp_path / "drafter"), "--dataset",
               str(files[0]), "--dataset", str(files[1]), "--max-new-tokens", "8", "--methods", "dflash,no_draft",
               "--verify", "fixed", "--batch", "2", "--batch-only", "--out", str(out), "--device", "cpu"])
    assert rc == 0
    result = json.loads((out / "bench.json").read_text())
    by = result["batch_by_dataset"]
    assert set(by) == {"a", "b"} and "records" not in result
    assert by["a"]["dflash-b4"]["requests"] == 3 and by["a"]["dflash-b4"]["identical_to_no_draft"] == 3
    assert by["b"]["no_draft"]["requests"] == 1 and 1 <= by["b"]["dflash-b4"]["mean_acceptance_length"] <= 4
    md = (out / "bench.md").read_text()
    assert "Batched (2 rows, a," in md and "Batched (2 rows, b," in md and "| dataset |" not in md
    assert main(["bench", "--target", str(tiny_target_dir), "--batch-only", "--out", str(out)]) == 2
    assert "--batch-only needs --batch ROWS >= 1, got --batch 0" in capsys.readouterr().err


def test_replay_reports_greedy_acceptance_per_block_size(tiny_target_dir, tmp_path, capsys):
    target = TargetModel.from_pretrained(tiny_target_dir)
    save_drafter(tiny_drafter(target, block_size=4).float(), tmp_path / "drafter")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": t}) for t in ("hello there", "count: 1 2 3", "x y z")))
    common = ["bench", "--target", str(tiny_target_dir), "--drafter", str(tmp_path / "drafter"), "--dataset",
              str(prompts), "--max-new-tokens", "12", "--device", "cpu", "--batch", "2"]
    assert main(common + ["--replay", "--block-sizes", "2,4", "--out", str(tmp_path / "r")]) == 0
    replay = json.loads((tmp_path / "r" / "bench.json").read_text())["replay_by_dataset"]["p"]
    assert replay["requests"] == 3 and set(replay["mean_acceptance_length"]) == {"b2", "b4"}
    assert main(common + ["--batch-only", "--methods", "dflash", "--verify", "fixed", "--block-sizes", "4",
                          "--out", str(tmp_path / "e")]) == 0
    engine = json.loads((tmp_path / "e" / "bench.json").read_text())["batch_by_dataset"]["p"]["dflash-b4"]
    assert replay["mean_acceptance_length"]["b4"] == pytest.approx(engine["mean_acceptance_length"], abs=0.2)
    md = (tmp_path / "r" / "bench.md").read_text()
    assert "Greedy acceptance length by replay" in md
    assert md.startswith("Settings: replay of plain greedy continuations") and "at block 2,4, trees off," in md
    assert main(common + ["--replay", "--temperature", "0.7", "--out", str(tmp_path / "x")]) == 2
    assert "--replay measures greedy acceptance: expected --temperature 0, got 0.7" in capsys.readouterr().err


def test_bench_rejects_bad_arguments(tiny_target_dir, tmp_path, capsys):
    assert main(["bench", "--target", str(tiny_target_dir), "--dataset", "nope", "--out", str(tmp_path)]) == 2
    assert "dataset 'nope'" in capsys.readouterr().err
    assert main(["bench", "--target", str(tiny_target_dir), "--max-new-tokens", "0", "--out", str(tmp_path)]) == 2
    assert "max_new_tokens=0" in capsys.readouterr().err


def test_which_methods_must_match_plain_decoding_token_for_token():
    from blockdraft.bench.command import compared_methods
    from blockdraft.bench.runner import BenchSettings

    names = ["dflash-b4+gumbel", "dflash-b4+rejection", "no_draft", "hf_generate"]
    assert compared_methods(names, BenchSettings(temperature=0.0)) == names  # greedy: all of them
    hot = BenchSettings(temperature=0.7, samplers=("gumbel", "rejection"))
    assert compared_methods(names, hot) == ["dflash-b4+gumbel", "no_draft"]  # seeded gumbel draws are plain's
    assert compared_methods(["dflash-b4", "no_draft"], BenchSettings(temperature=0.7, samplers=("rejection",))) == []
    assert compared_methods(["dflash-b4", "no_draft"], BenchSettings(temperature=0.7)) == []  # auto: unseeded


@pytest.mark.slow
def test_bench_runs_its_default_dataset_without_the_prompt_wheels(long_context_pair, without_prompt_wheels,
                                                                  tmp_path):
    """After `make run` alone (no prompt wheels), `bench` with its default dataset (MT-Bench, both turns) and
    the other shipped sets run from the package."""
    target, drafter = long_context_pair
    out = tmp_path / "b"
    assert main(["bench", "--target", str(target), "--drafter", str(drafter), "--max-samples", "1",
                 "--max-new-tokens", "6", "--no-cost", "--out", str(out)]) == 0
    result = json.loads((out / "bench.json").read_text())
    assert result["config"]["datasets"] == {"mt-bench": 1}
    assert {r["turn"] for r in result["records"]} == {1, 2}
    assert main(["bench", "--target", str(target), "--drafter", str(drafter), "--dataset",
                 "humaneval", "--dataset", "sharegpt-heldout", "--max-samples", "1", "--max-new-tokens", "4",
                 "--replay", "--out", str(tmp_path / "r")]) == 0


@pytest.mark.slow
def test_two_drafters_run_side_by_side(tiny_target_dir, tmp_path):
    """--drafter twice: every DFlash method (and the replay) once per drafter on the one target, named @LABEL
    (the first under its folder's name), all lossless. Which engine gets which drafter: tests/bench/test_runner.py."""
    target = TargetModel.from_pretrained(tiny_target_dir)
    for name, seed in (("one", 1), ("two", 5)):
        save_drafter(tiny_drafter(target, seed=seed, block_size=4).float(), tmp_path / name)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": t}) for t in ("hello there", "count: 1 2 3", "abc abc abc")))
    common = ["bench", "--target", str(tiny_target_dir), "--drafter", str(tmp_path / "one"), "--drafter",
              f"b={tmp_path / 'two'}", "--dataset", str(prompts), "--max-new-tokens", "12", "--device", "cpu"]
    assert main([*common, "--methods", "dflash,no_draft", "--verify", "fixed,adaptive", "--no-cost", "--batch", "2",
                 "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "bench.json").read_text())
    methods = ["dflash-b4@one", "dflash-b4-adaptive@one", "dflash-b4@b", "dflash-b4-adaptive@b", "no_draft"]
    assert result["config"]["methods"] == methods and result["config"]["drafter"].endswith(f"b={tmp_path / 'two'}")
    overall = result["summaries"]["overall"]
    assert all(overall[m]["identical_to_no_draft"] == overall[m]["compared"] == 3 for m in methods)
    assert all(result["batch"][m]["identical_to_no_draft"] == 3 for m in methods)
    assert main([*common, "--replay", "--tree", "off,3", "--out", str(tmp_path / "replay")]) == 0
    replay = json.loads((tmp_path / "replay" / "bench.json").read_text())["replay_by_dataset"]["p"]
    assert list(replay["mean_acceptance_length"]) == ["b4@one", "b4-tree3@one", "b4@b", "b4-tree3@b"]


@pytest.mark.parametrize("values, message", [
    (["a/x", "b/x"], "the label 'x' is taken by 'a/x'"),
    (["bad label=a/x", "b/y"], "drafter label 'bad label'"),
    (["a/x", "b/y", "--compile"], "--compile with 2 drafters: expected one drafter to compile"),
])
def test_drafter_labels_are_checked_before_anything_loads(tmp_path, capsys, values, message):
    args = [x for v in values for x in (("--drafter", v) if not v.startswith("--") else (v,))]
    assert main(["bench", "--target", "no/such-target", *args, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_drafter_values_name_labels_and_folders(tmp_path):
    from blockdraft.bench.command import compared_methods, drafter_labels
    from blockdraft.bench.runner import BenchSettings

    assert drafter_labels(["a/v1", "new=runs/x/final", "runs/lr=3e-4/final/"]) == {
        "v1": "a/v1", "new": "runs/x/final", "final": "runs/lr=3e-4/final/"}
    odd = tmp_path / "k=v"
    odd.mkdir()
    assert drafter_labels([str(odd)]) == {"k_v": str(odd)}  # an existing folder is a folder, '=' or not
    methods = ["dflash-b16+gumbel@v1", "dflash-b16+rejection@v1", "dflash-b16+gumbel@v2", "no_draft"]
    seeded = compared_methods(methods, BenchSettings(temperature=0.7, samplers=("gumbel", "rejection")))
    assert seeded == ["dflash-b16+gumbel@v1", "dflash-b16+gumbel@v2", "no_draft"]  # no_draft samples with gumbel
    assert compared_methods(methods, BenchSettings(temperature=0.7, samplers=("rejection", "gumbel"))) == []


def test_settings_line_names_trees_and_the_default_only_with_chains():
    from blockdraft.bench.command import settings_line
    from blockdraft.bench.runner import BenchSettings

    both = settings_line(BenchSettings(trees=("off", "auto")))
    assert "verify adaptive, trees off,auto, T=0" in both and both.endswith("does by default")
    assert "not generate's default" in settings_line(BenchSettings(trees=("auto",)))
    assert "trees" not in settings_line(BenchSettings())
    assert "at the drafter's trained block size, trees off," in settings_line(BenchSettings(), replay=True)

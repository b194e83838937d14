"""scripts/results.py: the README's results table is composed from bench runs and replaces only the text between
its markers."""
import json

import pytest

from blockdraft.errors import InvalidArgumentError
from tests.scripts import load_script

results = load_script("results")

ENV = {"cpu_model": "Test CPU", "cpu_capability": "AVX2", "device_name": "cpu", "torch_threads": 2,
       "dtype": "float32", "git_commit": "abcdef0123"}


def single(fast: float, tau: float, trees: bool = False) -> dict:
    def row(tps, same=None):
        r = {"tokens_per_second": tps, "speedup": {"no_draft": tps / 20.0, "hf_generate": tps / 14.0},
             "mean_acceptance_length": tau}
        return r | ({"identical_to_no_draft": 16, "compared": 16} if same else {})
    overall = {results.DEFAULT: row(fast, True), results.DRAFTER_ONLY: row(21.0, True), "no_draft": row(20.0),
               "hf_generate": row(14.0)} | ({results.TREE: row(fast + 4, True), results.DRAFTER_ONLY_TREE: row(24.0, True)}
                                           if trees else {})
    return {"environment": ENV, "config": {"datasets": {"mt-bench": 8, "humaneval": 8},
                                           "settings": {"max_new_tokens": 256}}, "summaries": {"overall": overall}}


def write_runs(folder, trees=False):
    batch = {d: {results.DEFAULT: {"rows": 8, "requests": 16, "tokens_per_second": 80.0, "identical_to_no_draft": 16},
                 "no_draft": {"tokens_per_second": 75.0}} for d in ("mt-bench", "humaneval")}
    replay = {"replay_by_dataset": {"mt-bench": {"mean_acceptance_length": {"b16": 1.5}},
                                    "sharegpt-heldout": {"mean_acceptance_length": {"b16": 1.6}}}}
    for name, data in (("t0", single(32.0, 2.4, trees)), ("t07", single(28.0, 1.9, trees)), ("batch8", {"batch_by_dataset": batch}),
                       ("acceptance", replay)):
        (folder / name).mkdir(parents=True)
        (folder / name / "bench.json").write_text(json.dumps(data))


def test_table_from_runs_and_readme_markers(tmp_path):
    write_runs(tmp_path / "r")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{results.START}\nold table\n{results.END}\nafter\n")
    assert results.main([str(tmp_path / "r"), "--readme", str(readme)]) == 0
    body = readme.read_text()
    assert "old table" not in body and body.startswith("# x\n\nbefore\n") and body.endswith(f"{results.END}\nafter\n")
    assert "| **default** (drafter + looked-up drafts, adaptive verify) | 32.0 | 1.60x | 2.29x | 28.0 | 1.40x | 2.00x | 16/16 |" in body
    assert "mt-bench 80.0 vs 75.0 tok/s = 1.07x (16/16 identical)" in body
    assert "mt-bench 1.50; sharegpt-heldout 1.60; with looked-up drafts the default commits 2.40" in body
    assert "Test CPU (AVX2 kernels), 2 threads, float32; commit abcdef0" in body
    assert (tmp_path / "r" / "README.md").read_text().startswith("# Results table")
    assert "tree" not in body


def edit(folder, run, change):
    bench = folder / run / "bench.json"
    data = json.loads(bench.read_text())
    change(data)
    bench.write_text(json.dumps(data))


def test_a_run_with_uncommitted_changes_says_so(tmp_path):
    write_runs(tmp_path)
    edit(tmp_path, "t07", lambda d: d["environment"].update(git_dirty=True))
    assert "commit abcdef0 + uncommitted changes," in results.table(results.load_runs(tmp_path))
    edit(tmp_path, "t0", lambda d: d["environment"].update(git_commit="1234567890"))
    assert "commit 1234567, abcdef0 + uncommitted changes," in results.table(results.load_runs(tmp_path))


def test_a_row_missing_from_one_run_is_a_clear_error(tmp_path):
    write_runs(tmp_path, trees=True)
    edit(tmp_path, "t07", lambda d: d["summaries"]["overall"].pop(results.TREE))
    with pytest.raises(InvalidArgumentError, match="t07/bench.json has no 'dflash-b16-adaptive-treeauto-ngram'"):
        results.table(results.load_runs(tmp_path))
    write_runs(tmp_path / "x")
    edit(tmp_path / "x", "t0", lambda d: d["summaries"]["overall"].pop(results.DEFAULT))
    with pytest.raises(InvalidArgumentError, match="t0/bench.json has no 'dflash-b16-adaptive-ngram'"):
        results.table(results.load_runs(tmp_path / "x"))


def test_tree_rows_come_from_tree_runs(tmp_path):
    write_runs(tmp_path, trees=True)
    text = results.table(results.load_runs(tmp_path))
    assert "| default + draft trees (`--tree auto`) | 36.0 | 1.80x | 2.57x | 32.0 | 1.60x | 2.29x | 16/16 |" in text
    assert "| drafter only + draft trees (`--no-ngram --tree auto`) | 24.0 | 1.20x |" in text
    rows = [line.split(" |")[0] for line in text.splitlines() if line.startswith("| ")]
    assert rows.index("| **default** (drafter + looked-up drafts, adaptive verify)") < rows.index(
        "| default + draft trees (`--tree auto`)") < rows.index("| drafter only (`--no-ngram`)")


def test_missing_runs_and_markers_are_clear_errors(tmp_path):
    with pytest.raises(InvalidArgumentError, match="t0/bench.json: missing"):
        results.load_runs(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("no markers")
    with pytest.raises(InvalidArgumentError, match="no <!-- results:start -->"):
        results.update_readme(readme, "table")

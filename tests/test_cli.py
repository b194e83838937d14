import json
import signal

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
    (["--block-size", 99, "--no-draft"], "block_size=99"),  # refused even where it would not be used
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


def test_main_puts_the_sigterm_handler_back(capsys, tiny_target_dir, drafter_dir):
    def mine(signum, frame):  # pragma: no cover - never delivered
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        code, _, _ = run(capsys, "--target", tiny_target_dir, "--drafter", drafter_dir, "--prompt", "x",
                         "--max-new-tokens", 2)
        assert code == 0 and signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


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


def test_compare_prints_both_speeds_and_identity(capsys, tiny_target_dir, drafter_dir):
    code, out, err = run(capsys, "--target", tiny_target_dir, "--drafter", drafter_dir, "--prompt", "hello",
                         "--max-new-tokens", 16, "--compare")
    line = err.strip().splitlines()[-1]
    assert code == 0 and out.strip()
    assert "x plain decoding (" in line and " vs " in line and line.endswith("output identical"), line
    code, out, _ = run(capsys, "--target", tiny_target_dir, "--drafter", drafter_dir, "--prompt", "hello",
                       "--max-new-tokens", 16, "--compare", "--json")
    compared = json.loads(out)["compare"]
    assert compared["identical"] and compared["speedup"] == pytest.approx(
        compared["tokens_per_second"] / compared["plain_tokens_per_second"])


def test_compare_line_says_where_outputs_differ():
    from blockdraft.cli import comparison_line

    c = {"speedup": 1.5, "tokens_per_second": 30.0, "plain_tokens_per_second": 20.0, "identical": False,
         "common_prefix": 41}
    assert comparison_line(c, 0.0).startswith("1.50x plain decoding (30.0 vs 20.0 tok/s), outputs differ after 41")
    assert "near-tie" in comparison_line(c, 0.7, "gumbel")
    assert "same distribution" in comparison_line(c, 0.7, "rejection")
    assert comparison_line(c | {"identical": True}, 0.7).endswith("output identical")


def test_sampled_compare_is_identical_with_the_gumbel_sampler(capsys, tiny_target_dir, drafter_dir):
    code, _, err = run(capsys, "--target", tiny_target_dir, "--drafter", drafter_dir, "--prompt", "hello",
                       "--max-new-tokens", 16, "--temperature", 0.9, "--compare")
    assert code == 0 and err.strip().splitlines()[-1].endswith("output identical")


def test_compare_needs_speculation(capsys, tiny_target_dir):
    code, _, err = run(capsys, "--target", tiny_target_dir, "--prompt", "hi", "--no-draft", "--compare")
    assert code == 2 and "--compare with --no-draft" in err


def test_info_describes_a_matching_pair(capsys, tiny_target_dir, drafter_dir):
    code = main(["info", "--target", str(tiny_target_dir), "--drafter", str(drafter_dir), "--context", "100"])
    out = capsys.readouterr().out
    assert code == 0, out
    for text in ("Qwen3ForCausalLM: 4 layers, hidden 32", "block size 8", "target layer ids [", "mask token",
                 "draft vocabulary: the target's full vocabulary", "memory   (float32, 100 tokens)", "match    yes"):
        assert text in out, text
    main(["info", "--target", str(tiny_target_dir), "--drafter", str(drafter_dir), "--json"])
    info = json.loads(capsys.readouterr().out)
    t, d, m = info["target"], info["drafter"], info["memory"]
    assert d["block_size"] == 8 and d["num_target_layers"] == t["num_hidden_layers"] == 4
    assert m["target_kv_bytes_per_token"] == 2 * 4 * 2 * 8 * 4  # K and V x layers x KV heads x head_dim x fp32
    assert t["parameters"] == sum(p.numel() for p in TargetModel.from_pretrained(tiny_target_dir).model.parameters())


def test_info_flags_a_drafter_for_another_target(capsys, tmp_path, tiny_target_dir):
    from tests.conftest import tiny_hf_model

    other = TargetModel(tiny_hf_model("qwen3", vocab=300, layers=6, hidden=48, dtype=torch.float32))
    folder = save_drafter(tiny_drafter(other).float(), tmp_path / "other")
    code = main(["info", "--target", str(tiny_target_dir), "--drafter", str(folder)])
    out = capsys.readouterr().out
    assert code == 1 and "match    NO: drafter hidden_size=48 but target hidden_size=32" in out
    assert "warning  drafter vocab_size=300" in out


def test_info_of_the_target_alone(capsys, tiny_target_dir):
    assert main(["info", "--target", str(tiny_target_dir), "--drafter", "none"]) == 0
    out = capsys.readouterr().out
    assert "target   " in out and "drafter" not in out and "match" not in out


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    """A tiny Qwen3.5 saved as the published checkpoints are (`Qwen3_5ForConditionalGeneration`: a text model
    with linear-attention layers plus a vision tower) and a drafter in the published layout for it (sliding-window
    draft layers, the MASK token from the target's tokenizer)."""
    import transformers as tf

    from blockdraft.modeling.config import DrafterConfig
    from blockdraft.modeling.drafter import Drafter
    from tests.conftest import tiny_family_model, tiny_tokenizer

    tok = tiny_tokenizer()
    text = tiny_family_model("qwen3_5", vocab=len(tok), dtype=torch.float32, head_scale=4.0).config.to_dict()
    vision = tf.Qwen3_5VisionConfig(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                                    patch_size=4, temporal_patch_size=2, spatial_merge_size=2)
    torch.manual_seed(0)
    model = tf.Qwen3_5ForConditionalGeneration(tf.Qwen3_5Config(text_config=text, vision_config=vision.to_dict()))
    target_dir = tmp_path_factory.mktemp("qwen3_5")
    model.float().save_pretrained(target_dir)
    tok.save_pretrained(target_dir)
    target = TargetModel.from_pretrained(target_dir)
    config = DrafterConfig.for_target(target.config_dict(), num_layers=3, block_size=8,
                                      mask_token_id=tok.mask_token_id, sliding_window=16)
    drafter = save_drafter(Drafter(config).init_weights(0).eval(), tmp_path_factory.mktemp("drafter") / "d")
    return target_dir, drafter


@pytest.mark.slow
def test_a_hybrid_target_decodes_as_plain_decoding(capsys, hybrid_dirs):
    """A first try on a new family: `generate --drafter untrained` and `--no-draft` on a Qwen3.5 folder."""
    target_dir, drafter_dir = hybrid_dirs
    outputs = []
    for extra in (["--drafter", "untrained"], ["--drafter", drafter_dir], ["--no-draft"]):
        code, out, _ = run(capsys, "--target", target_dir, "--prompt", "hello there", "--max-new-tokens", 40,
                           "--json", *extra)
        assert code == 0
        outputs.append(json.loads(out)["token_ids"])
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0]) == 40


def test_info_of_a_hybrid_pair(capsys, hybrid_dirs):
    target_dir, drafter_dir = hybrid_dirs
    code = main(["info", "--target", str(target_dir), "--drafter", str(drafter_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    for text in ("Qwen3_5ForConditionalGeneration: 4 layers (3 of them linear attention), hidden 32",
                 "mask token 258 ('<mask>')", "+ states ", "match    yes"):
        assert text in out, text


def test_trees_on_a_hybrid_target_are_a_one_line_error(capsys, hybrid_dirs):
    target_dir, drafter_dir = hybrid_dirs
    code, _, err = run(capsys, "--target", target_dir, "--drafter", drafter_dir, "--prompt", "hi", "--tree", "8")
    assert code == 2 and err.count("\n") == 1 and "verifies chains only (expected tree='off' or 'auto')" in err

"""`blockdraft export`: what it writes beyond our own format, and the serving commands it prints."""
import json
import logging
import shlex
from pathlib import Path

import pytest
import torch

from blockdraft.cli import main
from blockdraft.modeling.checkpoint import load_drafter, read_config, save_drafter
from blockdraft.modeling.registry import DEFAULT_TARGET, EMBEDDED, WEIGHTS_DIR, resolve_target
from tests.conftest import tiny_drafter, tiny_hf_model
from tests.export import engines as E
from tests.export.conftest import read


def command(capsys, *args) -> list[str]:
    """The words of the command `blockdraft export ... --serve-command` printed after the folder path."""
    assert main([*map(str, args)]) == 0
    out = capsys.readouterr().out
    return shlex.split(out.split("\n", 1)[1].replace("\\\n", " "))


def flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_records_the_mask_string_and_the_training_target(exported, tiny_target, tiny_target_dir):
    config, _ = read(exported)
    ours = read_config(exported)
    assert ours.mask_token == tiny_target.tokenizer.convert_ids_to_tokens(ours.mask_token_id)
    assert config["blockdraft"] == {"target": str(Path(tiny_target_dir).resolve())}
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]


def test_weights_are_the_drafters_and_re_exporting_changes_nothing(exported, tmp_path):
    before = (exported / "config.json").read_text()
    again = tmp_path / "again"
    assert main(["export", "--drafter", str(exported), "--out", str(again)]) == 0  # the recorded target is reused
    assert (again / "config.json").read_text() == before
    src = load_drafter(exported.parent / "src").state_dict()
    for folder in (exported, again):
        out = load_drafter(folder, dtype=torch.bfloat16).state_dict()
        assert all(torch.equal(out[k], v.to(torch.bfloat16)) for k, v in src.items())


def test_a_target_the_drafter_does_not_fit_is_refused(tmp_path, tiny_target_dir, capsys):
    from blockdraft.modeling.target import TargetModel

    src = save_drafter(tiny_drafter(TargetModel(tiny_hf_model("qwen3", layers=3))).float(), tmp_path / "src")
    assert main(["export", "--drafter", str(src), "--out", str(tmp_path / "x"), "--target", str(tiny_target_dir)]) == 2
    assert "3-layer target, this target has 4" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_vllm_command(exported, tiny_target_dir, tmp_path, capsys, caplog):
    ours = read_config(exported)
    with caplog.at_level(logging.WARNING):
        words = command(capsys, "export", "--drafter", exported, "--out", tmp_path / "v", "--serve-command", "vllm")
    mixed = len({ours.layer_type(i) for i in range(ours.num_hidden_layers)}) > 1
    assert words[:int(mixed)] == ["VLLM_USE_V2_MODEL_RUNNER=1"] * mixed  # VLLM_MODEL: mixed layers need the V2 runner
    assert words[int(mixed):int(mixed) + 3] == ["vllm", "serve", str(Path(tiny_target_dir).resolve())]
    spec = json.loads(flag(words, "--speculative-config"))
    assert spec == {"method": "dflash", "model": str((tmp_path / "v").resolve()),
                    "num_speculative_tokens": ours.block_size - 1}
    assert E.vllm_queries(spec["num_speculative_tokens"]) == ours.block_size
    assert flag(words, "--attention-backend") == "flash_attn" and flag(words, "--tensor-parallel-size") == "1"
    assert not [r for r in caplog.records if r.name.startswith("blockdraft")]


def test_sglang_command_over_two_gpus(exported, tiny_target_dir, tmp_path, capsys):
    words = command(capsys, "export", "--drafter", exported, "--out", tmp_path / "s", "--serve-command", "sglang",
                    "--tensor-parallel", 2)
    assert words[:3] == ["python", "-m", "sglang.launch_server"]
    assert flag(words, "--model-path") == str(Path(tiny_target_dir).resolve())
    assert flag(words, "--speculative-algorithm") == "DFLASH"
    assert flag(words, "--speculative-draft-model-path") == str((tmp_path / "s").resolve())
    assert int(flag(words, "--speculative-num-draft-tokens")) == E.sglang_num_draft_tokens(read(exported)[0])
    assert flag(words, "--speculative-draft-attention-backend") == "flashinfer" and flag(words, "--tp-size") == "2"


@pytest.mark.parametrize("tp", [3, 8])
def test_heads_that_do_not_split_are_refused(exported, tmp_path, capsys, tp):
    """VLLM_MODEL / SGLANG_MODEL attention: the tiny drafter's 4 heads / 2 KV heads split over 1, 2 or 4 GPUs."""
    ours = read_config(exported)
    assert not E.splits(ours.num_attention_heads, ours.num_key_value_heads, tp)
    code = main(["export", "--drafter", str(exported), "--out", str(tmp_path / "x"), "--serve-command", "vllm",
                 "--tensor-parallel", str(tp)])
    assert code == 2 and f"--tensor-parallel {tp}" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_serving_another_target_warns(exported, tmp_path, capsys, caplog):
    with caplog.at_level(logging.WARNING):
        words = command(capsys, "export", "--drafter", exported, "--out", tmp_path / "o", "--serve-command", "vllm",
                        "--serve-target", "someone/other-model")
    assert "someone/other-model" in words
    assert any("was trained on" in r.getMessage() and "someone/other-model" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_the_shipped_drafter_is_exported_for_its_target(tmp_path, capsys, caplog):
    """The shipped folder: its mask string resolves to its id in SmolLM2's tokenizer (SGLANG_WORKER_OLD), both
    RoPE spellings give 1e5, it records the embedded GGUF; serving the hub id instead warns about the weights."""
    from transformers import AutoTokenizer

    folder = WEIGHTS_DIR / "smollm2-135m-instruct-dflash"
    config, _ = read(folder)
    tokenizer = AutoTokenizer.from_pretrained(resolve_target(DEFAULT_TARGET))
    assert E.sglang_old_mask_id(config, tokenizer) == config["dflash_config"]["mask_token_id"] < config["vocab_size"]
    assert set(E.rope_bases(config).values()) == {100000.0}
    record = config["blockdraft"]
    assert record["target"] == DEFAULT_TARGET and record["target_source"]["sha256"] == EMBEDDED[DEFAULT_TARGET].sha256
    with caplog.at_level(logging.WARNING):
        words = command(capsys, "export", "--drafter", folder, "--out", tmp_path / "h", "--serve-command", "sglang",
                        "--serve-target", record["quantized_from"])
    assert flag(words, "--model-path") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert any("not on the hub weights" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "h" / "config.json").read_text() == (folder / "config.json").read_text()

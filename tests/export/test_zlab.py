"""An exported folder against z-lab's `dflash` loader and transformers' Qwen3Config, which all three loaders use."""
import torch

from blockdraft.modeling.checkpoint import read_config
from tests.export import engines as E
from tests.export.conftest import read


def test_names_and_shapes_are_those_dflash_builds(exported):
    """ZLAB_MODEL DFlashDraftModel: unstacked q/k/v/o and gate/up/down, fc of len(target_layer_ids) x hidden."""
    config, shapes = read(exported)
    assert shapes == E.zlab_params(E.hf_view(config))


def test_the_values_it_reads_are_ours(exported):
    """ZLAB_MODEL _draft_value (dflash_config, then top level): target_layer_ids, block_size (default 16), mask."""
    config, _ = read(exported)
    ours = read_config(exported)
    assert [E.zlab_value(config, k) for k in ("target_layer_ids", "block_size", "mask_token_id")] == \
        [ours.target_layer_ids, ours.block_size, ours.mask_token_id]


def test_attention_of_each_layer_is_ours(exported):
    view = E.hf_view(read(exported)[0])
    ours = read_config(exported)
    for i in range(ours.num_hidden_layers):
        assert E.zlab_layer(view, i) == (ours.layer_window(i), ours.layer_causal(i)), i


def test_every_loader_feeds_the_drafter_the_target_layers_we_do(exported, tiny_target):
    """The offsets, on a real forward: z-lab reads HF hidden_states[id + 1] (ZLAB_MODEL), vLLM and SGLang the
    residual stream entering layer id + 1 (VLLM_CAPTURE, SGLANG_CAPTURE); we hook the output of layer id."""
    config, _ = read(exported)
    ours = read_config(exported)
    tokens = torch.arange(3, 15)[None]
    entering: dict[int, torch.Tensor] = {}

    def record(idx: int):
        return lambda _module, args, kwargs: entering.__setitem__(idx, (args or (kwargs["hidden_states"],))[0])

    hooks = [layer.register_forward_pre_hook(record(idx), with_kwargs=True)
             for idx, layer in enumerate(tiny_target.layers)]
    tiny_target.set_feature_layers(ours.target_layer_ids)
    try:
        _, features = tiny_target.forward(tokens, tiny_target.new_cache(), 0)
    finally:
        for hook in hooks:
            hook.remove()
    engines = torch.cat([entering[i + 1] for i in E.captured_layers(E.vllm_aux_layers(config),
                                                                    ours.num_target_layers)], dim=-1)
    with torch.no_grad():
        hidden = tiny_target.model(input_ids=tokens, output_hidden_states=True).hidden_states
    zlab = torch.cat([hidden[i] for i in E.zlab_feature_ids(E.zlab_value(config, "target_layer_ids"))], dim=-1)
    assert torch.equal(engines, features)
    torch.testing.assert_close(zlab, features)


def test_transformers_reads_the_config_as_we_do(exported):
    """HF_QWEN3 (the config class of all three loaders) keeps both RoPE spellings' base, our layer kinds and
    window, and dflash_config; the `blockdraft` record is a plain attribute nobody reads."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(exported)
    ours = read_config(exported)
    assert type(hf).__name__ == "Qwen3Config" and hf.rope_parameters["rope_theta"] == ours.rope_theta
    assert hf.sliding_window == ours.sliding_window and hf.num_hidden_layers == ours.num_hidden_layers
    assert [t == "sliding_attention" for t in hf.layer_types] == \
        [ours.layer_type(i) == "sliding_attention" for i in range(ours.num_hidden_layers)]
    assert hf.dflash_config["mask_token"] == ours.mask_token and hf.blockdraft["target"] == ours.extra["blockdraft"][
        "target"]

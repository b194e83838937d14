"""How vLLM, SGLang and z-lab's `dflash` read a DFlash drafter folder, restated in our words from their source.

Each rule names the file it comes from: repository, path and, where known, the commit of the copy that was
read. The rules take what those loaders take: the raw `config.json` dict and the safetensors header of the
folder as {name: shape}.
"""
from __future__ import annotations

from typing import Any

Shapes = dict[str, tuple[int, ...]]

VLLM_MODEL = "vllm-project/vllm vllm/model_executor/models/qwen3_dflash.py @036a00d1f5d00d449d02dce9babdd15a5b4d06c9"
VLLM_REGISTRY = "vllm-project/vllm vllm/model_executor/models/registry.py"
VLLM_AUX = ("vllm-project/vllm vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py "
            "@0cfdd2e15d6991f354c6e22fd7f7e7577afe0424")
VLLM_CAPTURE = ("vllm-project/vllm vllm/model_executor/models/llama.py (LlamaModel.forward; vLLM 0.33.0 "
                "models/interfaces.py EagleModelMixin: layers kept as sorted(set(...)))")
VLLM_SPEC = "vllm-project/vllm vllm/config/speculative.py @002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443"
VLLM_PROPOSER = "vllm 0.33.0 (PyPI wheel) vllm/v1/spec_decode/dflash.py: num_query_per_req = 1 + num_speculative_tokens"
VLLM_ROPE = "vllm-project/vllm vllm/transformers_utils/config.py @0036026e7171bd02e3c1d4687b102dec9c446049"
SGLANG_MODEL = "sgl-project/sglang python/sglang/srt/models/dflash.py @003b23d7388eabdfbfecd2610c7e228f9f6a2734"
SGLANG_MODEL_OLD = "sgl-project/sglang python/sglang/srt/models/dflash.py (versions before get_rope_config)"
SGLANG_UTILS = ("sgl-project/sglang python/sglang/srt/speculative/dflash_utils.py "
                "@00731f0bc9fa81c39802754fb4b62e9cce967582")
SGLANG_WORKER_OLD = ("sgl-project/sglang python/sglang/srt/speculative/dflash_worker.py (early spec-v1 worker: "
                     "DFlashWorker._resolve_mask_token_id)")
SGLANG_WORKER = ("sglang 0.5.23 (PyPI wheel) sglang/srt/speculative/dflash_worker_v2.py "
                 "DFlashWorkerV2._resolve_mask_token_id")
SGLANG_CAPTURE = "sgl-project/sglang python/sglang/srt/models/qwen3.py @01b5f572b7b678e2fa5a727881f1ff3ab4dd3c6d"
SGLANG_ARGS = "sgl-project/sglang python/sglang/srt/server_args.py (_handle_dflash)"
ZLAB_MODEL = "z-lab/dflash dflash/model.py @10129599dffb338ff38cfd235a53ca6d3667b4dd"
HF_QWEN3 = "huggingface/transformers src/transformers/models/qwen3/configuration_qwen3.py (5.24.0, installed here)"

DEFAULT_ROPE_THETA = 1_000_000.0  # VLLM_ROPE set_default_rope_theta(default_theta=1000000); SGLANG_MODEL_OLD


def hf_view(config: dict[str, Any]) -> dict[str, Any]:
    """config.json as transformers' Qwen3Config hands it to the three loaders (HF_QWEN3 __post_init__): without
    `use_sliding_window` the window is dropped; missing layer_types are filled in (sliding from
    max_window_layers on, default 28, when a window is left)."""
    view = dict(config)
    if not view.get("use_sliding_window", False):
        view["sliding_window"] = None
    if view.get("layer_types") is None:
        first = view.get("max_window_layers", 28)
        view["layer_types"] = ["sliding_attention" if view["sliding_window"] is not None and i >= first
                               else "full_attention" for i in range(view["num_hidden_layers"])]
    return view


def dflash_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("dflash_config") or {}


def rope_bases(config: dict[str, Any]) -> dict[str, float]:
    """The RoPE base each reader finds: `rope_parameters.rope_theta` (transformers v5, vLLM after VLLM_ROPE
    patch_rope_parameters, SGLANG_MODEL get_rope_config) and top-level `rope_theta` (transformers v4 configs,
    SGLANG_MODEL_OLD `getattr(config, "rope_theta", 1000000)`), each with the 1e6 default when missing."""
    return {"rope_parameters": float((config.get("rope_parameters") or {}).get("rope_theta", DEFAULT_ROPE_THETA)),
            "rope_theta": float(config.get("rope_theta") or DEFAULT_ROPE_THETA)}


def captured_layers(capture_before: list[int], num_target_layers: int) -> list[int]:
    """VLLM_CAPTURE and SGLANG_CAPTURE: the target records the residual stream entering layer idx for every idx
    in the list, walking its layers in order; as decoder-layer outputs (our ids), in the order concatenated.
    (vLLM 0.33.0 records it after layer idx - 1 instead, which also reaches idx = num_target_layers.)"""
    return [idx - 1 for idx in range(num_target_layers) if idx in capture_before]


def stack(loaded: dict[str, list[tuple[Any, tuple[int, ...]]]]) -> Shapes:
    """The shape of each parameter after its shards are stacked along dim 0 (q, k, v and gate, up)."""
    order = {"q": 0, "k": 1, "v": 2, 0: 0, 1: 1}
    shapes = {}
    for name, parts in loaded.items():
        if parts[0][0] is None:
            assert len(parts) == 1, f"{name} loaded {len(parts)} times"
            shapes[name] = parts[0][1]
            continue
        parts = sorted(parts, key=lambda p: order[p[0]])
        assert [p[0] for p in parts] in (["q", "k", "v"], [0, 1]), f"{name}: shards {[p[0] for p in parts]}"
        assert len({p[1][1:] for p in parts}) == 1, f"{name}: shards of different widths {[p[1] for p in parts]}"
        shapes[name] = (sum(p[1][0] for p in parts), *parts[0][1][1:])
    return shapes


_STACKED = ((".q_proj", ".qkv_proj", "q"), (".k_proj", ".qkv_proj", "k"), (".v_proj", ".qkv_proj", "v"),
            (".gate_proj", ".gate_up_proj", 0), (".up_proj", ".gate_up_proj", 1))


def layer_params(config: dict[str, Any], prefix: str) -> Shapes:
    """The fused Qwen3 decoder layers both engines build at tensor parallel 1 (VLLM_MODEL DFlashQwen3Attention,
    Qwen3MLP; SGLANG_MODEL DFlashAttention, DFlashMLP): qkv_proj and gate_up_proj stacked."""
    d, h, kv, inter = (config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                           "intermediate_size"))
    hd = config.get("head_dim") or d // h
    shapes: Shapes = {}
    for i in range(config["num_hidden_layers"]):
        p = f"{prefix}layers.{i}."
        shapes |= {p + "self_attn.qkv_proj.weight": ((h + 2 * kv) * hd, d), p + "self_attn.o_proj.weight": (d, h * hd),
                   p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                   p + "mlp.gate_up_proj.weight": (2 * inter, d), p + "mlp.down_proj.weight": (d, inter),
                   p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,)}
        if config.get("attention_bias"):
            shapes |= {p + "self_attn.qkv_proj.bias": ((h + 2 * kv) * hd,), p + "self_attn.o_proj.bias": (d,)}
    return shapes


# ---------------------------------------------------------------------------------------------------- vLLM
def vllm_aux_layers(config: dict[str, Any]) -> list[int]:
    """VLLM_AUX get_eagle3_aux_layers_from_config: `eagle_aux_hidden_state_layer_ids` when set, else
    dflash_config.target_layer_ids + 1 ("DFlash's aux layer id semantics")."""
    return list(config.get("eagle_aux_hidden_state_layer_ids")
                or [i + 1 for i in dflash_config(config).get("target_layer_ids") or []])


def vllm_params(config: dict[str, Any]) -> Shapes:
    """VLLM_MODEL DFlashQwen3Model for a drafter without its own embedding or LM head: the decoder layers, `fc`
    (input: target_hidden_size or hidden_size, times the number of aux layers), hidden_norm and norm."""
    d = config["hidden_size"]
    fc_in = (config.get("target_hidden_size") or d) * len(vllm_aux_layers(config))
    return layer_params(config, "model.") | {"model.fc.weight": (d, fc_in), "model.hidden_norm.weight": (d,),
                                              "model.norm.weight": (d,)}


def vllm_load(shapes: Shapes) -> dict[str, list[tuple[Any, tuple[int, ...]]]]:
    """VLLM_MODEL DFlashQwen3ForCausalLM.load_weights and hf_to_vllm_mapper: `mask_hidden` is refused, `t2d`
    skipped, `d2t` renamed; every other name but lm_head gets 'model.'; q/k/v and gate/up name stacked shards."""
    loaded: dict[str, list[tuple[Any, tuple[int, ...]]]] = {}
    for name, shape in shapes.items():
        assert "mask_hidden" not in name, f"{name}: vLLM asserts that DFlash ships no mask_hidden weight"
        if "t2d" in name:
            continue
        name = name.replace("d2t", "draft_id_to_target_id") if "d2t" in name else (
            name if "lm_head" in name else "model." + name)
        shard = None
        for old, new, part in _STACKED:
            if old in name:
                name, shard = name.replace(old, new), part
                break
        loaded.setdefault(name, []).append((shard, shape))
    return loaded


def vllm_layer_causal(config: dict[str, Any], i: int) -> bool:
    """VLLM_MODEL _dflash_layer_causal: `is_causal`, else dflash_config.causal, else sliding layers only."""
    if config.get("is_causal") is not None:
        return bool(config["is_causal"])
    if dflash_config(config).get("causal") is not None:
        return bool(dflash_config(config)["causal"])
    return bool(config.get("layer_types")) and config["layer_types"][i] == "sliding_attention"


def vllm_layer_window(config: dict[str, Any], i: int) -> int | None:
    """VLLM_MODEL _resolve_layer_attention: a sliding layer (from layer_types, or every layer under
    dflash_config.use_swa) takes dflash_config.swa_window_size or the top-level window, and must have one."""
    types, use_swa = config.get("layer_types"), dflash_config(config).get("use_swa", False)
    if types is None or (use_swa and "sliding_attention" not in types):
        sliding = use_swa
    else:
        sliding = types[i] == "sliding_attention"
    if not sliding:
        return None
    window = dflash_config(config).get("swa_window_size", config.get("sliding_window"))
    assert window is not None, "vLLM: DFlash sliding attention requires a window size"
    return window


def vllm_queries(num_speculative_tokens: int) -> int:
    """VLLM_SPEC max_num_new_slots_for_drafting ("DFlash uses one bonus query followed by K mask queries") and
    VLLM_PROPOSER: K = num_speculative_tokens, so the drafter's block is K + 1 positions."""
    return num_speculative_tokens + 1


# -------------------------------------------------------------------------------------------------- SGLang
def sglang_config(config: dict[str, Any]) -> dict[str, Any]:
    """SGLANG_UTILS parse_dflash_draft_config: the fields and the checks it applies (dflash_config first, then
    the top level, for num_target_layers, block_size, target_layer_ids, mask_token, mask_token_id)."""
    dflash = dflash_config(config)

    def pick(key: str) -> Any:
        return dflash.get(key, config.get(key))

    parsed = {"num_hidden_layers": config["num_hidden_layers"], "num_target_layers": pick("num_target_layers"),
              "block_size": pick("block_size"), "target_layer_ids": pick("target_layer_ids"),
              "mask_token": pick("mask_token") or "<|MASK|>", "mask_token_id": pick("mask_token_id")}
    assert isinstance(parsed["num_hidden_layers"], int) and parsed["num_hidden_layers"] >= 1
    for key in ("num_target_layers", "block_size"):
        assert parsed[key] is None or int(parsed[key]) >= 1, f"SGLang: {key}={parsed[key]!r} must be positive"
    ids = parsed["target_layer_ids"]
    assert isinstance(ids, list) and ids, "SGLang: dflash_config.target_layer_ids must be a non-empty list of ints"
    assert all(0 <= int(i) < int(parsed["num_target_layers"]) for i in ids), f"SGLang: out-of-range layer id in {ids}"
    assert isinstance(parsed["mask_token"], str) and parsed["mask_token"], "SGLang: mask_token must be a string"
    mask = parsed["mask_token_id"]
    assert mask is None or (isinstance(mask, int) and not isinstance(mask, bool) and mask >= 0), mask
    assert float(dflash.get("output_multiplier", 1.0)) > 0
    assert isinstance(dflash.get("attention_sink_bias", False), bool)
    for a, b in (("conv_kernel_size", "conv_group_size"), ("selector_rank", "selector_top_k")):
        assert bool(dflash.get(a, 0)) == bool(dflash.get(b, 0)), f"SGLang: {a} and {b} go together"
    return parsed


def sglang_params(config: dict[str, Any]) -> Shapes:
    """SGLANG_MODEL DFlashDraftModel: the decoder layers, `fc` of num_context_features (= the number of target
    layer ids) x hidden_size inputs, hidden_norm and norm; no 'model.' prefix."""
    d = config["hidden_size"]
    return layer_params(config, "") | {"fc.weight": (d, len(sglang_config(config)["target_layer_ids"]) * d),
                                       "hidden_norm.weight": (d,), "norm.weight": (d,)}


def sglang_load(shapes: Shapes, params: Shapes) -> tuple[dict[str, list[tuple[Any, tuple[int, ...]]]], list[str]]:
    """SGLANG_MODEL DFlashDraftModel.load_weights: '.q_proj.' (etc.) becomes qkv_proj / gate_up_proj; a name is
    tried as is, then without (or with) 'model.'; one matching no parameter is skipped without a word. Returns
    the loaded shards and the skipped names."""
    def resolve(name: str) -> str | None:
        for candidate in (name, name.removeprefix("model.") if name.startswith("model.") else "model." + name):
            if candidate in params:
                return candidate
        return None

    loaded: dict[str, list[tuple[Any, tuple[int, ...]]]] = {}
    skipped = []
    for name, shape in shapes.items():
        shard, target = None, None
        for old, new, part in _STACKED:
            if f"{old}." in name:
                shard, target = part, resolve(name.replace(old, new))
                break
        else:
            target = resolve(name)
        if target is None:
            skipped.append(name)
        else:
            loaded.setdefault(target, []).append((shard, shape))
    return loaded, skipped


def sglang_layer(config: dict[str, Any], i: int) -> tuple[int, bool]:
    """SGLANG_MODEL _get_dflash_layer_attention_params (+ SGLANG_UTILS get_dflash_attention_sliding_window_size):
    (window_left, causal). No layer_types or full_attention: -1, ENCODER_ONLY (both ways); sliding_attention:
    window - 1 ("HF sliding windows include the current token"), DECODER (causal). `is_causal` is not read
    (sglang 0.5.23 lets it override the kind of every layer when layer_types is set)."""
    types = config.get("layer_types")
    if types is None or types[i] == "full_attention":
        return -1, False
    assert types[i] == "sliding_attention", f"SGLang: unsupported layer type {types[i]!r}"
    assert config.get("sliding_window") is not None, "SGLang: sliding_attention layers require config.sliding_window"
    return int(config["sliding_window"]) - 1, True


def sglang_old_mask_id(config: dict[str, Any], tokenizer: Any) -> int:
    """SGLANG_WORKER_OLD: the mask id comes from the string dflash_config.mask_token (default `<|MASK|>`): the
    tokenizer's own mask token when it is that string, else its vocabulary entry, else the string is added as a
    new token (the next id); the caller checks it is inside the target's vocabulary."""
    token = sglang_config(config)["mask_token"]
    if getattr(tokenizer, "mask_token", None) == token and tokenizer.mask_token_id is not None:
        return tokenizer.mask_token_id
    found = tokenizer.get_vocab().get(token)
    return len(tokenizer) if found is None else found


def sglang_mask_conflict(config: dict[str, Any], tokenizer: Any) -> bool:
    """SGLANG_WORKER: with mask_token_id set, a mask_token (default `<|MASK|>`) that the tokenizer maps to
    another id stops the server ("dflash_config.mask_token_id conflicts with tokenizer vocab id")."""
    parsed = sglang_config(config)
    found = tokenizer.get_vocab().get(parsed["mask_token"])
    return parsed["mask_token_id"] is not None and found is not None and found != parsed["mask_token_id"]


def sglang_num_draft_tokens(config: dict[str, Any]) -> int:
    """SGLANG_ARGS: --speculative-num-draft-tokens is the drafter's block_size (inferred from the draft config
    when omitted; the worker warns when they differ)."""
    return int(sglang_config(config)["block_size"] or 16)


# ------------------------------------------------------------------------------------------------ both
def splits(heads: int, kv_heads: int, tp: int) -> bool:
    """VLLM_MODEL DFlashQwen3Attention and SGLANG_MODEL DFlashAttention: heads % tp == 0, and the KV heads are
    divisible by tp or (fewer than tp) divide it."""
    return heads % tp == 0 and (kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0)


# ------------------------------------------------------------------------------------------------- z-lab
def zlab_value(config: dict[str, Any], key: str, default: Any = None) -> Any:
    """ZLAB_MODEL _draft_value: dflash_config first, then the top level."""
    return dflash_config(config).get(key, config.get(key, default))


def zlab_params(config: dict[str, Any]) -> Shapes:
    """ZLAB_MODEL DFlashDraftModel (a Qwen3PreTrainedModel with its own nn.Linear q/k/v/o and gate/up/down, no
    stacking, no prefix): the names and shapes it loads."""
    d, h, kv, inter = (config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                           "intermediate_size"))
    hd = config.get("head_dim") or d // h
    shapes: Shapes = {"fc.weight": (d, len(zlab_value(config, "target_layer_ids")) * d), "hidden_norm.weight": (d,),
                      "norm.weight": (d,)}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (h * hd, d), p + "self_attn.k_proj.weight": (kv * hd, d),
                   p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.o_proj.weight": (d, h * hd),
                   p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                   p + "mlp.gate_proj.weight": (inter, d), p + "mlp.up_proj.weight": (inter, d),
                   p + "mlp.down_proj.weight": (d, inter), p + "input_layernorm.weight": (d,),
                   p + "post_attention_layernorm.weight": (d,)}
    return shapes


def zlab_layer(config: dict[str, Any], i: int) -> tuple[int | None, bool]:
    """ZLAB_MODEL Qwen3DFlashAttention: (window, causal): a sliding layer is causal unless `is_causal` says
    otherwise and uses config.sliding_window; a full layer is bidirectional unless `is_causal`."""
    types = config.get("layer_types")
    kind = types[i] if types else "full_attention"
    causal = kind == "sliding_attention" if config.get("is_causal") is None else bool(config["is_causal"])
    return (config.get("sliding_window") if kind == "sliding_attention" else None), causal


def zlab_feature_ids(target_layer_ids: list[int]) -> list[int]:
    """ZLAB_MODEL extract_context_feature: hidden_states[layer_id + 1] of the Hugging Face target, in the order
    of target_layer_ids."""
    return [i + 1 for i in target_layer_ids]

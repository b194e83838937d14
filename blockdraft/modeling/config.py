"""Drafter configuration, in the published DFlash (z-lab) `config.json` format, both ways."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from blockdraft.errors import CheckpointError, InvalidArgumentError

ARCHITECTURE = "DFlashDraftModel"
LAYER_TYPES = ("full_attention", "sliding_attention")

# Keys every saved config carries with fixed values (torch_dtype is derived from the weights on save).
_FIXED = {"hidden_act": "silu", "attention_dropout": 0.0}
_ROPE_TYPES = ("default", "linear", "llama3")
# config.json keys we read into named fields; anything else is kept verbatim in `extra` for round trips.
_DFLASH_KEYS = ("mask_token_id", "target_layer_ids", "input_embedding_scale", "output_multiplier",
                "final_logit_softcapping", "mask_token")


def _rope_type(scaling: dict[str, Any] | None) -> str:
    """'default', 'linear', ... from a rope_scaling dict in either spelling (`rope_type` or the older `type`)."""
    scaling = scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def default_target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """The paper's rule: features spread evenly from the 2nd to the 3rd-from-last target layer.

    Id k is the OUTPUT of decoder layer k (Hugging Face `hidden_states[k + 1]`). One feature uses the
    middle layer. For a 36-layer target and 5 features: [1, 9, 17, 25, 33].
    """
    if num_target_layers < 1 or num_features < 1:
        raise InvalidArgumentError(
            f"num_target_layers={num_target_layers} and num_features={num_features}: expected both >= 1")
    if num_features == 1:
        return [num_target_layers // 2]
    if num_target_layers < 5:
        return [min(i, num_target_layers - 1) for i in range(num_features)]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_features - 1))) for i in range(num_features)]


@dataclass
class DrafterConfig:
    """Everything that shapes a DFlash drafter. Field names follow the published config.json."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 40960
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    attention_bias: bool = False
    is_causal: bool | None = None  # None: sliding layers causal inside the block, full layers bidirectional
    tie_word_embeddings: bool = False
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    mask_token: str | None = None  # the mask id's string in the target's tokenizer (older SGLang looks it up)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise InvalidArgumentError(f"drafter config: {what}")

        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers"):
            value = getattr(self, name)
            need(isinstance(value, int) and value >= 1, f"{name}={value!r}, expected a positive integer")
        need(self.num_attention_heads % self.num_key_value_heads == 0,
             f"num_attention_heads={self.num_attention_heads} is not a multiple of "
             f"num_key_value_heads={self.num_key_value_heads}")
        need(isinstance(self.block_size, int) and self.block_size >= 2,
             f"block_size={self.block_size!r}, expected an integer >= 2")
        need(0 <= self.mask_token_id < self.vocab_size,
             f"mask_token_id={self.mask_token_id}, expected an id in [0, {self.vocab_size})")
        need(len(self.target_layer_ids) >= 1, "target_layer_ids is empty, expected at least one layer id")
        for i in self.target_layer_ids:
            need(isinstance(i, int) and 0 <= i < self.num_target_layers,
                 f"target_layer_ids has {i!r}, expected ids in [0, {self.num_target_layers})")
        if self.layer_types is not None:
            need(len(self.layer_types) == self.num_hidden_layers,
                 f"layer_types has {len(self.layer_types)} entries, expected num_hidden_layers="
                 f"{self.num_hidden_layers}")
            for t in self.layer_types:
                need(t in LAYER_TYPES, f"layer_types has {t!r}, expected one of {LAYER_TYPES}")
        need(self.sliding_window is None or (isinstance(self.sliding_window, int) and self.sliding_window >= 1),
             f"sliding_window={self.sliding_window!r}, expected a positive integer or null")
        need(self.mask_token is None or (isinstance(self.mask_token, str) and self.mask_token != ""),
             f"mask_token={self.mask_token!r}, expected a non-empty string or null")
        rope_type = _rope_type(self.rope_scaling)
        need(rope_type in _ROPE_TYPES, f"rope_scaling type {rope_type!r} is not supported, expected one of {_ROPE_TYPES}")

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """RoPE as transformers v5 spells it: one dict with `rope_type`, `rope_theta` and the scaling fields."""
        scaling = {k: v for k, v in (self.rope_scaling or {}).items() if k != "type"}
        return {**scaling, "rope_type": _rope_type(self.rope_scaling), "rope_theta": self.rope_theta}

    @property
    def num_features(self) -> int:
        return len(self.target_layer_ids)

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else "full_attention"

    def layer_window(self, i: int) -> int | None:
        return self.sliding_window if self.layer_type(i) == "sliding_attention" else None

    def layer_causal(self, i: int) -> bool:
        if self.is_causal is not None:
            return self.is_causal
        return self.layer_type(i) == "sliding_attention"

    # ------------------------------------------------------------------ build
    @classmethod
    def for_target(cls, target: dict[str, Any], *, mask_token_id: int, num_layers: int = 5,
                   block_size: int = 16, target_layer_ids: list[int] | None = None,
                   num_features: int | None = None, intermediate_size: int | None = None,
                   sliding_window: int | None = None) -> "DrafterConfig":
        """A drafter shaped for `target` (a Hugging Face config dict), with the paper's defaults.

        Width, heads, head_dim, RoPE base and vocabulary follow the target; the number of target
        features defaults to the number of draft layers, spread by `default_target_layer_ids`.
        `sliding_window` makes all layers but the last sliding-window layers (as in published drafters).
        """
        depth = int(target["num_hidden_layers"])
        heads = int(target["num_attention_heads"])
        hidden = int(target["hidden_size"])
        rope = target.get("rope_parameters") or target.get("rope_scaling") or {}
        ids = target_layer_ids or default_target_layer_ids(depth, num_features or num_layers)
        layer_types = None
        if sliding_window:
            layer_types = ["sliding_attention"] * (num_layers - 1) + ["full_attention"]
        return cls(
            hidden_size=hidden,
            intermediate_size=intermediate_size or int(target["intermediate_size"]),
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(target.get("num_key_value_heads") or heads),
            head_dim=int(target.get("head_dim") or hidden // heads),
            vocab_size=int(target["vocab_size"]),
            mask_token_id=mask_token_id,
            target_layer_ids=list(ids),
            num_target_layers=depth,
            block_size=block_size,
            rms_norm_eps=float(target.get("rms_norm_eps", 1e-6)),
            rope_theta=float(target.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            max_position_embeddings=int(target.get("max_position_embeddings", 40960)),
            layer_types=layer_types,
            sliding_window=sliding_window,
            tie_word_embeddings=bool(target.get("tie_word_embeddings", False)),
        )

    # ------------------------------------------------------------------ format
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DrafterConfig":
        """Parse a published DFlash `config.json` (remote-code fields such as `auto_map` are kept, never run)."""
        archs = d.get("architectures") or [ARCHITECTURE]
        if ARCHITECTURE not in archs:
            raise CheckpointError(f"config.json architectures={archs}, expected [{ARCHITECTURE!r}] "
                                  "(other DFlash variants are not supported)")
        dflash = dict(d.get("dflash_config") or {})
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {}
        for name in known:
            if name in dflash and name in _DFLASH_KEYS:
                values[name] = dflash[name]
            elif name in d:
                values[name] = d[name]
        if "block_size" not in values and "block_size" in dflash:
            values["block_size"] = dflash["block_size"]
        rope = d.get("rope_parameters") or {}  # transformers v5 layout
        if values.get("rope_theta") is not None and rope.get("rope_theta") is not None \
                and float(values["rope_theta"]) != float(rope["rope_theta"]):
            raise CheckpointError(f"config.json rope_theta={values['rope_theta']} but rope_parameters.rope_theta="
                                  f"{rope['rope_theta']}: engines read one or the other, expected one value")
        if "rope_theta" not in values and "rope_theta" in rope:
            values["rope_theta"] = rope["rope_theta"]
        if not values.get("rope_scaling") and rope.get("rope_type", "default") != "default":
            values["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
        if d.get("use_sliding_window") is False:
            values["sliding_window"] = None  # as Qwen3Config reads it: sliding layers stay causal, unwindowed
        if "head_dim" not in values and "hidden_size" in d and "num_attention_heads" in d:
            values["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        if "num_key_value_heads" not in values and "num_attention_heads" in d:
            values["num_key_value_heads"] = d["num_attention_heads"]
        missing = [n for n in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "vocab_size", "mask_token_id", "target_layer_ids", "num_target_layers")
                   if n not in values]
        if missing:
            raise CheckpointError(f"config.json lacks {', '.join(missing)}: not a DFlash drafter config")
        if d.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"config.json hidden_act={d['hidden_act']!r}, expected 'silu'")
        extra = {k: v for k, v in d.items() if k not in known and k not in _FIXED and k not in
                 ("architectures", "model_type", "dflash_config", "rope_parameters", "torch_dtype", "dtype",
                  "use_sliding_window")}
        extra.update({f"dflash_config.{k}": v for k, v in dflash.items() if k not in _DFLASH_KEYS})
        try:
            return cls(**values, extra=extra)
        except TypeError as e:  # a field of the wrong JSON type
            raise CheckpointError(f"config.json: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        """The published layout: Qwen3 fields, top-level `block_size`, and `dflash_config`.

        The RoPE base is written both ways, top-level `rope_theta` (transformers v4, older SGLang drafts) and
        `rope_parameters` (transformers v5, vLLM): a reader missing its spelling would use its default (1e6)."""
        d = asdict(self)
        extra = d.pop("extra")
        dflash = {k: d.pop(k) for k in _DFLASH_KEYS}
        for k in ("input_embedding_scale", "output_multiplier"):
            if dflash[k] == 1.0:
                del dflash[k]
        for k in ("final_logit_softcapping", "mask_token"):
            if dflash[k] is None:
                del dflash[k]
        if d["is_causal"] is None:
            del d["is_causal"]
        dflash.update({k.split(".", 1)[1]: v for k, v in extra.items() if k.startswith("dflash_config.")})
        out = {"architectures": [ARCHITECTURE], "model_type": "qwen3"}
        out.update(d)
        out.update(_FIXED)
        out["use_sliding_window"] = self.sliding_window is not None  # HF/vLLM/SGLang drop the window otherwise
        out["rope_parameters"] = self.rope_parameters
        out.update({k: v for k, v in extra.items() if not k.startswith("dflash_config.")})
        out["dflash_config"] = dflash
        return out

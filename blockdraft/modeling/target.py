"""Target adapter over a Hugging Face causal LM (Llama, Qwen2, Qwen3, their MoE and sliding-window look-alikes,
and the Qwen3.5 / Qwen3.6 / Qwen3-Next hybrids with linear-attention layers).

It runs the target with a KV cache, captures the outputs of the selected decoder layers with forward
hooks (never all hidden states), exposes the frozen embedding and LM head, and rolls the cache back (a hybrid's
linear-attention states too: `blockdraft.modeling.recurrent`).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from blockdraft.errors import IncompatibleModelsError
from blockdraft.modeling.packing import can_pack, pack_linears
from blockdraft.modeling.recurrent import StateRollback, check_mixers, hybrid_cache_class, linear_attention_layers

log = logging.getLogger(__name__)


class TargetModel:
    """A frozen causal LM plus the bookkeeping DFlash needs."""

    def __init__(self, model: nn.Module, tokenizer: Any = None) -> None:
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.config = model.config
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.layers: nn.ModuleList = decoder.layers
        check_mixers(self.config, self.layers, type(model).__name__)
        # a hybrid target's linear-attention states, rolled back after each verify
        self.states = StateRollback(self.layers) if linear_attention_layers(self.layers) else None
        self.feature_layer_ids: list[int] = []
        self._captured: dict[int, torch.Tensor] = {}
        self._capture = False
        self._hooks: list[Any] = []
        self.packed = False
        self._stock: nn.Module | None = None

    # ---------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32, **kwargs: Any) -> "TargetModel":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kwargs).to(device)
        return cls(model, tokenizer)

    def pack(self) -> bool:
        """Prepack the linear layers for CPU inference (`blockdraft.modeling.packing`), in place; the LM head keeps its
        dense weight too (the drafter scores sub-vocabularies with it). False where packing does not apply."""
        if self.packed or not can_pack(self.device, self.dtype):
            return self.packed
        count = pack_linears(self.model, keep_dense=(self.lm_head,))
        log.info("prepacked %d linear layers for CPU inference", count)
        self.packed = True
        return True

    def stock_model(self) -> nn.Module:
        """The Hugging Face model with its stock dense layers, for baselines that must run unmodified Hugging
        Face code: the model itself unless packed, else a copy loaded once from the same folder."""
        if not self.packed:
            return self.model
        if self._stock is None:
            from transformers import AutoModelForCausalLM

            log.info("loading a dense copy of %s for the Hugging Face baselines", self.model.name_or_path)
            self._stock = AutoModelForCausalLM.from_pretrained(self.model.name_or_path, dtype=self.dtype).to(
                self.device).eval().requires_grad_(False)
        return self._stock

    # ---------------------------------------------------------------- shape
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.embedding.weight.shape[0])

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 1 << 30))

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.weight.dtype

    @property
    def embedding(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def config_dict(self) -> dict[str, Any]:
        return self.config.to_dict()

    # ---------------------------------------------------------------- features
    def set_feature_layers(self, layer_ids: list[int]) -> None:
        """Capture the outputs of these decoder layers (HF `hidden_states[i + 1]`) on every forward."""
        for i in layer_ids:
            if not 0 <= i < self.num_layers:
                raise IncompatibleModelsError(
                    f"target layer id {i} does not exist: the target has {self.num_layers} layers (0..{self.num_layers - 1})")
        for h in self._hooks:
            h.remove()
        self.feature_layer_ids = list(layer_ids)
        self._hooks = [self.layers[i].register_forward_hook(self._hook(i)) for i in sorted(set(layer_ids))]

    def _hook(self, i: int):
        def store(_module: nn.Module, _inputs: Any, output: Any) -> None:
            if self._capture:
                self._captured[i] = output[0] if isinstance(output, tuple) else output
        return store

    # ---------------------------------------------------------------- running
    @property
    def hybrid(self) -> bool:
        """Some layers are linear attention (their states are rolled back by `blockdraft.modeling.recurrent`)."""
        return self.states is not None

    def new_cache(self, rows: int = 1, capacity: int = 0) -> Any:
        """An empty KV cache; a dynamic cache grows to any batch and length (`rows`, `capacity` are hints)."""
        from transformers import DynamicCache

        return hybrid_cache_class()(self.config) if self.hybrid else DynamicCache()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: Any, start: int, *, features: bool = True,
                last_only: bool = False,
                tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run tokens (b, T) at positions start..start+T-1 through the target, extending `cache`.

        Returns logits (b, T, V) (or (b, 1, V) with `last_only`) and, when `features`, the captured
        layers' outputs concatenated on the feature axis, (b, T, K*D), in `feature_layer_ids` order.

        With `tree` = (depths (1, T), visible (1, T, T) bool), the tokens are a draft tree (one row): token j
        sits at position start + depths[0, j] but in cache entry start + j, and attends to the cache and to the
        tokens t with visible[0, j, t] (`blockdraft.modeling.fast_target.FastTarget.forward`); `keep_path`
        then moves the accepted ones into place.
        """
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)[None]
        mask = None
        if tree is not None:
            if self.hybrid:
                raise IncompatibleModelsError(
                    f"{type(self.model).__name__} has linear-attention layers, whose states follow one sequence: "
                    "draft trees are not supported on it (use --tree off)")
            if input_ids.shape[0] != 1:
                raise ValueError(f"a tree verify on the Hugging Face path takes one row, not {input_ids.shape[0]}")
            positions = start + tree[0]
            mask = self._tree_mask(start, positions, tree[1])
        self._capture, self._captured = features, {}
        if self.states is not None:
            self.states.begin(cache, start)
        try:
            out = self.model(input_ids=input_ids, position_ids=positions.expand(input_ids.shape[0], -1),
                             attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=1 if last_only else 0)
        finally:
            self._capture = False
            if self.states is not None:
                self.states.end(cache)
        if cache.get_seq_length() != start + input_ids.shape[1]:
            import transformers

            raise IncompatibleModelsError(
                f"transformers {transformers.__version__} did not fill the KV cache (holds {cache.get_seq_length()} "
                f"tokens, expected {start + input_ids.shape[1]}): blockdraft needs the pinned transformers==5.24.0")
        feats = None
        if features:
            if not self.feature_layer_ids:
                raise RuntimeError("set_feature_layers() was not called before asking for features")
            feats = torch.cat([self._captured[i] for i in self.feature_layer_ids], dim=-1)
        self._captured = {}
        return out.logits, feats

    def _tree_mask(self, start: int, positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor | dict:
        """The additive 4D mask (1, 1, T, start + T) of a tree verify: the cache, then the tree's own `visible`
        entries. For a model with sliding-window layers, a {layer type: mask} dict whose sliding masks also hide
        keys `sliding_window` or more positions behind the query (as the model's own masks do)."""
        device, q = positions.device, positions.shape[1]
        seen = torch.cat([torch.ones(q, start, dtype=torch.bool, device=device), visible[0]], dim=1)  # (T, S)
        key_pos = torch.cat([torch.arange(start, device=device), positions[0]])

        def additive(allowed: torch.Tensor) -> torch.Tensor:
            return torch.zeros(allowed.shape, dtype=self.dtype, device=device).masked_fill_(
                ~allowed, torch.finfo(self.dtype).min)[None, None]

        types = set(getattr(self.config, "layer_types", None) or ())
        window = getattr(self.config, "sliding_window", None)
        if "sliding_attention" not in types or not window:
            return additive(seen)
        near = key_pos[None, :] > positions[0][:, None] - window
        return {kind: additive(seen & near if kind == "sliding_attention" else seen) for kind in types}

    @staticmethod
    @torch.inference_mode()
    def keep_path(cache: Any, start: int, path: list[int]) -> None:
        """After a tree verify at `start` (the root in entry `start`, tree row i in entry start + i): move the
        entries of the accepted rows `path` (in order) to start + 1, start + 2, ...; `rollback` then cuts
        the rest."""
        src, dst = path_moves(start, path)
        if src is None:
            return
        for layer in cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                t.index_copy_(2, dst.to(t.device), t.index_select(2, src.to(t.device)))

    def rollback(self, cache: Any, length: int) -> None:
        """Drop cache entries past `length` tokens (transformers 5.24 wants a negative crop); a hybrid target's
        linear-attention states go back to that length too (`StateRollback.rollback`)."""
        if self.states is not None:
            self.states.rollback(cache, length)
            return
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)


def path_moves(start: int, path: list[int]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Cache entries (source, destination) that put the accepted tree rows `path` right after the root at
    `start`; (None, None) when they already are (a chain, or the first rows of the tree)."""
    if path == list(range(1, len(path) + 1)):
        return None, None
    return torch.tensor([start + r for r in path]), torch.arange(start + 1, start + 1 + len(path))

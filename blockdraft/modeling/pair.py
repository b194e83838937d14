"""What a target + drafter pair is, read from their folders without loading weights (`blockdraft info`).

A drafter fits a target when it was shaped for it: the same hidden size, a layer count and feature layers
that exist in the target, a mask token inside the target's vocabulary. `pair_problems` lists what breaks
that (the engine refuses such a pair); `describe_pair` adds sizes, memory and softer warnings.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from blockdraft.errors import CheckpointError
from blockdraft.modeling.checkpoint import read_config, weight_files
from blockdraft.modeling.config import DrafterConfig
from blockdraft.modeling.draft_vocab import read_draft_vocab
from blockdraft.modeling.memory import attention_layers, kv_bytes_per_token, linear_state_bytes


def pair_problems(drafter: DrafterConfig, hidden_size: int, num_layers: int, vocab_size: int) -> list[str]:
    """Why `drafter` cannot run next to a target of this shape (empty when it can)."""
    problems = []
    if drafter.hidden_size != hidden_size:
        problems.append(f"drafter hidden_size={drafter.hidden_size} but target hidden_size={hidden_size}: not a pair")
    if drafter.num_target_layers != num_layers:
        problems.append(f"drafter was built for a {drafter.num_target_layers}-layer target, this target has "
                        f"{num_layers}")
    if drafter.mask_token_id >= vocab_size:
        problems.append(f"drafter mask_token_id={drafter.mask_token_id} is outside the target vocabulary "
                        f"[0, {vocab_size})")
    return problems


def tensor_shapes(folder: Path) -> dict[str, tuple[str, list[int]]]:
    """Name -> (dtype, shape) of every tensor in a folder's safetensors files, from their headers alone."""
    shapes = {}
    for path in weight_files(folder):
        try:
            with open(path, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{path}: unreadable safetensors header ({e})") from None
        shapes.update({k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return shapes


def _count(shapes: dict[str, tuple[str, list[int]]]) -> int:
    return sum(int(torch.Size(shape).numel()) for _dtype, shape in shapes.values())


def target_summary(folder: str | Path) -> dict[str, Any]:
    """Architecture, sizes and tokenizer facts of a Hugging Face target folder."""
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder)
    cfg = config.get_text_config().to_dict()  # a multimodal checkpoint (Qwen3.5) runs as its text model
    heads = cfg["num_attention_heads"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return {
        "folder": str(folder), "architecture": (config.architectures or [config.model_type])[0],
        "model_type": cfg.get("model_type"), "hidden_size": cfg["hidden_size"],
        "num_hidden_layers": cfg["num_hidden_layers"], "attention_layers": attention_layers(cfg),
        "num_attention_heads": heads,
        "num_key_value_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads, "vocab_size": cfg["vocab_size"],
        "tokenizer_size": len(tokenizer), "chat_template": tokenizer.chat_template is not None,
        "sliding_window": cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None,
        "parameters": _count(tensor_shapes(folder)) if folder.is_dir() else None,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "rope_theta": cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta"),
        "_tokenizer": tokenizer, "_config": cfg,
    }


def drafter_summary(folder: str | Path) -> dict[str, Any]:
    """Shape, feature layers, mask token and draft vocabulary of a DFlash drafter folder."""
    cfg = read_config(folder)
    ids = read_draft_vocab(folder)
    return {"folder": str(folder), "config": cfg, "parameters": _count(tensor_shapes(Path(folder))),
            "draft_vocab": None if ids is None else ids}


def describe_pair(target: dict[str, Any], drafter: dict[str, Any] | None, *, context: int = 2048,
                  dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """One JSON-ready description of a pair: both sides, memory at `context` tokens in `dtype`, problems."""
    size = dtype.itemsize
    t = {k: v for k, v in target.items() if not k.startswith("_")}
    kv = kv_bytes_per_token(t["attention_layers"], t["num_key_value_heads"], t["head_dim"], size)
    memory = {"dtype": str(dtype).removeprefix("torch."), "context_tokens": context,
              "target_parameters_bytes": (t["parameters"] or 0) * size, "target_kv_bytes_per_token": kv,
              "target_state_bytes": linear_state_bytes(target["_config"], size)}
    out: dict[str, Any] = {"target": t, "memory": memory, "problems": [], "warnings": []}
    if drafter is not None:
        out.update(_drafter_part(target, drafter, memory, context, size))
    memory["total_bytes"] = (memory["target_parameters_bytes"] + kv * context + memory["target_state_bytes"]
                             + memory.get("drafter_parameters_bytes", 0)
                             + memory.get("drafter_cache_bytes_per_token", 0) * context)
    return out


def _drafter_part(target: dict[str, Any], drafter: dict[str, Any], memory: dict[str, Any], context: int,
                  size: int) -> dict[str, Any]:
    cfg: DrafterConfig = drafter["config"]
    vocab = target["vocab_size"]
    ids = drafter["draft_vocab"]
    tokenizer = target["_tokenizer"]
    mask = cfg.mask_token_id
    d = {"folder": drafter["folder"], "architecture": "DFlash (Qwen3-style layers)",
         "num_hidden_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
         "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
         "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size, "block_size": cfg.block_size,
         "target_layer_ids": cfg.target_layer_ids, "num_target_layers": cfg.num_target_layers,
         "mask_token_id": mask, "mask_token": tokenizer.convert_ids_to_tokens(mask) if mask < len(tokenizer) else None,
         "rope_theta": cfg.rope_theta, "vocab_size": cfg.vocab_size, "parameters": drafter["parameters"],
         "draft_vocab": None if ids is None else len(ids)}
    memory["drafter_parameters_bytes"] = (drafter["parameters"] + (0 if ids is None else len(ids) * cfg.hidden_size)) * size
    memory["drafter_cache_bytes_per_token"] = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads,
                                                                 cfg.head_dim, size)
    warnings = []
    if cfg.vocab_size != vocab:
        warnings.append(f"drafter vocab_size={cfg.vocab_size} but the target has {vocab}: trained for another "
                        "tokenizer?")
    if ids is not None and len(ids) and int(ids.max()) >= vocab:
        warnings.append(f"draft vocabulary holds token {int(ids.max())}, outside the target vocabulary [0, {vocab})")
    if target["rope_theta"] and float(target["rope_theta"]) != cfg.rope_theta:
        warnings.append(f"drafter RoPE base {cfg.rope_theta:g} but the target's is {float(target['rope_theta']):g}")
    if mask in (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id):
        warnings.append(f"mask token {mask} is also the target's bos/eos/pad token")
    return {"drafter": d, "problems": pair_problems(cfg, target["hidden_size"], target["num_hidden_layers"], vocab),
            "warnings": warnings}


def format_pair(info: dict[str, Any]) -> str:
    """The human-readable form of `describe_pair`'s result."""
    t, m, mb = info["target"], info["memory"], 2**20
    params = f"{t['parameters'] / 1e6:.1f}M parameters" if t["parameters"] else "parameters unknown (not local)"
    hybrid = (f" ({t['num_hidden_layers'] - t['attention_layers']} of them linear attention)"
              if t["attention_layers"] < t["num_hidden_layers"] else "")
    lines = [f"target   {t['folder']}",
             f"  {t['architecture']}: {t['num_hidden_layers']} layers{hybrid}, hidden {t['hidden_size']}, "
             f"{t['num_attention_heads']} heads / {t['num_key_value_heads']} KV heads x {t['head_dim']}, vocab "
             f"{t['vocab_size']} (tokenizer {t['tokenizer_size']}), {params}",
             f"  chat template: {'yes' if t['chat_template'] else 'no'}; sliding window: {t['sliding_window']}; RoPE "
             f"base {t['rope_theta']}"]
    if "drafter" in info:
        d = info["drafter"]
        vocab = f"{d['draft_vocab']} tokens (draft_vocab.json)" if d["draft_vocab"] else "the target's full vocabulary"
        lines += [f"drafter  {d['folder']}",
                  f"  {d['architecture']}: {d['num_hidden_layers']} layers, hidden {d['hidden_size']}, "
                  f"{d['num_attention_heads']} heads / {d['num_key_value_heads']} KV heads, MLP "
                  f"{d['intermediate_size']}, {d['parameters'] / 1e6:.1f}M parameters (embedding and LM head are "
                  "the target's)",
                  f"  block size {d['block_size']}; target layer ids {d['target_layer_ids']} of "
                  f"{d['num_target_layers']}; mask token {d['mask_token_id']} ({d['mask_token']!r}); RoPE base "
                  f"{d['rope_theta']:g}",
                  f"  draft vocabulary: {vocab}"]
    cache = m["target_kv_bytes_per_token"] + m.get("drafter_cache_bytes_per_token", 0)
    lines.append(f"memory   ({m['dtype']}, {m['context_tokens']} tokens) target {m['target_parameters_bytes'] / mb:.0f} "
                 f"MB + KV {m['target_kv_bytes_per_token'] * m['context_tokens'] / mb:.1f} MB"
                 + (f" + states {m['target_state_bytes'] / mb:.1f} MB" if m["target_state_bytes"] else "")
                 + (f"; drafter {m['drafter_parameters_bytes'] / mb:.1f} MB + cache "
                    f"{m['drafter_cache_bytes_per_token'] * m['context_tokens'] / mb:.1f} MB" if "drafter" in info else "")
                 + f"; total {m['total_bytes'] / mb:.0f} MB ({cache / 1024:.1f} KiB of cache per token)")
    if "drafter" in info:
        verdict = "yes" if not info["problems"] else "NO: " + "; ".join(info["problems"])
        lines.append(f"match    {verdict}")
    lines += [f"warning  {w}" for w in info["warnings"]]
    return "\n".join(lines)

"""Drafter folders in the published DFlash format: `config.json` + `model.safetensors`.

Loading needs no remote code and never unpickles: only safetensors are read. Writes are atomic.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from blockdraft.errors import CheckpointError, InvalidArgumentError
from blockdraft.files import atomic_dir
from blockdraft.modeling.config import DrafterConfig
from blockdraft.modeling.draft_vocab import read_draft_vocab, save_draft_vocab
from blockdraft.modeling.drafter import Drafter, Rotary

log = logging.getLogger(__name__)

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
# Some early published drafters carried the target's embedding / head; they are the target's, not ours.
_IGNORED_PREFIXES = ("embed_tokens.", "lm_head.", "model.embed_tokens.")
_PICKLES = ("pytorch_model.bin", "model.pt", "model.pth", "pytorch_model.bin.index.json")


def read_config(folder: str | Path) -> DrafterConfig:
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG}; expected a DFlash drafter folder")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable JSON ({e})") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    return DrafterConfig.from_dict(raw)


def weight_files(folder: Path) -> list[Path]:
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    if (folder / INDEX).is_file():
        try:
            shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{folder / INDEX}: unreadable index ({e})") from e
        return [folder / s for s in shards]
    pickles = [p for p in _PICKLES if (folder / p).exists()]
    if pickles:
        raise CheckpointError(f"{folder}: found {pickles[0]} (pickle); only safetensors are loaded, "
                              "convert it with safetensors first")
    raise CheckpointError(f"{folder}: no {WEIGHTS}; expected a DFlash drafter folder")


def read_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """All drafter tensors of a folder (single file or sharded), minus target-owned ones."""
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(Path(folder)):
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    name = key.removeprefix("model.") if key.startswith("model.layers.") else key
                    if name.startswith(_IGNORED_PREFIXES):
                        log.info("ignoring %s in %s (the target's own weights are used)", key, path.name)
                        continue
                    state[name] = f.get_tensor(key)
        except (OSError, RuntimeError, ValueError, SafetensorError) as e:
            raise CheckpointError(f"{path}: unreadable safetensors ({e})") from e
    return state


def load_drafter(folder: str | Path, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> Drafter:
    """Load a drafter folder (ours or a published z-lab one) onto `device` in `dtype`."""
    config = read_config(folder)
    state = read_state_dict(folder)
    with torch.device("meta"):
        drafter = Drafter(config)
    expected = {k: v.shape for k, v in drafter.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{folder}: weights do not match the config "
                              f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
    for k, shape in expected.items():
        if state[k].shape != shape:
            raise CheckpointError(f"{folder}: {k} has shape {tuple(state[k].shape)}, expected {tuple(shape)}")
    drafter.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True)
    drafter.rotary = Rotary(config.head_dim, config.rope_theta, config.rope_scaling)  # not on meta
    drafter = drafter.to(device).eval()
    drafter.draft_vocab = read_draft_vocab(folder)
    return drafter


def save_drafter(drafter: Drafter, folder: str | Path, dtype: torch.dtype | None = None,
                 metadata: dict[str, str] | None = None) -> Path:
    """Write `drafter` as a published-format folder, atomically (a reader never sees half a folder)."""
    if dtype is not None and not dtype.is_floating_point:
        raise InvalidArgumentError(f"save dtype {dtype}: expected a floating-point dtype")
    if drafter.packed:
        raise InvalidArgumentError("this drafter's layers are prepacked for CPU inference (their dense weights are "
                                   "gone): expected an unpacked drafter, load it again to save it")
    folder = Path(folder)
    state = {k: v.detach().to("cpu", dtype or v.dtype).contiguous() for k, v in drafter.state_dict().items()}
    config = drafter.config.to_dict()
    config["torch_dtype"] = config["dtype"] = str(next(iter(state.values())).dtype).removeprefix("torch.")
    with atomic_dir(folder) as tmp:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt", **(metadata or {})})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        if drafter.draft_vocab is not None:
            save_draft_vocab(tmp, drafter.draft_vocab)
    return folder

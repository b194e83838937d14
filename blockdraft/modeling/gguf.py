"""GGUF models as targets: a `.gguf` file (Llama / Qwen2 / Qwen3) dequantised once to an fp32 Hugging Face folder.

The conversion goes through transformers' own GGUF reader, is written atomically (a crash leaves no
half-written model) and is marked with where it came from, so later loads find it in the cache and skip it.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch

from blockdraft.errors import CheckpointError
from blockdraft.files import atomic_dir, cache_home, sha256_of

log = logging.getLogger(__name__)

ARCHITECTURES = ("llama", "qwen2", "qwen3")  # what we convert: the families our fast path runs
MARKER = "blockdraft-source.json"


def convert_gguf(gguf: Path, dest: Path, source: dict[str, Any]) -> None:
    """Dequantise a GGUF model to an fp32 Hugging Face folder at `dest`, atomically; `source` goes to its marker."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.warning("converting %s to fp32 safetensors under %s (once; ~30 s for 135M parameters)", gguf.name, dest)
    folder, file = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    config = AutoConfig.for_model(**{k: v for k, v in quantised.config.to_dict().items()
                                     if k not in ("quantization_config", "_name_or_path")})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict())
    model.generation_config = quantised.generation_config
    with atomic_dir(dest) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(source, indent=2) + "\n")


def converted(dest: Path, key: str, value: str) -> bool:
    """Whether `dest` holds a finished conversion whose marker records `key` = `value`."""
    marker = dest / MARKER
    if not (marker.is_file() and (dest / "config.json").is_file() and (dest / "model.safetensors").is_file()):
        return False
    try:
        return json.loads(marker.read_text()).get(key) == value
    except (OSError, ValueError, AttributeError):
        return False


def gguf_architecture(path: Path) -> str:
    """`general.architecture` of a GGUF file (e.g. 'llama', 'qwen2'); a clear error when it is not one."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise CheckpointError(f"target {path}: not a readable GGUF file ({e})") from None


def gguf_target_dir(path: Path) -> Path:
    """The converted folder of a local GGUF file (Llama / Qwen2 / Qwen3), converting it once.

    Cached under `<cache>/targets/<name>-<id>`, the id naming this file (absolute path, size, mtime): a changed
    or moved file converts again. The marker also records the file's sha256."""
    stat = path.stat()
    ident = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    dest = cache_home() / "targets" / f"{path.stem}-{ident}"
    if converted(dest, "file_id", ident):
        return dest
    arch = gguf_architecture(path)
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"target {path}: GGUF architecture {arch!r}, expected one of "
                              f"{', '.join(ARCHITECTURES)} (the architectures our fast path runs)")
    convert_gguf(path, dest, {"gguf": str(path.resolve()), "file_id": ident, "sha256": sha256_of(path),
                              "architecture": arch})
    return dest



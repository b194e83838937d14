"""Device and dtype defaults: fp32 on CPU, bf16 on CUDA; both are always parameters."""
from __future__ import annotations

import torch

from blockdraft.errors import InvalidArgumentError


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on CPU (bf16 is slower there and fp32 keeps ties rare), bf16 on GPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def parse_dtype(name: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    if name is None or name == "auto":
        return default_dtype(device)
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}
    if name not in table:
        raise InvalidArgumentError(f"dtype {name!r}: expected one of {sorted(table)} or 'auto'")
    return table[name]

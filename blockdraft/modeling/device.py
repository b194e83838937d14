"""Device and dtype defaults: fp32 on CPU, bf16 on CUDA; both are always parameters."""
from __future__ import annotations

import torch

from blockdraft.errors import InvalidArgumentError


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on CPU (bf16 is slower there and fp32 keeps ties rare), bf16 on GPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX). Without either, oneDNN emulates bf16
    matmuls: a step of the drafter campaign took ~90 s in bf16 autocast against ~4 s in fp32 on a 2-core AVX2 EPYC."""
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if not all(callable(p) for p in probes):  # a torch without the probes: assume a modern CPU
        return True
    return any(p() for p in probes)


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

"""Device and dtype defaults (`blockdraft.modeling.device`)."""
import pytest
import torch

from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling import device as dev


def test_fp32_on_cpu_and_bf16_on_cuda():
    assert dev.default_dtype("cpu") == torch.float32 and dev.default_dtype(torch.device("cuda", 0)) == torch.bfloat16
    assert dev.default_device() == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("name, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("float16", torch.float16),
                                         ("float64", torch.float64), (torch.float16, torch.float16)])
def test_parse_dtype_names(name, dtype):
    assert dev.parse_dtype(name, "cpu") == dtype


def test_parse_dtype_defaults_and_errors():
    assert dev.parse_dtype(None, "cpu") == dev.parse_dtype("auto", "cpu") == torch.float32
    assert dev.parse_dtype("auto", "cuda") == torch.bfloat16
    with pytest.raises(InvalidArgumentError, match="dtype 'int8': expected one of"):
        dev.parse_dtype("int8", "cpu")


def test_native_bf16_is_what_the_probes_say(monkeypatch):
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False, raising=False)
    assert dev.cpu_has_native_bf16() is False
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert dev.cpu_has_native_bf16() is True
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", None)  # a torch without the probe: assume modern
    assert dev.cpu_has_native_bf16() is True

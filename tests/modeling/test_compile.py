import pytest
import torch

from blockdraft.decoding.engine import SpeculativeEngine
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling import compile as compile_module
from blockdraft.modeling.compile import compile_pair
from blockdraft.modeling.fast_target import FastTarget
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_drafter, tiny_hf_model
from tests.decoding.test_engine import decode


@pytest.mark.slow
def test_compiled_pair_decodes_the_same_tokens():
    """Inductor for real (seconds to minutes of compiling on a cold cache)."""
    target = FastTarget(tiny_hf_model("llama", dtype=torch.float32))
    drafter = tiny_drafter(target, block_size=4).float()
    engine = SpeculativeEngine(target, drafter)
    prompt = [5, 9, 2, 44, 17]
    before = decode(engine, prompt, max_new_tokens=12)[0]
    keys = set(drafter.state_dict())
    compile_pair(target, drafter)
    assert decode(engine, prompt, max_new_tokens=12)[0] == before
    assert set(drafter.state_dict()) == keys  # checkpoints keep their names


def test_what_is_compiled_and_what_is_refused(monkeypatch, caplog):
    compiled = []
    monkeypatch.setattr(compile_module, "_compile", lambda module, mode: compiled.append((module, mode)))
    target = FastTarget(tiny_hf_model("llama", dtype=torch.float32))
    drafter = tiny_drafter(target, block_size=4).float()
    compile_pair(target, drafter, "max-autotune")
    assert compiled == [(layer.mlp, "max-autotune") for layer in target.layers] + \
        [(layer, "max-autotune") for layer in drafter.layers]  # the dense blocks, not the loop around them
    compiled.clear()
    compile_pair(TargetModel(tiny_hf_model("llama", dtype=torch.float32)), drafter)
    assert compiled == [(layer, "default") for layer in drafter.layers] and "compiling only the drafter" in caplog.text
    with pytest.raises(InvalidArgumentError, match="mode 'fast'"):
        compile_pair(target, drafter, "fast")
    with pytest.raises(InvalidArgumentError, match="needs a CUDA device"):
        compile_pair(target, drafter, "reduce-overhead")

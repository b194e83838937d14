import pytest
import torch

from blockdraft.decoding.engine import SpeculativeEngine
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.compile import compile_pair
from blockdraft.modeling.fast_target import FastTarget
from tests.conftest import tiny_drafter, tiny_hf_model
from tests.decoding.test_engine import decode


def test_compiled_pair_decodes_the_same_tokens():
    target = FastTarget(tiny_hf_model("llama", dtype=torch.float32))
    drafter = tiny_drafter(target, block_size=4).float()
    engine = SpeculativeEngine(target, drafter)
    prompt = [5, 9, 2, 44, 17]
    before = decode(engine, prompt, max_new_tokens=12)[0]
    keys = set(drafter.state_dict())
    compile_pair(target, drafter)
    assert decode(engine, prompt, max_new_tokens=12)[0] == before
    assert set(drafter.state_dict()) == keys  # checkpoints keep their names
    with pytest.raises(InvalidArgumentError, match="mode 'fast'"):
        compile_pair(target, drafter, "fast")
    with pytest.raises(InvalidArgumentError, match="needs a CUDA device"):
        compile_pair(target, drafter, "reduce-overhead")

"""config.json fields the engines read that our own loader did not need: both RoPE spellings, the mask string."""
import json

import pytest

from blockdraft.errors import CheckpointError, InvalidArgumentError
from blockdraft.modeling.config import DrafterConfig
from tests.export import engines as E
from tests.modeling.test_config import PUBLISHED_QWEN3_8B


@pytest.mark.parametrize("scaling, parameters", [
    (None, {"rope_type": "default", "rope_theta": 5e5}),
    ({"rope_type": "linear", "factor": 4.0}, {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5}),
    ({"type": "linear", "factor": 2.0}, {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}),  # older spelling
])
def test_rope_is_written_both_ways(scaling, parameters):
    cfg = DrafterConfig.from_dict(dict(PUBLISHED_QWEN3_8B, rope_theta=5e5, rope_scaling=scaling))
    out = cfg.to_dict()
    assert out["rope_theta"] == 5e5 and out["rope_scaling"] == scaling and out["rope_parameters"] == parameters
    assert E.rope_bases(out) == {"rope_parameters": 5e5, "rope_theta": 5e5}
    assert DrafterConfig.from_dict(json.loads(json.dumps(out))) == cfg


def test_spellings_that_disagree_are_refused():
    with pytest.raises(CheckpointError, match="rope_theta=1000000 but rope_parameters.rope_theta=10000"):
        DrafterConfig.from_dict(dict(PUBLISHED_QWEN3_8B, rope_parameters={"rope_type": "default", "rope_theta": 1e4}))


def test_the_mask_string_round_trips_in_dflash_config():
    d = dict(PUBLISHED_QWEN3_8B, dflash_config=dict(PUBLISHED_QWEN3_8B["dflash_config"], mask_token="<|MASK|>"))
    cfg = DrafterConfig.from_dict(d)
    assert cfg.mask_token == "<|MASK|>" and cfg.to_dict()["dflash_config"]["mask_token"] == "<|MASK|>"
    assert "mask_token" not in DrafterConfig.from_dict(PUBLISHED_QWEN3_8B).to_dict()["dflash_config"]
    with pytest.raises(InvalidArgumentError, match="mask_token=''"):
        DrafterConfig.from_dict(dict(d, dflash_config=dict(d["dflash_config"], mask_token="")))

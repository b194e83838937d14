import pytest
import torch

from blockdraft.decoding.sampling import SamplingParams, probabilities, sample_index
from blockdraft.errors import InvalidArgumentError


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1}, "temperature=-1"), ({"temperature": float("nan")}, "temperature=nan"),
    ({"top_k": -2}, "top_k=-2"), ({"top_p": 0}, "top_p=0"), ({"top_p": 1.5}, "top_p=1.5"),
    ({"draft": "beam"}, "draft='beam'"), ({"seed": "x"}, "seed='x'"),
])
def test_bad_params(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        SamplingParams(**kwargs)


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 3.0])
    p = probabilities(logits, SamplingParams(temperature=2.0))
    assert torch.allclose(p, torch.softmax(logits / 2, -1))


def test_top_k_keeps_the_k_largest():
    p = probabilities(torch.tensor([[1.0, 4.0, 3.0, 2.0]]), SamplingParams(temperature=1.0, top_k=2))
    assert (p[0] > 0).tolist() == [False, True, True, False]
    assert torch.allclose(p.sum(), torch.tensor(1.0))


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    keep = lambda top_p: (probabilities(logits, SamplingParams(temperature=1.0, top_p=top_p)) > 0).tolist()  # noqa
    assert keep(0.5) == [True, False, False, False]
    assert keep(0.51) == [True, True, False, False]
    assert keep(0.8) == [True, True, False, False]
    assert keep(0.81) == [True, True, True, False]
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert torch.allclose(p[:3], torch.tensor([0.5, 0.3, 0.15]) / 0.95)


def test_top_k_then_top_p_on_batched_rows():
    logits = torch.randn(5, 50)
    p = probabilities(logits, SamplingParams(temperature=0.7, top_k=10, top_p=0.9))
    assert ((p > 0).sum(-1) <= 10).all() and torch.allclose(p.sum(-1), torch.ones(5))


def test_inverse_cdf_never_picks_zero_weight():
    w = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    for u, expected in [(0.0, 1), (0.2499, 1), (0.25, 3), (0.9999999, 3)]:
        assert sample_index(w, torch.tensor(u, dtype=torch.float64)).item() == expected


def test_inverse_cdf_rounding_never_lands_on_a_truncated_token():
    w = torch.tensor([0.5, 0.5, 0.0, 0.0])
    for u in (1 - 1e-9, 1 - 1e-17, 0.99999999999):
        assert sample_index(w, torch.tensor(u, dtype=torch.float64)).item() == 1
    rows = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sample_index(rows, torch.tensor([1 - 1e-12, 1 - 1e-12], dtype=torch.float64)).tolist() == [1, 0]

"""Tiny drafters exported with `blockdraft export`: what the engine rules of tests/export/engines.py check."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from blockdraft.cli import main
from blockdraft.modeling.checkpoint import save_drafter
from blockdraft.modeling.drafter import Drafter
from blockdraft.modeling.pair import tensor_shapes
from blockdraft.modeling.target import TargetModel
from tests.conftest import tiny_drafter

KINDS = {"full": {}, "sliding": {"layers": 3, "sliding_window": 4}}  # all layers bidirectional; 2 sliding + 1 full


def export(tmp: Path, drafter: Drafter, *args: str) -> Path:
    """Save `drafter` (our training output), then `blockdraft export` it with `args`; the exported folder."""
    src = save_drafter(drafter, tmp / "src")
    out = tmp / "out"
    assert main(["export", "--drafter", str(src), "--out", str(out), *args]) == 0
    return out


def read(folder: Path) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """config.json and {tensor name: shape} of a drafter folder: what the engines' loaders read."""
    shapes = {name: tuple(shape) for name, (_dtype, shape) in tensor_shapes(folder).items()}
    return json.loads((folder / "config.json").read_text()), shapes


@pytest.fixture(scope="package")
def tiny_target(tiny_target_dir) -> TargetModel:
    return TargetModel.from_pretrained(tiny_target_dir)


@pytest.fixture(scope="package", params=sorted(KINDS))
def exported(request, tiny_target, tiny_target_dir, tmp_path_factory) -> Path:
    drafter = tiny_drafter(tiny_target, block_size=8, **KINDS[request.param])
    return export(tmp_path_factory.mktemp(request.param), drafter, "--target", str(tiny_target_dir))

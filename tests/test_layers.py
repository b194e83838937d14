"""The package's folders are its layers: no module imports one from a layer above it (or a sibling front end)."""
import ast
from pathlib import Path

import pytest

import blockdraft

PACKAGE = Path(blockdraft.__file__).parent
# group -> rank; a module may import its own group and any group of a lower rank, nothing else.
LAYERS = {
    "helpers": 0,   # errors, files, prompts: shared by every layer
    "modeling": 1,  # model code
    "decoding": 2,  # sampling, acceptance, policies, engines, stats
    "api": 3,       # the Python front end
    "serving": 4, "bench": 4, "train": 4,  # front ends built on the API (siblings: independent)
    "qualify": 5,   # the deployment pilot, built on the bench harness (and the server, through its command line)
    "cli": 6,
}
HELPERS = {"errors", "files", "prompts"}


def group(module: str) -> str:
    """'blockdraft.decoding.engine' -> 'decoding'; top-level helper modules -> 'helpers'."""
    head = module.split(".")[1]
    return "helpers" if head in HELPERS else head


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def imported(path: Path) -> set[str]:
    """Every `blockdraft.*` module the file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("blockdraft."):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("blockdraft."))
    return names


def test_every_module_belongs_to_a_layer():
    for path in modules():
        name = "blockdraft." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        assert group(name) in LAYERS, f"{name} is in no layer: add its folder to LAYERS"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_up_or_across(path):
    own = group("blockdraft." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    for name in imported(path):
        other = group(name)
        allowed = other == own or LAYERS[other] < LAYERS[own]
        assert allowed, f"{path.relative_to(PACKAGE)} ({own}) imports {name} ({other})"


def test_the_check_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from blockdraft.api import Pipeline\n")
    assert imported(bad) == {"blockdraft.api"} and LAYERS[group("blockdraft.api")] > LAYERS["decoding"]

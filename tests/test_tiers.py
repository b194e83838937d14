"""The quick tier (`pytest -m "not slow"`) reaches every module of the package.

`make test` runs everything; the quick tier leaves out what is marked `slow` (the real default target,
several processes, a browser, the long statistical runs). Each module under blockdraft/ that holds code must
still be reached by a test file of the quick tier: imported at its top (when the file has at least one quick
test), in a quick test, in Python source it runs in a subprocess (`python -c`), or in a helper of tests/ it
imports (conftest.py files included, for the test files under them); or its mirror, tests/<path>/test_<name>.py,
is in the quick tier (e.g. tests/train/test_command.py runs `blockdraft train` through `cli.main`).

Read from the source with `ast`, so the check costs nothing and needs no test to run. What it cannot see:
whether a quick test calls what it imports, and skips decided at run time (`pytest.skip`); a file whose tests
all may be skipped (a module-level `pytestmark` with `skipif`, e.g. the CUDA tests) does not count.
"""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "blockdraft"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> set[str]:
    """Every module of the package that defines something (a package's __init__ that only re-exports runs
    whenever one of its modules is imported)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        defines = any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in tree.body)
        if path.name != "__init__.py" or defines:
            names.add(module_name(path))
    return names


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def slow(node: ast.AST) -> bool:
    """A test function or class marked `slow` by a decorator."""
    return any("mark.slow" in ast.unparse(d) for d in getattr(node, "decorator_list", []))


def file_marks(tree: ast.Module) -> str:
    """The source of the file's module-level `pytestmark`, if any."""
    return " ".join(ast.unparse(node.value) for node in tree.body if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets))


def quick_tests(tree: ast.Module) -> list[str]:
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test") and not slow(node):
            found += [f.name for f in node.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test")
                      and not slow(f)]
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test") and not slow(node):
            found.append(node.name)
    return found


def imports(node: ast.AST) -> set[str]:
    """Modules imported anywhere under `node`, except inside tests marked slow."""
    found = set()
    for child in ast.iter_child_nodes(node):
        if slow(child):
            continue
        if isinstance(child, ast.Import):
            found |= {alias.name for alias in child.names}
        elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
            found.add(child.module)
            found |= {f"{child.module}.{alias.name}" for alias in child.names
                      if is_module(f"{child.module}.{alias.name}")}
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):  # source run with `python -c`
            found |= set(SOURCE_IMPORT.findall(child.value))
        found |= imports(child)
    return found


SOURCE_IMPORT = re.compile(r"^\s*(?:from|import)\s+(blockdraft[\w.]*)", re.MULTILINE)


@cache
def reached_from(path: Path) -> frozenset[str]:
    """Package modules a helper file of tests/ imports, following the helpers it imports in turn."""
    return frozenset(_expand(imports(ast.parse(path.read_text()))))


def _expand(names: set[str]) -> set[str]:
    out = set()
    for name in names:
        if name.startswith("tests.") and not name.endswith("conftest"):
            path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
            if path.is_file():
                out |= reached_from(path)
        elif name == "blockdraft" or name.startswith("blockdraft."):
            parts = name.split(".")
            out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}  # importing runs the packages above
    return out


def quick_tier_imports() -> dict[str, set[str]]:
    """{test file: the package modules it reaches} for the test files of the quick tier."""
    reached = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        marks = file_marks(tree)
        if "mark.slow" in marks or "skipif" in marks or not quick_tests(tree):
            continue
        conftests = [folder / "conftest.py" for folder in path.parents if folder.is_relative_to(ROOT / "tests")]
        helpers = set().union(*(reached_from(c) for c in conftests if c.is_file()))
        reached[str(path.relative_to(ROOT))] = _expand(imports(tree)) | helpers
    return reached


def mirror(module: str) -> str:
    """blockdraft.a.b -> tests/a/test_b.py"""
    *folders, name = module.split(".")[1:]
    return str(Path("tests", *folders, f"test_{name}.py"))


def test_the_quick_tier_reaches_every_module_of_the_package():
    files = quick_tier_imports()
    reached = set().union(*files.values())
    missing = sorted(m for m in package_modules() - reached if mirror(m) not in files)
    assert not missing, f"no quick test imports {missing}: add one, or a cheaper variant of a slow one"


def test_the_check_sees_slow_marks_and_helpers():
    tree = ast.parse("import pytest\nimport blockdraft.a\n"
                     "@pytest.mark.slow\ndef test_x():\n    import blockdraft.b\n"
                     "def test_y():\n    from blockdraft.c import d\n")
    assert imports(tree) == {"pytest", "blockdraft.a", "blockdraft.c"} and quick_tests(tree) == ["test_y"]
    assert file_marks(ast.parse("import pytest\npytestmark = [pytest.mark.slow]\n")) == "[pytest.mark.slow]"
    assert imports(ast.parse('CODE = """\nimport os\nfrom blockdraft.train.allocator import x\n"""')) == {
        "blockdraft.train.allocator"}
    assert "blockdraft.modeling.pair" in reached_from(ROOT / "tests" / "export" / "conftest.py")
    assert mirror("blockdraft.train.command") == "tests/train/test_command.py" and mirror("blockdraft.api") == \
        "tests/test_api.py"
    packages = {"blockdraft", "blockdraft.decoding", "blockdraft.decoding.engine"}
    assert packages <= _expand({"blockdraft.decoding.engine"})

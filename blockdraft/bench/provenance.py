"""Which code and machine a measurement ran on: the git commit of this checkout, the tracked files that differed
from it, and a one-line name of the machine from a run's environment record (`bench.report.environment`).

Only what can change a figure counts as a change (the package with its weights, scripts, the build files), so
a benchmark that rewrites its own tracked output under docs/ does not mark the runs after it. Kept free of
torch so that the sweep driver and the results table stay light.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[2]
CODE = ("blockdraft", "scripts", "pyproject.toml", "Makefile")  # what a figure depends on


def _git(*args: str) -> str | None:
    """git's output in this checkout; None where there is no git or ROOT is not a work tree of its own (an
    installed package inside some other repository)."""
    try:
        top = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=5)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != ROOT:
            return None
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
        return out.stdout if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def git_provenance() -> dict[str, Any]:
    """{'git_commit': the full hash or None, 'git_dirty': whether CODE differed from it (None: unknown),
    'git_changes': the differing paths under CODE}."""
    commit = (_git("rev-parse", "HEAD") or "").strip() or None
    diff = _git("diff", "--name-only", "HEAD", "--", *CODE) if commit else None
    changes = diff.split() if diff is not None else []
    return {"git_commit": commit, "git_dirty": None if diff is None else bool(changes), "git_changes": changes}


def commit_label(envs: Iterable[dict[str, Any]]) -> str:
    """The runs' commit(s), short, with '+ uncommitted changes' where any run's code differed from its commit."""
    envs = list(envs)
    commits = list(dict.fromkeys((e.get("git_commit") or "?")[:7] for e in envs))
    dirty = any(e.get("git_dirty") for e in envs)
    return ", ".join(commits) + (" + uncommitted changes" if dirty else "")


def machine(env: dict[str, Any]) -> str:
    """'<CPU or GPU> (<kernels> kernels), N threads, <dtype>' from a run's environment record."""
    return (f"{env.get('cpu_model') or env['device_name']} ({env.get('cpu_capability', '?')} kernels), "
            f"{env['torch_threads']} threads, {env['dtype']}")

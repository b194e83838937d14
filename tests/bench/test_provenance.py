"""A measurement records its commit, and marks code changes (not its own tracked output under docs/)."""
import subprocess

import pytest

from blockdraft.bench import provenance


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    for path in ("blockdraft/x.py", "docs/figures/run/bench.json"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("0\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    monkeypatch.setattr(provenance, "ROOT", tmp_path.resolve())
    return tmp_path


def test_code_changes_mark_a_run_and_its_own_output_does_not(repo):
    clean = provenance.git_provenance()
    assert len(clean["git_commit"]) == 40 and clean["git_dirty"] is False and clean["git_changes"] == []
    (repo / "docs/figures/run/bench.json").write_text("1\n")  # an earlier run of the same script
    assert provenance.git_provenance()["git_dirty"] is False
    (repo / "blockdraft/x.py").write_text("1\n")
    dirty = provenance.git_provenance()
    assert dirty["git_dirty"] is True and dirty["git_changes"] == ["blockdraft/x.py"]
    assert provenance.commit_label([clean, dirty]) == f"{clean['git_commit'][:7]} + uncommitted changes"


def test_a_package_inside_another_repository_records_nothing(repo, monkeypatch):
    monkeypatch.setattr(provenance, "ROOT", (repo / "blockdraft").resolve())  # e.g. site-packages in some repo
    assert provenance.git_provenance() == {"git_commit": None, "git_dirty": None, "git_changes": []}
    assert provenance.commit_label([provenance.git_provenance()]) == "?"

"""scripts/submission_size.py: what a session's commits cost against the landing limits, counted on a real repo."""
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "submission_size.py"
MIB = 1024 * 1024


@pytest.fixture
def script():
    spec = importlib.util.spec_from_file_location("submission_size", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for key, value in {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                       "GIT_COMMITTER_EMAIL": "t@t"}.items():
        monkeypatch.setenv(key, value)
    subprocess.run(["git", "init", "-q", "-b", "main"], check=True)
    return tmp_path


def commit(message: str) -> str:
    subprocess.run(["git", "add", "-A"], check=True)
    subprocess.run(["git", "commit", "-q", "-m", message], check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_replacing_a_file_counts_its_old_and_new_bytes(repo, script, capsys):
    (repo / "notes.txt").write_text("landed\n")
    base = commit("landed")
    (repo / "stash.bin").write_bytes(os.urandom(MIB))  # added: 1 MiB
    commit("stash")
    (repo / "stash.bin").write_bytes(os.urandom(2 * MIB))  # replaced: 1 MiB out, 2 MiB in
    (repo / "notes.txt").unlink()  # removed: 7 bytes
    last = commit("stash again")
    assert script.commit_diff_bytes(last) == 3 * MIB + 7
    assert script.main(["--base", base]) == 0
    out = capsys.readouterr().out
    assert "2 commits since" in out and "diffs <= 4.0 MiB of 256" in out


def test_over_a_limit_exits_1_and_says_so(repo, script, capsys):
    (repo / "a.txt").write_text("a\n")
    base = commit("landed")
    (repo / "big.bin").write_bytes(os.urandom(2 * MIB))
    commit("big")
    assert script.main(["--base", base, "--diff-limit-mib", "1"]) == 1
    assert "over a landing limit" in capsys.readouterr().err
    # the incompressible 2 MiB also pack to ~2 MiB, over a 1 MiB pack limit
    assert script.main(["--base", base, "--pack-limit-mib", "1"]) == 1


def test_default_base_is_where_the_checkout_started(repo, script, capsys):
    (repo / "a.txt").write_text("a\n")
    first = commit("first")
    (repo / "b.txt").write_text("b\n")
    commit("second")
    assert script.session_base() == first
    assert script.main([]) == 0
    assert "1 commits since" in capsys.readouterr().out

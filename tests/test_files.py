"""Atomic writes and the cache folder (`blockdraft.files`)."""
import hashlib
import os
from pathlib import Path

import pytest

from blockdraft.files import atomic_dir, atomic_path, cache_home, sha256_of


def test_sha256_of_is_the_hash_of_the_bytes(tmp_path):
    data = os.urandom(3 << 20)  # more than one 1 MiB chunk
    (tmp_path / "f").write_bytes(data)
    assert sha256_of(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_cache_home_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path))
    assert cache_home() == tmp_path
    monkeypatch.delenv("BLOCKDRAFT_HOME")
    assert cache_home() == Path.home() / ".cache" / "blockdraft"


def test_atomic_path_replaces_the_file_only_when_the_body_succeeds(tmp_path):
    final = tmp_path / "sub" / "out.json"
    with atomic_path(final) as tmp:
        tmp.write_text("one")
        assert not final.exists()
    assert final.read_text() == "one"
    with pytest.raises(RuntimeError), atomic_path(final) as tmp:
        tmp.write_text("two")
        raise RuntimeError("interrupted")
    assert final.read_text() == "one" and sorted(p.name for p in final.parent.iterdir()) == ["out.json"]


def test_atomic_dir_swaps_the_whole_folder_or_nothing(tmp_path):
    final = tmp_path / "model"
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("1")
    with atomic_dir(final) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["b"]  # the old folder's files are gone with it
    with pytest.raises(RuntimeError), atomic_dir(final) as tmp:
        (tmp / "c").write_text("3")
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in final.iterdir()) == ["b"] and sorted(p.name for p in tmp_path.iterdir()) == ["model"]

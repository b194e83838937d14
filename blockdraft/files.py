"""Atomic file writes and the blockdraft cache folder."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_home() -> Path:
    """Root of blockdraft's caches: `$BLOCKDRAFT_HOME`, else `~/.cache/blockdraft`."""
    return Path(os.environ.get("BLOCKDRAFT_HOME") or Path.home() / ".cache" / "blockdraft")


@contextmanager
def atomic_path(final: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `final`; rename it over `final` only if the body succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    tmp_path.chmod(0o666 & ~_umask())
    try:
        yield tmp_path
        os.replace(tmp_path, final)
    finally:
        tmp_path.unlink(missing_ok=True)


@contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary folder next to `final`; it replaces `final` only if the body succeeds.

    The swap is two renames (old folder aside, new folder in), so a reader never sees a half-written
    folder; a crash between them leaves the old folder under a `.old` name, never a mix of both.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    tmp.chmod(0o777 & ~_umask())
    try:
        yield tmp
        for f in tmp.rglob("*"):  # some writers create files 0600; give them the usual permissions
            if f.is_file():
                f.chmod(0o666 & ~_umask())
        if final.exists():
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

"""A run's latest resumable checkpoint, copied as pieces of at most 32 MiB with a sha256 manifest
(`blockdraft train --stash DIR`), for moving a training run between machines: copy DIR to the other machine
(the pieces fit stores and transfers that cap a file's size) and `train --resume --stash DIR` there goes on from it.

    DIR/step-0001200/manifest.json                  the files, their pieces and each piece's sha256
    DIR/step-0001200/trainer.json, drafter/config.json ...   small files, as they are
    DIR/step-0001200/optimizer.safetensors.00, .01 ...       safetensors files cut into pieces of whole tensors
    DIR/metrics.jsonl                                the run's metrics up to that step

Every checkpoint the run saves replaces the stash (a new step folder, written aside and renamed into place,
then the older one removed), so the folder always holds one complete step, the latest. Restoring
rebuilds `RUN/checkpoints/step-N` with the same tensors, and `--resume` goes on from it bitwise as from a
checkpoint that never left the machine.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from blockdraft.errors import InvalidArgumentError
from blockdraft.files import atomic_dir, atomic_path, sha256_of

log = logging.getLogger(__name__)

PIECE_BYTES = 32 * 2**20  # small enough for file stores and transfers that cap a file's size
MANIFEST = "manifest.json"


def stash_checkpoint(checkpoint: Path, dest: Path, metrics: Path | None = None,
                     piece_bytes: int = PIECE_BYTES) -> Path:
    """Copy `checkpoint` (a step folder) to `dest/<its name>` in pieces of at most `piece_bytes` (a tensor
    larger than that gets a piece of its own), with `metrics` next to it; remove older steps from `dest`."""
    if piece_bytes < 1:
        raise InvalidArgumentError(f"piece_bytes={piece_bytes}: expected a positive size")
    files: dict[str, list[str]] = {}
    with atomic_dir(dest / checkpoint.name) as tmp:
        for f in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
            rel = f.relative_to(checkpoint).as_posix()
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            if f.suffix == ".safetensors":
                files[rel] = _cut(f, tmp, rel, piece_bytes)
            else:
                shutil.copyfile(f, tmp / rel)
                files[rel] = [rel]
        digests = {piece: sha256_of(tmp / piece) for pieces in files.values() for piece in pieces}
        (tmp / MANIFEST).write_text(json.dumps({"files": files, "sha256": digests}, indent=1))
    if metrics is not None:
        stash_metrics(metrics, dest)
    for old in _steps(dest)[:-1]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("stashed %s in %s (%d pieces)", checkpoint.name, dest, len(digests))
    return dest / checkpoint.name


def stash_metrics(metrics: Path, dest: Path) -> None:
    """Copy the run's `metrics` into `dest` (atomically), e.g. once the final evaluation is logged."""
    if metrics.is_file():
        with atomic_path(dest / "metrics.jsonl") as tmp:
            shutil.copyfile(metrics, tmp)


def stashed_drafter(dest: Path, out: Path) -> Path | None:
    """The drafter folder of the latest step stashed in `dest`, rebuilt under `out`; None when `dest` is no
    stash (e.g. a drafter folder)."""
    step = restore_checkpoint(dest, out) if dest.is_dir() else None
    return None if step is None else step / "drafter"


def restore_checkpoint(dest: Path, out: Path) -> Path | None:
    """Rebuild the latest step stashed in `dest` as `out/checkpoints/<step>` (and `out/metrics.jsonl` when the
    run has none); None when `dest` holds no step. A piece whose sha256 differs from the manifest's is an
    error that names it (a truncated download, a bad merge), never a half-restored run."""
    steps = _steps(dest)
    if not steps:
        return None
    stashed = steps[-1]
    manifest = json.loads((stashed / MANIFEST).read_text())
    for piece, digest in manifest["sha256"].items():
        if not (stashed / piece).is_file() or sha256_of(stashed / piece) != digest:
            raise InvalidArgumentError(f"stashed checkpoint piece {stashed / piece}: missing or its sha256 differs "
                                       f"from {stashed / MANIFEST}'s; expected the pieces as stashed")
    with atomic_dir(out / "checkpoints" / stashed.name) as tmp:
        for rel, pieces in manifest["files"].items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            if rel.endswith(".safetensors"):
                _join([stashed / p for p in pieces], tmp / rel)
            else:
                shutil.copyfile(stashed / rel, tmp / rel)
    if (dest / "metrics.jsonl").is_file() and not (out / "metrics.jsonl").is_file():
        shutil.copyfile(dest / "metrics.jsonl", out / "metrics.jsonl")
    log.warning("restored %s from %s", stashed.name, dest)
    return out / "checkpoints" / stashed.name


def _steps(dest: Path) -> list[Path]:
    return sorted((p for p in dest.glob("step-[0-9]*") if (p / MANIFEST).is_file()),
                  key=lambda p: int(p.name.split("-")[1]))


def _cut(source: Path, folder: Path, rel: str, piece_bytes: int) -> list[str]:
    """Write the tensors of `source` as `folder/rel.00`, `.01` ... of at most `piece_bytes` of tensor data each
    (the file's metadata goes with every piece); returns the pieces' names relative to `folder`."""
    with safe_open(str(source), "pt") as f:
        metadata = f.metadata()
    pieces: list[dict] = [{}]
    size = 0
    for name, t in load_file(str(source)).items():
        nbytes = t.numel() * t.element_size()
        if pieces[-1] and size + nbytes > piece_bytes:
            pieces.append({})
            size = 0
        pieces[-1][name] = t
        size += nbytes
    names = [f"{rel}.{i:02d}" for i in range(len(pieces))]
    for name, piece in zip(names, pieces):
        save_file(piece, str(folder / name), metadata=metadata)
    return names


def _join(pieces: list[Path], target: Path) -> None:
    tensors: dict = {}
    metadata = None
    for piece in pieces:
        with safe_open(str(piece), "pt") as f:
            metadata = metadata or f.metadata()
        tensors.update(load_file(str(piece)))
    save_file(tensors, str(target), metadata=metadata)

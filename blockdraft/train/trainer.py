"""`blockdraft train`: one readable loop, from regenerated data to a drafter in the published format.

    config -> target (frozen) + drafter -> data (sequences, features) -> loop:
        micro-batch of sequences -> random anchors (re-drawn every epoch) -> blocks -> drafter forward
        -> weighted block loss -> AdamW step (cosine schedule, warmup, grad clip) -> log / eval / checkpoint
    -> export the final drafter (config.json + model.safetensors)

All randomness (epoch order, anchors) is a function of (seed, epoch, sequence), so a resumed run replays
exactly what an uninterrupted run would do. Runs under `torchrun` with DistributedDataParallel (gloo on
CPU, nccl on CUDA); rank r takes every world-th sequence; only rank 0 writes.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm

from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.replay import replay_acceptance
from blockdraft.decoding.stats import GenerationStats
from blockdraft.errors import InvalidArgumentError
from blockdraft.files import atomic_dir, atomic_path
from blockdraft.modeling.checkpoint import load_drafter, save_drafter
from blockdraft.modeling.config import DrafterConfig
from blockdraft.modeling.device import cpu_has_native_bf16
from blockdraft.modeling.drafter import Drafter, MaskFn
from blockdraft.modeling.target import TargetModel
from blockdraft.train.blocks import build_blocks, dense_mask_fn, flex_mask_fn, grouped_mask_fn, sample_anchors
from blockdraft.train.data import Sequence
from blockdraft.train.distill import block_soft_targets
from blockdraft.train.features import FeatureSource, OnlineFeatures
from blockdraft.train.init import init_from_target
from blockdraft.train.loss import block_loss, default_gamma, estimated_acceptance_length
from blockdraft.train.stash import stash_checkpoint, stash_metrics
from blockdraft.train.stopping import GracefulStop
from blockdraft.train.vocab import TrainVocab

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    out: str
    epochs: float = 6.0
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    batch_size: int = 1          # sequences per micro-batch (per rank)
    grad_accum: int = 1
    max_anchors: int = 512
    loss: str = "decay"
    gamma: float | None = None   # None: the paper's value for the block size
    save_every: int = 200
    keep_checkpoints: int = 2
    log_every: int = 10
    eval_every: int = 0          # 0: only at the end
    eval_prompts: int = 8
    eval_max_new_tokens: int = 64
    max_steps: int | None = None  # stop early (the schedule still spans all epochs); 0: only save and evaluate
    time_budget: float | None = None  # seconds of training: the schedule is re-planned to end on time
    attention: str = "auto"       # "flex" on CUDA, "grouped" (dense masks cut into query groups) elsewhere
    vocab: str = "full"           # "full", or "data": the data's label tokens + `vocab_negatives` per step
    vocab_negatives: int = 2048
    distill: float = 0.0          # weight of the teacher's top-k distribution in each slot's loss (0: labels only)
    distill_topk: int = 16
    labels: str = "data"          # "data": the data's tokens; "target": the target's greedy tokens (any text)
    stash: str | None = None      # a folder that keeps the latest checkpoint in pieces of at most 32 MiB (train.stash)
    autocast: str = "auto"        # "bf16": the drafter's forward in bfloat16 autocast; "off"; "auto": bf16 on CUDA
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # recorded as-is (data, target, features...)


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warmup over warmup_ratio of the steps, then cosine down to min_lr_ratio * lr."""
    warm = max(1, int(round(cfg.warmup_ratio * total)))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    floor = cfg.min_lr_ratio
    return cfg.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def anchor_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 10_000_019 + index)


# training attention: dense masks + SDPA (anywhere), the same cut into query groups (CPU), flex_attention (GPU)
MASKS = {"sdpa": dense_mask_fn, "grouped": grouped_mask_fn, "flex": flex_mask_fn}
PLAN_WARMUP_STEPS, PLAN_TIMED_STEPS = 5, 20  # a time budget re-plans the schedule from steps 6..25


class BlockForward(nn.Module):
    """The drafter's training forward as one module call, so DistributedDataParallel sees it."""

    def __init__(self, drafter: Drafter) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(self, features: torch.Tensor, block_emb: torch.Tensor, positions: torch.Tensor,
                mask_fn: MaskFn) -> torch.Tensor:
        """features (b, T, K*D), block_emb (b, N*B, D), positions (b, N*B) -> hidden (b, N*B, D)."""
        b, t = features.shape[:2]
        ctx_pos = torch.arange(t, device=features.device).expand(b, -1)
        ctx = self.drafter.context_kv(features, ctx_pos)
        return self.drafter(block_emb, positions, ctx, ctx_pos, mask_fn)


def block_logits(drafter: Drafter, target: TargetModel, seqs: list[Sequence], feats: list[torch.Tensor],
                 anchors: list[torch.Tensor], forward: nn.Module | None = None,
                 attention: str = "sdpa", rows: torch.Tensor | None = None,
                 greedy: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, Any]:
    """Draft logits (b, N*B, V) of anchored blocks of `seqs`, and the Blocks (labels, mask...).

    attention: "sdpa" (dense boolean masks, runs anywhere), "grouped" (the same cut into query groups that
    leave out the keys no query of theirs sees: CPUs) or "flex" (sparse BlockMasks, for GPUs).
    rows: score only these vocabulary ids (V = len(rows)); the labels are left as token ids.
    greedy: the target's greedy next tokens per sequence, for target labels (`build_blocks`).
    """
    device = target.device
    t = max(s.input_ids.numel() for s in seqs)
    blocks = build_blocks([s.input_ids for s in seqs], [s.loss_mask for s in seqs], anchors,
                          drafter.config.block_size, drafter.config.mask_token_id, t, greedy)
    padded = torch.zeros(len(seqs), t, feats[0].shape[-1], dtype=drafter.dtype, device=device)
    for i, f in enumerate(feats):
        padded[i, : f.shape[0]] = f.to(device, drafter.dtype)
    emb = target.embedding(blocks.input_ids.to(device)).to(drafter.dtype)
    mask_fn = MASKS[attention](blocks, t, device)
    hidden = (forward or BlockForward(drafter))(padded, emb, blocks.positions.to(device), mask_fn)
    return drafter.logits(hidden, target.lm_head, None if rows is None else rows.to(device)), blocks


# ------------------------------------------------------------------ checkpoints
def _checkpoints(out: Path) -> list[Path]:
    return sorted((out / "checkpoints").glob("step-[0-9]*"), key=lambda p: int(p.name.split("-")[1]))


def data_fingerprint(sequences: list[Sequence]) -> str:
    """sha256 of the training sequences in order (ids, tokens, loss masks): what a resume must find again."""
    h = hashlib.sha256()
    for s in sequences:
        for part in (s.id.encode(), s.input_ids.cpu().numpy().tobytes(), s.loss_mask.cpu().numpy().tobytes()):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
    return h.hexdigest()


def check_resumable(path: Path, trajectory: dict[str, Any], fingerprint: str) -> None:
    """Refuse to resume checkpoint `path` with another trajectory (`Trainer.trajectory`: the settings as they take
    effect, the processes, the data): the run would go on from its step with another schedule, batch or epoch
    order, and end with weights no uninterrupted run gives. A finished run has nothing left to train: not checked."""
    meta = json.loads((path / "trainer.json").read_text())
    if meta.get("total_steps") is not None and meta["step"] >= meta["total_steps"]:
        return
    if "trajectory" not in meta:
        log.warning("%s predates resume checks: cannot check that the settings and data are unchanged", path)
        return
    saved, now = meta["trajectory"], json.loads(json.dumps(trajectory))
    changed = [f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted({*saved, *now}) if saved.get(k) != now.get(k)]
    if changed:
        raise InvalidArgumentError(f"--resume from {path}: its run had other settings ({', '.join(changed)}); "
                                   "expected the same ones, or a new --out (with --init to start from its weights)")
    if meta.get("data_fingerprint") != fingerprint:
        raise InvalidArgumentError(f"--resume from {path}: the training sequences changed since it was saved (same "
                                   "count, other tokens: records, --max-len, the tokenizer or chat template); expected "
                                   "the same data, or a new --out (with --init to start from its weights)")


def save_checkpoint(out: Path, step: int, drafter: Drafter, optimizer: torch.optim.Optimizer,
                    cfg: TrainConfig, keep: int, total_steps: int | None = None,
                    run: dict[str, Any] | None = None) -> Path:
    """A step folder: the drafter (fp32), AdamW's state, and trainer.json (step, schedule, config and `run`: what a
    resume checks and a plot reads); the oldest beyond `keep` are removed."""
    state = optimizer.state_dict()
    tensors = {f"state.{i}.{k}": v.detach().cpu().contiguous() for i, s in state["state"].items()
               for k, v in s.items()}
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state["param_groups"]]
    path = out / "checkpoints" / f"step-{step:07d}"
    with atomic_dir(path) as tmp:
        save_drafter(drafter, tmp / "drafter", dtype=torch.float32)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "trainer.json").write_text(json.dumps({"step": step, "total_steps": total_steps,
                                                      "param_groups": groups, "config": asdict(cfg),
                                                      **(run or {})}, indent=2))
    for old in _checkpoints(out)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def load_checkpoint(path: Path, drafter: Drafter, optimizer: torch.optim.Optimizer) -> tuple[int, int | None]:
    """Restore weights and optimizer state; returns (step, the schedule's planned total steps if recorded)."""
    saved = load_drafter(path / "drafter", device=drafter.device, dtype=drafter.dtype)
    drafter.load_state_dict(saved.state_dict())
    meta = json.loads((path / "trainer.json").read_text())
    tensors = load_file(str(path / "optimizer.safetensors"))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        _, i, name = key.split(".", 2)
        state.setdefault(int(i), {})[name] = value
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    return int(meta["step"]), meta.get("total_steps")


# ------------------------------------------------------------------ evaluation
def greedy_continuations(target: TargetModel, drafter: Drafter, prompts: list[list[int]],
                         max_new_tokens: int) -> list[list[int]]:
    """Plain decoding's greedy output for each prompt (`max_new_tokens` each, no stop tokens): the target is
    frozen, so a run computes them once and replays every evaluation on them."""
    engine, options = SpeculativeEngine(target, drafter), DecodeOptions(max_new_tokens=max_new_tokens, no_draft=True)
    return [[t for chunk in engine.decode(ids, options, GenerationStats(1)) for t in chunk] for ids in prompts]


def engine_acceptance(target: TargetModel, drafter: Drafter, prompts: list[list[int]],
                      continuations: list[list[int]]) -> float:
    """The engine's greedy acceptance length (fixed verify, the trained block size, no lookups), averaged per
    prompt then over prompts, by replaying its cycles on plain decoding's `continuations`
    (`blockdraft.decoding.replay`: cycle for cycle the engine's, without its verify forwards)."""
    was_training = drafter.training
    drafter.eval()
    engine = SpeculativeEngine(target, drafter)
    taus = []
    for ids, continuation in zip(prompts, continuations):
        options = DecodeOptions(max_new_tokens=len(continuation))
        lengths = replay_acceptance(engine, ids, continuation, options)
        if lengths:
            taus.append(sum(lengths) / len(lengths))
    drafter.train(was_training)
    return sum(taus) / len(taus) if taus else math.nan


# ------------------------------------------------------------------ the loop
class Trainer:
    def __init__(self, cfg: TrainConfig, target: TargetModel, drafter: Drafter, sequences: list[Sequence],
                 features: FeatureSource, eval_prompts: list[list[int]] | None = None) -> None:
        if cfg.loss not in ("decay", "acceptance"):
            raise InvalidArgumentError(f"loss={cfg.loss!r}: expected 'decay' or 'acceptance'")
        if not sequences:
            raise InvalidArgumentError("no training sequences: expected at least one with supervised tokens")
        self.cfg, self.target, self.drafter, self.features = cfg, target, drafter, features
        self.sequences, self.eval_prompts = sequences, eval_prompts or []
        self.fingerprint = data_fingerprint(sequences)
        self._continuations: list[list[int]] | None = None  # the eval prompts' plain greedy output, made once
        self.out = Path(cfg.out)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.gamma = cfg.gamma or default_gamma(drafter.config.block_size)
        if cfg.attention not in ("auto", *MASKS):
            raise InvalidArgumentError(f"attention={cfg.attention!r}: expected 'auto' or one of {list(MASKS)}")
        self.attention = cfg.attention if cfg.attention != "auto" else \
            ("flex" if target.device.type == "cuda" else "grouped")
        target.set_feature_layers(drafter.config.target_layer_ids)
        drafter.train()
        if cfg.vocab not in ("full", "data"):
            raise InvalidArgumentError(f"vocab={cfg.vocab!r}: expected 'full' or 'data'")
        self.vocab = TrainVocab(sequences, getattr(target.lm_head, "out_features", target.vocab_size),
                                cfg.vocab_negatives, cfg.seed) \
            if cfg.vocab == "data" else None
        teacher_k = features.teacher_k if isinstance(features, OnlineFeatures) else 0
        if cfg.distill and not (0 < cfg.distill <= 1 and teacher_k == cfg.distill_topk > 0):
            raise InvalidArgumentError(f"distill={cfg.distill}: expected a weight in (0, 1] and online features "
                                       f"with the teacher's top-{cfg.distill_topk} (--features online)")
        if teacher_k and not cfg.distill:
            raise InvalidArgumentError(f"features keep the teacher's top-{teacher_k} but distill=0: expected "
                                       "OnlineFeatures(teacher_k=0) without distillation")
        if cfg.max_steps is not None and cfg.max_steps < 0:
            raise InvalidArgumentError(f"max_steps={cfg.max_steps}: expected a number of steps >= 0 (0: only save "
                                       "and evaluate the initial drafter)")
        if cfg.autocast not in ("auto", "bf16", "off"):
            raise InvalidArgumentError(f"autocast={cfg.autocast!r}: expected 'auto', 'bf16' or 'off'")
        self.bf16 = cfg.autocast == "bf16" or (cfg.autocast == "auto" and target.device.type == "cuda")
        if self.bf16 and target.device.type == "cpu" and not cpu_has_native_bf16():
            log.warning("autocast bf16 on a CPU without AVX512-BF16 or AMX: its bf16 matmuls are emulated and a step "
                        "runs many times slower than in fp32 (autocast 'off')")
        if cfg.labels not in ("data", "target"):
            raise InvalidArgumentError(f"labels={cfg.labels!r}: expected 'data' or 'target'")
        greedy = getattr(features, "greedy", False)
        if cfg.labels == "target" and not greedy:
            raise InvalidArgumentError("labels='target' needs the target's greedy tokens: expected features built "
                                       "with greedy=True (--features online or memory; a disk cache has none)")
        if greedy and cfg.labels != "target":
            raise InvalidArgumentError(f"features keep the target's greedy tokens but labels={cfg.labels!r}: "
                                       "expected labels='target'")
        self.forward = BlockForward(drafter)
        if self.world > 1:
            self.forward = nn.parallel.DistributedDataParallel(self.forward)
        self.optimizer = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                           betas=(0.9, 0.95))
        per_step = cfg.batch_size * cfg.grad_accum * self.world
        if len(sequences) < per_step:
            raise InvalidArgumentError(f"{len(sequences)} training sequences: expected at least batch_size x "
                                       f"grad_accum x processes = {per_step}")
        self.steps_per_epoch = len(sequences) // per_step
        self.total_steps = max(1, int(math.ceil(cfg.epochs * self.steps_per_epoch)))

    def _micro_batches(self, step: int) -> list[list[tuple[int, int]]]:
        """(epoch, sequence index) lists for each micro-batch of optimizer step `step` on this rank."""
        cfg = self.cfg
        per_step = cfg.batch_size * cfg.grad_accum * self.world
        epoch, k = divmod(step, self.steps_per_epoch)
        order = epoch_order(len(self.sequences), cfg.seed, epoch)[k * per_step:(k + 1) * per_step]
        mine = order[self.rank::self.world]
        return [[(epoch, i) for i in mine[j:j + cfg.batch_size]] for j in range(0, len(mine), cfg.batch_size)]

    def _micro_step(self, batch: list[tuple[int, int]], scale: float, step: int) -> dict[str, Any]:
        seqs = [self.sequences[i] for _, i in batch]
        anchors = [sample_anchors(s.loss_mask, self.cfg.max_anchors, anchor_generator(self.cfg.seed, e, i))
                   for s, (e, i) in zip(seqs, batch)]
        feats = [self.features(s) for s in seqs]
        greedy = [self.features.greedy_tokens(s) for s in seqs] if self.cfg.labels == "target" else None
        device = self.target.device
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()
        # the target labels that can occur: its greedy token before each supervised position
        labels = None if greedy is None else torch.cat([g[:-1][s.loss_mask[1:].bool()] for g, s in zip(greedy, seqs)])
        rows = self.vocab.rows(step, labels) if self.vocab else None
        with autocast:
            logits, blocks = block_logits(self.drafter, self.target, seqs, feats, anchors, self.forward,
                                          self.attention, rows, greedy)
            labels = blocks.labels if rows is None else self.vocab.remap(blocks.labels, rows)
            out = block_loss(logits, labels.to(device), blocks.block_size, gamma=self.gamma,
                             kind=self.cfg.loss, soft=self._soft_targets(seqs, blocks.positions, rows),
                             alpha=self.cfg.distill)
        (out.loss * scale).backward()
        return {"loss": out.loss.item(), "acc": out.slot_accuracy.cpu() * out.slot_counts.cpu(),
                "counts": out.slot_counts.cpu(), "prefix": out.accepted_prefix.item(), "blocks": out.blocks.item(),
                "tokens": sum(s.input_ids.numel() for s in seqs)}

    def _soft_targets(self, seqs: list[Sequence], positions: torch.Tensor,
                      rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The teacher's (probs, ids) per block slot, ids remapped into the scored rows (-100: not scored)."""
        if not self.cfg.distill:
            return None
        probs, ids = block_soft_targets([self.features.teacher(s) for s in seqs], positions)
        return probs, ids if rows is None else self.vocab.remap(ids, rows)

    def run(self, resume: bool = False) -> Path:
        cfg, out = self.cfg, self.out
        step, planned = 0, False
        if resume and _checkpoints(out):
            check_resumable(_checkpoints(out)[-1], self.trajectory(), self.fingerprint)
            step, total = load_checkpoint(_checkpoints(out)[-1], self.drafter, self.optimizer)
            planned = total is not None and total != self.total_steps
            self.total_steps = total or self.total_steps
            log.warning("resumed from step %d of %d", step, self.total_steps)
        if self.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            _truncate_metrics(out / "metrics.jsonl", step)
        last = self.total_steps if cfg.max_steps is None else min(self.total_steps, cfg.max_steps)
        bar = tqdm(total=last, initial=step, desc="train", unit="step", dynamic_ncols=True, disable=self.rank != 0)
        window: list[dict[str, Any]] = []
        t0 = started = time.perf_counter()
        first, timed_from = step, None
        with GracefulStop("the end of this step (after its evaluation, if it has one), which it saves") as stop:
            while step < last:
                if cfg.time_budget is not None:
                    elapsed = self._agree(time.perf_counter() - started)
                    if elapsed >= cfg.time_budget:
                        log.warning("time budget of %.0f s spent at step %d", cfg.time_budget, step)
                        break
                    if step - first == PLAN_WARMUP_STEPS:
                        timed_from = elapsed
                    if not planned and step - first == PLAN_WARMUP_STEPS + PLAN_TIMED_STEPS:
                        per_step = (elapsed - timed_from) / PLAN_TIMED_STEPS
                        last = self._plan(step, elapsed, per_step, last)
                        bar.total, planned = last, True
                lr = self._train_step(step, window)
                step += 1
                if step % cfg.log_every == 0 or step == last:
                    row = _summarise(window, step, step / self.steps_per_epoch, lr, time.perf_counter() - t0)
                    window, t0 = [], time.perf_counter()
                    bar.set_postfix(loss=f"{row['loss']:.3f}", acc1=f"{row['slot_accuracy'][0]:.2f}",
                                    tau=f"{row['tau_estimate']:.2f}", tok_s=f"{row['tokens_per_second']:.0f}")
                    self._log(row)
                if cfg.eval_every and step % cfg.eval_every == 0 and step < last:
                    self._evaluate(step)
                if step % cfg.save_every == 0 and step < last:
                    self.check_sync()
                    if self.rank == 0:
                        self._save(step)
                bar.update(1)
                if step < last and self._agree(float(stop.requested)):
                    bar.close()
                    self._stop(step, window, lr, t0, saved=step % cfg.save_every == 0)
            bar.close()
            if window:  # stopped by the time budget between log rows: the last steps are logged too
                self._log(_summarise(window, step, step / self.steps_per_epoch, lr, time.perf_counter() - t0))
            self.check_sync()
            if self.rank == 0:  # a signal here waits for the last checkpoint and the final drafter
                self._save(step)
                save_drafter(self.drafter, out / "final", metadata={"step": str(step)})
        if not _evaluated(out / "metrics.jsonl", step):  # a finished run started again, or a budget stop right
            self._evaluate(step)                          # after an evaluation: no second row for the step
        if self.rank == 0 and self.cfg.stash:  # the final evaluation joins the stashed curve
            stash_metrics(self.out / "metrics.jsonl", Path(self.cfg.stash))
        return out / "final"

    def _train_step(self, step: int, window: list[dict[str, Any]]) -> float:
        """One optimizer step at `step` (its micro-batches' records appended to `window`); returns its rate."""
        lr = lr_at(step, self.total_steps, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        micro = self._micro_batches(step)
        for batch in micro:
            window.append(self._micro_step(batch, 1.0 / len(micro), step))
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return lr

    def trajectory(self) -> dict[str, Any]:
        """The settings as they take effect (gamma, attention and autocast resolved; options that do nothing left
        out), the processes and the number of sequences: a resume must find the same."""
        cfg = self.cfg
        return {"epochs": cfg.epochs, "lr": cfg.lr, "warmup_ratio": cfg.warmup_ratio, "min_lr_ratio": cfg.min_lr_ratio,
                "weight_decay": cfg.weight_decay, "grad_clip": cfg.grad_clip, "batch_size": cfg.batch_size,
                "grad_accum": cfg.grad_accum, "processes": self.world, "max_anchors": cfg.max_anchors,
                "loss": cfg.loss, "gamma": self.gamma, "attention": self.attention, "vocab": cfg.vocab,
                "vocab_negatives": cfg.vocab_negatives if cfg.vocab == "data" else None, "distill": cfg.distill,
                "distill_topk": cfg.distill_topk if cfg.distill else None, "labels": cfg.labels, "bf16": self.bf16,
                "seed": cfg.seed, "sequences": len(self.sequences)}

    def _stop(self, step: int, window: list[dict[str, Any]], lr: float, t0: float, saved: bool) -> None:
        """Stop on a signal between two steps: log the steps since the last log row, save this step (unless the
        schedule just did), and raise KeyboardInterrupt; `--resume` goes on from here, bitwise."""
        if window:
            self._log(_summarise(window, step, step / self.steps_per_epoch, lr, time.perf_counter() - t0))
        self.check_sync()
        if self.rank == 0 and not saved:
            self._save(step)
        elif self.rank == 0 and window and self.cfg.stash:  # the row just logged joins the stashed curve
            stash_metrics(self.out / "metrics.jsonl", Path(self.cfg.stash))
        if self.world > 1:  # no rank exits (and has torchrun stop the others) before rank 0 has saved
            dist.barrier()
        log.warning("stopped at step %d of %d and saved it: --resume goes on from there", step, self.total_steps)
        raise KeyboardInterrupt

    def _save(self, step: int) -> None:
        """A checkpoint of this step in the run folder, and in the stash folder when there is one."""
        path = save_checkpoint(self.out, step, self.drafter, self.optimizer, self.cfg, self.cfg.keep_checkpoints,
                               self.total_steps, {"trajectory": self.trajectory(), "data_fingerprint": self.fingerprint,
                                                  "steps_per_epoch": self.steps_per_epoch})
        if self.cfg.stash:
            stash_checkpoint(path, Path(self.cfg.stash), self.out / "metrics.jsonl")

    def _plan(self, step: int, elapsed: float, per_step: float, last: int) -> int:
        """Shrink the schedule so it ends within the time budget at the measured step time.

        The timings are the slowest rank's (`_agree`), so every rank plans the same schedule."""
        fits = step + int((self.cfg.time_budget - elapsed) / per_step)
        if fits < last:
            self.total_steps = min(self.total_steps, fits)
            log.warning("time budget %.0f s at %.3f s/step: schedule re-planned to %d steps",
                        self.cfg.time_budget, per_step, self.total_steps)
        return min(last, self.total_steps)

    def _agree(self, value: float) -> float:
        """The largest `value` over all ranks (rank-local timings must not split the ranks' decisions)."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.target.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def check_sync(self) -> None:
        """Raise if the ranks' weights have drifted apart (they must stay bitwise equal under DDP)."""
        if self.world == 1:
            return
        flat = torch.cat([p.detach().float().flatten() for p in self.drafter.parameters()])
        mine = torch.stack([flat.sum(), (flat * torch.arange(flat.numel(), device=flat.device) % 9973).sum()])
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine)
        if any(not torch.equal(g, gathered[0]) for g in gathered):
            raise RuntimeError(f"ranks out of sync: weight checksums {[g.tolist() for g in gathered]}")
        log.warning("all %d ranks hold identical weights", self.world)

    def _evaluate(self, step: int) -> None:
        if self.rank != 0 or not self.eval_prompts:
            return
        prompts = self.eval_prompts[: self.cfg.eval_prompts]
        if self._continuations is None:
            self._continuations = self._saved_continuations(prompts)
        tau = engine_acceptance(self.target, self.drafter, prompts, self._continuations)
        log.warning("step %d: engine acceptance length %.3f on %d held-out prompts", step, tau,
                    min(len(self.eval_prompts), self.cfg.eval_prompts))
        self._log({"step": step, "eval_acceptance_length": tau, "eval_prompts": len(self.eval_prompts[: self.cfg.eval_prompts])})

    def _saved_continuations(self, prompts: list[list[int]]) -> list[list[int]]:
        """The eval prompts' plain greedy output, kept in the run folder: a resumed run (each leg of a
        campaign, on whichever machine) replays on the same tokens without decoding them again (~2 min for 24 x 128 on a CPU)."""
        path, tokens = self.out / "eval-continuations.json", self.cfg.eval_max_new_tokens
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved["prompts"] == prompts and saved["max_new_tokens"] == tokens:
                return saved["continuations"]
        continuations = greedy_continuations(self.target, self.drafter, prompts, tokens)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps({"prompts": prompts, "max_new_tokens": tokens, "continuations": continuations}))
        return continuations

    def _log(self, row: dict[str, Any]) -> None:
        if self.rank == 0:
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")


def _summarise(window: list[dict[str, Any]], step: int, epoch: float, lr: float, seconds: float) -> dict[str, Any]:
    acc = sum(w["acc"] for w in window)
    counts = sum(w["counts"] for w in window)
    prefix, blocks = sum(w["prefix"] for w in window), sum(w["blocks"] for w in window)
    return {"step": step, "epoch": round(epoch, 4), "lr": lr, "loss": sum(w["loss"] for w in window) / len(window),
            "slot_accuracy": (acc / counts.clamp_min(1)).tolist(),
            "tau_estimate": estimated_acceptance_length(prefix, blocks),
            "tokens_per_second": sum(w["tokens"] for w in window) / max(seconds, 1e-9)}


def _evaluated(path: Path, step: int) -> bool:
    """Whether the run's metrics already hold an evaluation at `step`."""
    return path.is_file() and any('"eval_acceptance_length"' in line and json.loads(line)["step"] == step
                                  for line in path.read_text().splitlines())


def _truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop log rows written after the checkpoint we restart from."""
    if not path.is_file():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(r + "\n" for r in rows))


def new_drafter(target: TargetModel, *, num_layers: int, block_size: int, mask_token_id: int,
                target_layer_ids: list[int] | None, seed: int, sliding_window: int | None = None,
                from_target: bool = False) -> Drafter:
    """A fresh drafter: random weights, or (from_target) the target's last layers (see train.init)."""
    config = DrafterConfig.for_target(target.config_dict(), num_layers=num_layers, block_size=block_size,
                                      mask_token_id=mask_token_id, target_layer_ids=target_layer_ids,
                                      sliding_window=sliding_window)
    drafter = Drafter(config).init_weights(seed).to(target.device, torch.float32)
    return init_from_target(drafter, target) if from_target else drafter


@contextmanager
def distributed_world() -> Iterator[None]:
    """Join torchrun's process group for the block when launched by torchrun (gloo on CPU, nccl on CUDA).

    The group is left on the way out: a process that exits with gloo's worker threads still alive can abort
    ("terminate called without an active exception", SIGABRT), and NCCL warns about the same. After a clean
    run the ranks meet at a barrier first, so none tears its connections down while another still uses them."""
    if "RANK" not in os.environ or dist.is_initialized():
        yield
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()

"""Training run on the counting target, as a separate process (for the kill/resume and torchrun tests).

    python -m tests.train.counter_run TARGET_DIR OUT_DIR STEPS [--resume] [--save-every=N] [--epochs=N]
        [--slow-step=S] [--slow-save=S] [--pause-at-step=N]

--slow-step / --slow-save make every optimizer step / checkpoint save take S seconds longer: the barrier test
needs a step longer than GracefulStop's echo window and a save still in progress when torchrun stops rank 0.
--pause-at-step=N stops in the middle of step N (0-based: after its first micro-batch's backward pass, before
its optimizer update), writes OUT_DIR/paused and waits for its stdin to close: the kill/resume test kills it
there, at a point it chose, instead of at whatever step a timer happens to catch.
"""
import logging
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from blockdraft.modeling.target import TargetModel
from blockdraft.train.features import OnlineFeatures
from blockdraft.train.trainer import TrainConfig, Trainer, new_drafter, distributed_world
from tests.train.test_trainer import MOD, sequences


def _delayed(method, seconds: float):
    """`method`, taking `seconds` longer (it sleeps first)."""
    def slow(self, *args):
        time.sleep(seconds)
        return method(self, *args)
    return slow


def _pausing(method, step: int, marker: Path):
    """`Trainer._micro_step`, which at `step` writes `marker` and then waits until stdin closes (the test kills
    the process meanwhile; a test that died closes the pipe, so the run never waits for good)."""
    def paused(self, batch, scale, at):
        out = method(self, batch, scale, at)
        if at == step:
            marker.write_text(str(at))
            sys.stdin.read()
            sys.exit(3)
        return out
    return paused


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    target_dir, out, steps = argv[0], argv[1], int(argv[2])
    target = TargetModel(AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32))
    drafter = new_drafter(target, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    save_every = next((int(a.split("=")[1]) for a in argv if a.startswith("--save-every=")), 2)
    epochs = next((int(a.split("=")[1]) for a in argv if a.startswith("--epochs=")), 4)
    for name, method in (("--slow-step=", "_train_step"), ("--slow-save=", "_save")):
        delay = next((float(a.split("=")[1]) for a in argv if a.startswith(name)), 0.0)
        if delay:
            setattr(Trainer, method, _delayed(getattr(Trainer, method), delay))
    pause = next((int(a.split("=")[1]) for a in argv if a.startswith("--pause-at-step=")), None)
    if pause is not None:
        Trainer._micro_step = _pausing(Trainer._micro_step, pause, Path(out) / "paused")
    cfg = TrainConfig(out=out, epochs=epochs, lr=3e-3, max_anchors=16, log_every=1, save_every=save_every, max_steps=steps,
                      keep_checkpoints=3)
    with distributed_world():
        Trainer(cfg, target, drafter, sequences(32), OnlineFeatures(target)).run(resume="--resume" in argv)


if __name__ == "__main__":
    main(sys.argv[1:])

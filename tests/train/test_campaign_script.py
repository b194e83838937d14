"""scripts/campaign.sh: the stage it runs, and when it has nothing to do (no training is run here)."""
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "campaign.sh"


def campaign(tmp_path: Path, stage: str, *args: str, py: str = sys.executable) -> subprocess.CompletedProcess:
    env = {**os.environ, "STAGE": stage, "STASH": str(tmp_path / "stash"), "BLOCKDRAFT_HOME": str(tmp_path / "home"),
           "PY": py}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def trainer_args(tmp_path: Path, stage: str) -> list[str]:
    """The arguments the stage would give the trainer (a stand-in python that prints them, one a line)."""
    echo = tmp_path / "echo-args"
    echo.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    echo.chmod(0o755)
    return campaign(tmp_path, stage, py=str(echo)).stdout.splitlines()


def test_a_new_stage_reaches_the_trainer_with_its_own_settings(tmp_path):
    done = campaign(tmp_path, "2", "--help")  # no checkpoint stashed yet: the real trainer starts (here, its help)
    assert done.returncode == 0, done.stderr
    assert "--features" in done.stdout and "lazy" in done.stdout
    args = trainer_args(tmp_path, "2")
    pairs = set(zip(args, args[1:]))
    assert {("--init", "data/checkpoints/v2-campaign/stage1"), ("--epochs", "2"), ("--features", "lazy"),
            ("--data", "data/regenerated/smollm2-135m-instruct-sharegpt"),
            ("--data", "data/regenerated/smollm2-135m-instruct-sharegpt-turn2"),
            ("--stash", str(tmp_path / "stash" / "stage2"))} <= pairs
    assert "--feature-cache" not in args  # stage 2's lazy cache lives in its run folder
    assert ("--autocast", "bf16") in pairs


def test_stages_3_and_4_train_stage_2_on_the_synthetic_answers_in_fp32(tmp_path):
    args = trainer_args(tmp_path, "3")
    pairs = set(zip(args, args[1:]))
    assert {("--init", "data/checkpoints/v2-campaign/stage2"), ("--epochs", "1"), ("--autocast", "off"),
            ("--data", "data/regenerated/smollm2-135m-instruct-synthetic"),
            ("--stash", str(tmp_path / "stash" / "stage3"))} <= pairs
    assert args.count("--data") == 1
    joint = trainer_args(tmp_path, "4")  # stage 4: all three folders, also fp32
    assert [joint[i + 1] for i, a in enumerate(joint) if a == "--data"] == [
        "data/regenerated/smollm2-135m-instruct-sharegpt", "data/regenerated/smollm2-135m-instruct-sharegpt-turn2",
        "data/regenerated/smollm2-135m-instruct-synthetic"]
    assert {("--init", "data/checkpoints/v2-campaign/stage2"), ("--autocast", "off")} <= set(zip(joint, joint[1:]))


def test_a_finished_stage_does_nothing_and_an_unknown_stage_is_an_error(tmp_path):
    step = tmp_path / "stash" / "stage2" / "step-0000008"
    step.mkdir(parents=True)
    (step / "trainer.json").write_text(json.dumps({"step": 8, "total_steps": 8}))
    done = campaign(tmp_path, "2")
    assert done.returncode == 0 and "stage 2 finished at step-0000008" in done.stderr
    (step / "trainer.json").write_text(json.dumps({"step": 5, "total_steps": 8}))
    assert "stage 2 finished" not in campaign(tmp_path, "2", "--help").stderr  # unfinished: it goes on
    bad = campaign(tmp_path, "5")
    assert bad.returncode == 2 and "STAGE=5: expected 1, 2, 3 or 4" in bad.stderr

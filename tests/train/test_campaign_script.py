"""scripts/campaign.sh: the stage it runs, and when it has nothing to do (no training is run here)."""
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "campaign.sh"


def campaign(tmp_path: Path, stage: str | None, *args: str, py: str = sys.executable) -> subprocess.CompletedProcess:
    env = {**os.environ, "STASH": str(tmp_path / "stash"), "BLOCKDRAFT_HOME": str(tmp_path / "home"), "PY": py}
    env.pop("STAGE", None)
    if stage is not None:
        env["STAGE"] = stage
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def trainer_args(tmp_path: Path, stage: str | None) -> list[str]:
    """The arguments the stage would give the trainer (a stand-in python that prints them, one a line)."""
    echo = tmp_path / "echo-args"
    echo.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    echo.chmod(0o755)
    return campaign(tmp_path, stage, py=str(echo)).stdout.splitlines()


def test_stage_4_trains_the_shipped_drafter_on_all_three_folders_in_fp32(tmp_path):
    done = campaign(tmp_path, "4", "--help")  # no checkpoint stashed yet: the real trainer starts (here, its help)
    assert done.returncode == 0, done.stderr
    assert "--features" in done.stdout and "lazy" in done.stdout
    args = trainer_args(tmp_path, None)  # stage 4 is the default
    assert [args[i + 1] for i, a in enumerate(args) if a == "--data"] == [
        "data/regenerated/smollm2-135m-instruct-sharegpt", "data/regenerated/smollm2-135m-instruct-sharegpt-turn2",
        "data/regenerated/smollm2-135m-instruct-synthetic"]
    pairs = set(zip(args, args[1:]))
    assert {("--init", "blockdraft/weights/smollm2-135m-instruct-dflash"), ("--epochs", "1"), ("--lr", "1e-4"),
            ("--autocast", "off"), ("--features", "lazy"), ("--stash", str(tmp_path / "stash" / "stage4"))} <= pairs
    assert "--resume" in args


def test_a_finished_stage_does_nothing_and_an_unknown_stage_is_an_error(tmp_path):
    step = tmp_path / "stash" / "stage4" / "step-0000008"
    step.mkdir(parents=True)
    (step / "trainer.json").write_text(json.dumps({"step": 8, "total_steps": 8}))
    done = campaign(tmp_path, "4")
    assert done.returncode == 0 and "stage 4 finished at step-0000008" in done.stderr
    (step / "trainer.json").write_text(json.dumps({"step": 5, "total_steps": 8}))
    assert "stage 4 finished" not in campaign(tmp_path, "4", "--help").stderr  # unfinished: it goes on
    bad = campaign(tmp_path, "2")
    assert bad.returncode == 2 and "STAGE=2: expected 4" in bad.stderr

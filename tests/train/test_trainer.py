import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.stats import GenerationStats
from blockdraft.modeling.target import TargetModel
from blockdraft.train.data import Sequence
from blockdraft.train.features import OnlineFeatures
from blockdraft.train.trainer import (TrainConfig, Trainer, engine_acceptance, greedy_continuations, lr_at,
                                     new_drafter)
from tests.conftest import slow_unless, tiny_hf_model

V, MOD = 24, 23  # tokens 0..22 count mod 23; 23 is the MASK row


def counting(n: int, start: int) -> torch.Tensor:
    return torch.tensor([(start + i) % MOD for i in range(n)])


@pytest.fixture(scope="module")
def counter() -> TargetModel:
    """A tiny Llama trained for a few seconds to count: its greedy continuation is fully predictable."""
    model = tiny_hf_model("llama", vocab=V, layers=2, hidden=32, dtype=torch.float32, seed=0)
    model.train().requires_grad_(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(120):
        x = torch.stack([counting(32, int(s)) for s in torch.randint(0, MOD, (16,), generator=g)])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().requires_grad_(False)
    out = model.generate(counting(4, 5)[None], max_new_tokens=40, do_sample=False)[0]
    assert out.tolist() == counting(44, 5).tolist(), "the tiny target did not learn to count"
    return TargetModel(model)


def sequences(n: int, seed: int = 1) -> list[Sequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = counting(int(torch.randint(24, 48, (1,), generator=g)), int(torch.randint(0, MOD, (1,), generator=g)))
        mask = torch.ones_like(ids, dtype=torch.bool)
        mask[:4] = False  # the "prompt"
        out.append(Sequence(f"s{i}", ids, mask))
    return out


def test_lr_schedule_warms_up_then_decays():
    cfg = TrainConfig(out="x", lr=1.0, warmup_ratio=0.1)
    lrs = [lr_at(s, 100, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] < 0.01


class StepClock:
    """The trainer's clock (`blockdraft.train.trainer.time`), moved by `seconds` in every optimizer step and by
    nothing else: a time budget runs out at the same step on any machine, however loaded."""

    def __init__(self, monkeypatch, seconds: float) -> None:
        from blockdraft.train import trainer as trainer_module

        self.now = 0.0
        monkeypatch.setattr(trainer_module, "time", self)
        step = Trainer._train_step

        def timed(trainer, *args):
            self.now += seconds
            return step(trainer, *args)

        monkeypatch.setattr(Trainer, "_train_step", timed)

    def perf_counter(self) -> float:
        return self.now


def test_time_budget_replans_the_schedule_and_a_resume_keeps_it(counter, tmp_path, monkeypatch):
    from blockdraft.train.trainer import PLAN_TIMED_STEPS, PLAN_WARMUP_STEPS, _checkpoints, load_checkpoint

    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    cfg = TrainConfig(out=str(tmp_path / "run"), epochs=1000, max_anchors=4, log_every=5, save_every=10_000,
                      time_budget=4.0)
    trainer = Trainer(cfg, counter, drafter, sequences(8), OnlineFeatures(counter))
    planned_from = trainer.total_steps
    StepClock(monkeypatch, 0.125)  # timed over steps 6..25, the plan made at step 25 ends the run at 4 s: step 32
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    done = rows[-1]["step"]
    assert PLAN_WARMUP_STEPS + PLAN_TIMED_STEPS < done < planned_from  # stopped by the budget, not the epochs
    assert trainer.total_steps == done == 32  # the cosine now ends inside the budget
    monkeypatch.undo()
    step, total = load_checkpoint(_checkpoints(tmp_path / "run")[-1], drafter, trainer.optimizer)
    assert step == done and total == trainer.total_steps
    again = Trainer(TrainConfig(**{**cfg.__dict__, "time_budget": None}), counter, drafter, sequences(8),
                    OnlineFeatures(counter))
    again.run(resume=True)  # the recorded schedule is kept: no fresh plan over 1000 epochs
    assert again.total_steps == total


def test_target_labels_need_greedy_features_and_only_with_them(counter, tmp_path):
    from blockdraft.errors import InvalidArgumentError

    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    with pytest.raises(InvalidArgumentError, match="labels='target' needs the target's greedy tokens"):
        Trainer(TrainConfig(out=str(tmp_path), labels="target"), counter, drafter, sequences(4), OnlineFeatures(counter))
    with pytest.raises(InvalidArgumentError, match="greedy tokens but labels='data'"):
        Trainer(TrainConfig(out=str(tmp_path)), counter, drafter, sequences(4), OnlineFeatures(counter, greedy=True))
    with pytest.raises(InvalidArgumentError, match="labels='typo'"):
        Trainer(TrainConfig(out=str(tmp_path), labels="typo"), counter, drafter, sequences(4), OnlineFeatures(counter))


def test_bf16_autocast_trains_on_a_cpu_close_to_fp32(counter, tmp_path):
    from blockdraft.errors import InvalidArgumentError

    losses = {}
    for autocast in ("off", "bf16"):
        drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
        cfg = TrainConfig(out=str(tmp_path / autocast), epochs=1, max_anchors=8, log_every=1, save_every=10_000,
                          eval_prompts=0, autocast=autocast)
        Trainer(cfg, counter, drafter, sequences(6), OnlineFeatures(counter)).run()
        rows = (tmp_path / autocast / "metrics.jsonl").read_text().splitlines()
        losses[autocast] = [json.loads(line)["loss"] for line in rows if "loss" in line]
        assert drafter.dtype == torch.float32  # the weights (and AdamW's moments) stay fp32
    assert losses["off"] != losses["bf16"]  # the forward did run in bf16 ...
    assert losses["off"] == pytest.approx(losses["bf16"], rel=0.05)  # ... and trains the same
    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    with pytest.raises(InvalidArgumentError, match="autocast='fp16'"):
        Trainer(TrainConfig(out=str(tmp_path), autocast="fp16"), counter, drafter, sequences(4), OnlineFeatures(counter))


def test_bf16_autocast_on_a_cpu_without_bf16_hardware_warns(counter, tmp_path, monkeypatch, caplog):
    import blockdraft.train.trainer as trainer_module

    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    for native in (True, False):
        monkeypatch.setattr(trainer_module, "cpu_has_native_bf16", lambda: native)
        caplog.clear()
        Trainer(TrainConfig(out=str(tmp_path), autocast="bf16"), counter, drafter, sequences(4), OnlineFeatures(counter))
        assert ("without AVX512-BF16 or AMX" in caplog.text) == (not native)


def test_max_steps_zero_only_saves_and_evaluates_the_initial_drafter(counter, tmp_path):
    from blockdraft.errors import InvalidArgumentError

    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    cfg = TrainConfig(out=str(tmp_path / "run"), epochs=1, max_anchors=4, max_steps=0, eval_prompts=2,
                      eval_max_new_tokens=8)
    prompts = [s.input_ids[:6].tolist() for s in sequences(2)]
    Trainer(cfg, counter, drafter, sequences(4), OnlineFeatures(counter), prompts).run()
    assert all(torch.equal(before[k], v) for k, v in drafter.state_dict().items())  # not one step taken
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "eval_acceptance_length" in r) for r in rows] == [(0, True)]  # the initial drafter's eval
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    with pytest.raises(InvalidArgumentError, match="max_steps=-1: expected a number of steps >= 0"):
        Trainer(TrainConfig(out=str(tmp_path), max_steps=-1), counter, drafter, sequences(4), OnlineFeatures(counter))


class SignalAt:
    """Online features that send this process `count` SIGTERMs while computing the `call`-th sequence."""

    def __init__(self, target: TargetModel, call: int, count: int = 1) -> None:
        self.online, self.call, self.count, self.calls = OnlineFeatures(target), call, count, 0

    def __call__(self, seq: Sequence) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.call:
            for _ in range(self.count):
                os.kill(os.getpid(), signal.SIGTERM)
        return self.online(seq)


@pytest.fixture
def sigterm_interrupts():
    """SIGTERM raises KeyboardInterrupt, as under `blockdraft` (cli.main): without the trainer's own handling
    a signal then stops a run mid-step instead of ending the test process."""
    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    yield interrupt
    signal.signal(signal.SIGTERM, previous)


def _signal_run(counter, out: Path, features, resume: bool = False) -> Trainer:
    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    cfg = TrainConfig(out=str(out), epochs=1, max_anchors=4, batch_size=2, log_every=4, save_every=1000,
                      eval_prompts=0)
    trainer = Trainer(cfg, counter, drafter, sequences(16), features)
    trainer.run(resume=resume)
    return trainer


def test_a_signal_stops_after_its_step_which_is_saved_and_resumes_bitwise(counter, tmp_path, caplog,
                                                                          sigterm_interrupts):
    from blockdraft.train.trainer import _checkpoints, load_checkpoint

    _signal_run(counter, tmp_path / "full", OnlineFeatures(counter))  # 8 steps, no checkpoint before the last
    with pytest.raises(KeyboardInterrupt):
        _signal_run(counter, tmp_path / "cut", SignalAt(counter, call=5))  # inside step 3 (2 sequences a step)
    assert signal.getsignal(signal.SIGTERM) is sigterm_interrupts  # the trainer's handler is gone again
    assert "stopped at step 3 of 8 and saved it" in caplog.text
    assert [p.name for p in _checkpoints(tmp_path / "cut")] == ["step-0000003"]  # step 3 finished, then saved
    rows = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 3  # the steps since the last log row are logged too
    resumed = _signal_run(counter, tmp_path / "cut", OnlineFeatures(counter), resume=True)
    assert resumed.total_steps == 8
    a, b = _final(tmp_path / "full"), _final(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    assert load_checkpoint(_checkpoints(tmp_path / "cut")[-1], drafter, resumed.optimizer)[0] == 8


def test_a_second_signal_stops_at_once_without_saving(counter, tmp_path, sigterm_interrupts, monkeypatch):
    from blockdraft.train import stopping
    from blockdraft.train.trainer import _checkpoints

    monkeypatch.setattr(stopping, "ECHO_SECONDS", 0.0)  # the two signals come within a moment

    with pytest.raises(KeyboardInterrupt):
        _signal_run(counter, tmp_path / "cut", SignalAt(counter, call=5, count=2))
    assert _checkpoints(tmp_path / "cut") == []  # interrupted inside step 3: nothing half-done is saved


def _short_run(counter, out: Path, seqs: list[Sequence], resume: bool = False, **settings) -> Trainer:
    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    cfg = TrainConfig(out=str(out), **{"epochs": 1, "max_anchors": 4, "batch_size": 2, "max_steps": 2,
                                       "eval_prompts": 0, **settings})
    trainer = Trainer(cfg, counter, drafter, seqs, OnlineFeatures(counter))
    trainer.run(resume=resume)
    return trainer


def test_a_resume_with_other_settings_or_other_data_is_refused(counter, tmp_path, caplog):
    from blockdraft.errors import InvalidArgumentError
    from blockdraft.train.loss import default_gamma
    from blockdraft.train.trainer import _checkpoints

    _short_run(counter, tmp_path, sequences(8), lr=1e-3)
    with pytest.raises(InvalidArgumentError, match=r"other settings \(lr 0.001 -> 0.002, seed 0 -> 1\)"):
        _short_run(counter, tmp_path, sequences(8), resume=True, lr=2e-3, seed=1)
    with pytest.raises(InvalidArgumentError, match=r"other settings \(sequences 8 -> 10\)"):
        _short_run(counter, tmp_path, sequences(10), resume=True, lr=1e-3)  # two more records
    changed = sequences(8)
    changed[3] = Sequence(changed[3].id, changed[3].input_ids, torch.roll(changed[3].loss_mask, 1))
    with pytest.raises(InvalidArgumentError, match="the training sequences changed since it was saved"):
        _short_run(counter, tmp_path, changed, resume=True, lr=1e-3)  # one loss mask moved
    with pytest.raises(InvalidArgumentError, match="bf16 False -> True"):
        _short_run(counter, tmp_path, sequences(8), resume=True, lr=1e-3, autocast="bf16")
    # what may change: saving, logging, evaluation, the step limit, and a setting spelled as what it resolves to
    _short_run(counter, tmp_path, sequences(8), resume=True, lr=1e-3, max_steps=3, save_every=7, log_every=1,
               gamma=default_gamma(6), attention="grouped", vocab_negatives=5)
    assert "resumed from step 2" in caplog.text
    meta = _checkpoints(tmp_path)[-1] / "trainer.json"  # a checkpoint from before the checks: resumed, with a word
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != "trajectory"}))
    _short_run(counter, tmp_path, sequences(9), resume=True, lr=1e-3, max_steps=4)
    assert "predates resume checks" in caplog.text
    _short_run(counter, tmp_path, sequences(12), resume=True, lr=1e-3)  # finished: nothing to train, not checked


def test_the_eval_continuations_are_decoded_once_per_run_folder(counter, tmp_path, monkeypatch):
    from blockdraft.train import trainer as trainer_module

    prompts = [s.input_ids[:6].tolist() for s in sequences(2)]
    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    cfg = TrainConfig(out=str(tmp_path), epochs=1, max_anchors=4, max_steps=0, eval_prompts=2, eval_max_new_tokens=8)
    Trainer(cfg, counter, drafter, sequences(4), OnlineFeatures(counter), prompts).run()
    saved = json.loads((tmp_path / "eval-continuations.json").read_text())
    assert saved["prompts"] == prompts and [len(c) for c in saved["continuations"]] == [8, 8]

    def decode_again(*_args):
        raise AssertionError("decoded again")

    monkeypatch.setattr(trainer_module, "greedy_continuations", decode_again)
    again = Trainer(cfg, counter, drafter, sequences(4), OnlineFeatures(counter), prompts)
    again._evaluate(1)  # a resumed run: the saved continuations
    other = Trainer(TrainConfig(**{**cfg.__dict__, "eval_max_new_tokens": 4}), counter, drafter, sequences(4),
                    OnlineFeatures(counter), prompts)
    with pytest.raises(AssertionError, match="decoded again"):  # other settings: decoded afresh
        other._evaluate(1)


def test_too_few_sequences_for_one_step_is_a_clear_error(counter, tmp_path):
    from blockdraft.errors import InvalidArgumentError

    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    with pytest.raises(InvalidArgumentError, match="3 training sequences: expected at least .* = 4"):
        Trainer(TrainConfig(out=str(tmp_path), batch_size=2, grad_accum=2), counter, drafter, sequences(3),
                OnlineFeatures(counter))


def decoded_acceptance(target, drafter, prompts, max_new_tokens: int) -> float:
    """The acceptance length of the real engine's decoding (fixed verify), per prompt then over prompts: what the
    trainer's replayed evaluation must give."""
    engine, taus = SpeculativeEngine(target, drafter.eval()), []
    for ids in prompts:
        stats = GenerationStats(1)
        for _ in engine.decode(ids, DecodeOptions(max_new_tokens=max_new_tokens), stats):
            pass
        taus.append(stats.mean_acceptance_length)
    return sum(taus) / len(taus)


@pytest.mark.parametrize("vocab,distill,labels", slow_unless([("full", 0.0, "data"), ("data", 0.0, "data"),
                                                              ("data", 0.5, "data"), ("data", 0.0, "target")],
                                                             ("data", 0.5, "data")))
def test_short_training_run_reaches_near_block_size_acceptance(counter, tmp_path, vocab, distill, labels):
    torch.manual_seed(0)
    drafter = new_drafter(counter, num_layers=1, block_size=6, mask_token_id=MOD, target_layer_ids=[1], seed=0)
    prompts = [counting(6, s).tolist() for s in (0, 7, 15)]
    before = decoded_acceptance(counter, drafter, prompts, max_new_tokens=40)
    continuations = greedy_continuations(counter, drafter, prompts, max_new_tokens=40)
    assert engine_acceptance(counter, drafter, prompts, continuations) == pytest.approx(before)
    drafter.train()
    cfg = TrainConfig(out=str(tmp_path / "run"), epochs=5, lr=3e-3, max_anchors=16, log_every=20, save_every=1000,
                      eval_every=0, eval_max_new_tokens=40, vocab=vocab, vocab_negatives=0, distill=distill,
                      distill_topk=4, labels=labels)
    features = OnlineFeatures(counter, teacher_k=4 if distill else 0, greedy=labels == "target")
    Trainer(cfg, counter, drafter, sequences(64), features, prompts).run()
    after = decoded_acceptance(counter, drafter, prompts, max_new_tokens=40)
    assert before < 1.5 and after >= 0.8 * 6, (before, after)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["eval_acceptance_length"] == pytest.approx(after)  # the trainer's replay: the engine's figure
    assert rows[-2]["tau_estimate"] > 4 and rows[-2]["slot_accuracy"][0] > 0.9
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


# ---------------------------------------------------------------- processes: kill/resume, torchrun


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def counter_dir(counter, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("counter")
    counter.model.save_pretrained(folder)
    return folder


def _run(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def _final(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "final" / "model.safetensors"))


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(counter_dir, tmp_path):
    """SIGKILL in the middle of step 11 (after the checkpoint of step 10, gradients of step 11 half-accumulated):
    the run pauses there itself and is killed while it waits, so it is never a question of timing."""
    from blockdraft.train.trainer import _checkpoints

    steps = "40"
    full = _run("-m", "tests.train.counter_run", str(counter_dir), str(tmp_path / "full"), steps)
    assert full.wait(timeout=300) == 0, full.stdout.read()
    cut = tmp_path / "cut"
    proc = _run("-m", "tests.train.counter_run", str(counter_dir), str(cut), steps, "--pause-at-step=10",
                stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300  # a guard against a hang, not a race: the run waits at its marker
        while not (cut / "paused").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (cut / "paused").read_text() == "10", proc.poll()
        assert [p.name for p in _checkpoints(cut)][-1] == "step-0000010" and not (cut / "final").exists()
    finally:
        proc.kill()
        output = proc.communicate()[0]
    assert proc.returncode == -signal.SIGKILL, output
    resumed = _run("-m", "tests.train.counter_run", str(counter_dir), str(cut), steps, "--resume")
    output = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, output
    assert "resumed from step 10" in output
    a, b = _final(tmp_path / "full"), _final(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_torchrun_two_processes_stay_in_sync(counter_dir, tmp_path):
    proc = _run("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "tests.train.counter_run", str(counter_dir), str(tmp_path / "ddp"), "6")
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, output
    assert "terminate called" not in output  # a rank that exits inside the process group can abort
    assert output.count("all 2 ranks hold identical weights") >= 2  # at checkpoints and at the end
    assert (tmp_path / "ddp" / "final" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("signalled", ["torchrun", "workers"])
def test_torchrun_stops_every_rank_after_one_step_on_sigterm_and_rank_0_saves_it(counter_dir, tmp_path, signalled):
    """SIGTERM to torchrun (which passes it on), or to the workers alone (`kill` on their pids). In the second
    case, with steps of 2 s and saves of 1 s: rank 1 is done with the step long before rank 0 has saved, and
    torchrun, seeing a worker leave, sends rank 0 a SIGTERM that is no echo of the first (over a second later), so
    rank 0 would stop in mid-save unless the ranks wait for each other (the barrier in `Trainer._stop`)."""
    from blockdraft.train.trainer import _checkpoints

    out, slow = tmp_path / "ddp", ["--slow-step=2", "--slow-save=1"] if signalled == "workers" else []
    proc = _run("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "tests.train.counter_run",
                str(counter_dir), str(out), "100000", "--save-every=100000", "--epochs=1000", *slow)
    metrics, deadline = out / "metrics.jsonl", time.time() + 240

    def rows() -> int:
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    while proc.poll() is None and time.time() < deadline and rows() < 3:
        time.sleep(0.02)
    if signalled == "torchrun":
        proc.send_signal(signal.SIGTERM)
    else:
        logged = rows()
        while proc.poll() is None and time.time() < deadline and rows() == logged:  # a step just began
            time.sleep(0.02)
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2, workers
        for pid in workers:
            os.kill(int(pid), signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert "stopped at step" in output and "terminate called" not in output, output
    assert "all 2 ranks hold identical weights" in output  # both ranks stopped at the same step
    steps = [int(p.name.split("-")[1]) for p in _checkpoints(out)]
    assert len(steps) == 1 and 3 <= steps[0] < 1000, output  # that step, saved by rank 0 before anyone left
    saved = _checkpoints(out)[0]  # written whole (atomic), so the folder alone says the save finished
    assert (saved / "drafter" / "model.safetensors").is_file() and (saved / "trainer.json").is_file()
    assert not (out / "final").exists()


def test_distributed_world_joins_and_leaves_the_process_group(monkeypatch):
    import torch.distributed as dist

    from blockdraft.train.trainer import distributed_world

    with distributed_world():  # not launched by torchrun: nothing to join
        assert not dist.is_initialized()
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "0"}.items():
        monkeypatch.setenv(name, value)
    with distributed_world():
        assert dist.is_initialized() and dist.get_world_size() == 1
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="inside"), distributed_world():
        raise RuntimeError("inside")
    assert not dist.is_initialized()  # left on the way out of a failed run too

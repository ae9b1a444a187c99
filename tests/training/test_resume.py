"""Exact resume: resumed == uninterrupted (metrics at every step, prompts seen, parameters) in every configuration,
a crash while saving never leaves a checkpoint that resume picks and then fails on, a killed process resumes to
exactly `max_steps`, and resuming a finished run changes nothing."""

import json
import logging
import math
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from transformers.trainer_utils import get_last_checkpoint
from trl.trainer.utils import RepeatSampler

import trl_grpo_ext.trainer
from tests.resume_check import TIMING_KEYS, build_trainer, check_resume, compare, run_phase, start_phase
from tests.two_process import resume_diff, two_process
from trl_grpo_ext.resume import (
    LAYOUT_NAME,
    MANIFEST_NAME,
    EpochSeededSampler,
    checkpoint_problem,
    last_complete_checkpoint,
    write_manifest,
)

CONFIGS = {
    "default": {},
    "num_iterations=2": {"num_iterations": 2},
    "steps_per_generation>grad_accum": {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
                                        "steps_per_generation": 4},
    "lora": {"lora": 4, "learning_rate": 3e-2},
    "beta>0": {"beta": 0.04},
    # a generation cycle of 4 steps with a checkpoint every 3: the save falls inside a cycle
    "save_steps_inside_generation_cycle": {"steps_per_generation": 4, "per_device_train_batch_size": 8},
    "logging_steps=2": {"logging_steps": 2, "max_steps": 7, "save_steps": 3},
}  # fmt: skip


@pytest.fixture(scope="module")
def default_run(tiny_model_dir, tmp_path_factory) -> tuple[dict, Path]:
    """The uninterrupted run of resume_check's defaults (6 steps, a checkpoint every 3), trained once for the module:
    (its record, its output folder). `test_resumed_run_equals_uninterrupted[default]` resumes from it, the crash tests
    compare with it, and the truncation and finished-run tests each work on a copy of its folder."""
    out = tmp_path_factory.mktemp("default-run") / "run"
    return run_phase({}, tiny_model_dir, str(out)), out


def _copy_of(run: tuple[dict, Path], out: Path) -> Path:
    shutil.copytree(run[1], out)  # copy2: the files' modification times too
    return out


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_resumed_run_equals_uninterrupted(config, tmp_path, tiny_model_dir, default_run):
    """For `default`, the uninterrupted run is the module's shared `default_run`."""
    max_diff = check_resume(config, tmp_path, tiny_model_dir, full_run=default_run if config == {} else None)
    print(f"max abs diff resumed vs uninterrupted: {max_diff}")


@two_process("resume", {"per_device_train_batch_size": 6}, resume_step=3)
def test_two_processes_resume_exactly(two_process_runs):
    """`accelerate launch --multi_gpu --num_processes 2` on the CPU (gloo): both ranks, prompts and weights. The
    uninterrupted and resumed runs are scenario "resume" of the suite's shared two-process job
    (tests/two_process.py)."""
    max_diff = resume_diff(two_process_runs["resume"], resume_step=3)
    print(f"max abs diff resumed vs uninterrupted, 2 processes: {max_diff}")


def _crash_on_save_at(trainer, step: int, where: str, monkeypatch):
    """Make the checkpoint save at `step` fail: half-way through transformers' save (after the weights and optimizer,
    before the RNG and trainer state), or after it, just before the manifest."""

    def fail_at_step(original):
        def failing(*args, **kwargs):
            if trainer.state.global_step == step:
                raise OSError("simulated kill while writing the checkpoint")
            return original(*args, **kwargs)

        return failing

    if where == "inside_transformers_save":
        trainer._save_rng_state = fail_at_step(trainer._save_rng_state)
    else:
        monkeypatch.setattr("trl_grpo_ext.trainer.write_manifest", fail_at_step(trl_grpo_ext.trainer.write_manifest))


@pytest.mark.parametrize("where", ["inside_transformers_save", "before_manifest"])
@pytest.mark.parametrize("save_total_limit", [None, 1])
def test_crash_while_saving_resumes_from_last_complete_checkpoint(
    tmp_path, tiny_model_dir, caplog, monkeypatch, save_total_limit, where, default_run
):
    """The reference is the module's shared uninterrupted run of the defaults (`default_run`): `save_total_limit`
    rotates checkpoints and changes no logged value, prompt or weight."""
    config = {"save_total_limit": save_total_limit}
    reference = default_run[0]

    out = tmp_path / "crashed"
    trainer, _ = build_trainer(config, tiny_model_dir, str(out))
    _crash_on_save_at(trainer, 6, where, monkeypatch)
    with pytest.raises(OSError, match="simulated kill"):
        trainer.train()
    monkeypatch.undo()
    # checkpoint-3 survived (rotation waits for a complete checkpoint); checkpoint-6 is half written, and it is the
    # one stock transformers would resume from.
    assert (out / "checkpoint-3" / MANIFEST_NAME).is_file() and (out / "checkpoint-6" / "model.safetensors").is_file()
    assert get_last_checkpoint(str(out)).endswith("checkpoint-6")

    trainer, reward = build_trainer(config, tiny_model_dir, str(out))
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.trainer"):
        trainer.train(resume_from_checkpoint=True)
    assert "Skipping incomplete checkpoint" in caplog.text and "checkpoint-6" in caplog.text
    assert f"Resuming from {out / 'checkpoint-3'} (step 3)" in caplog.text
    resumed = {
        "logs": [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in trainer.state.log_history],
        "prompts": reward.calls,
        "params": {n: p.detach().float() for n, p in trainer.model.named_parameters() if p.requires_grad},
    }
    assert compare(reference, resumed, resume_step=3) == 0.0
    assert checkpoint_problem(str(out / "checkpoint-6")) is None  # rewritten complete by the resumed run


def test_truncated_checkpoint_file_is_skipped_and_named(tmp_path, tiny_model_dir, caplog, default_run):
    """On a copy of the module's shared uninterrupted run (`default_run`)."""
    out = _copy_of(default_run, tmp_path / "run")
    weights = out / "checkpoint-6" / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size // 2)
    assert "model.safetensors" in checkpoint_problem(str(out / "checkpoint-6"))

    with pytest.raises(ValueError, match=r"checkpoint-6'? is incomplete: model\.safetensors has \d+ bytes"):
        build_trainer({}, tiny_model_dir, str(out))[0].train(resume_from_checkpoint=str(out / "checkpoint-6"))
    trainer, _ = build_trainer({"max_steps": 7}, tiny_model_dir, str(out))
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.trainer"):
        trainer.train(resume_from_checkpoint=True)
    assert "Skipping incomplete checkpoint" in caplog.text and "checkpoint-3" in caplog.text
    assert trainer.state.global_step == 7


def test_a_feature_turned_on_at_resume_starts_afresh_and_says_so(tmp_path, tiny_model_dir, caplog, default_run):
    """A checkpoint written with every feature off, resumed with ZClip on (a feature that keeps state): ZClip starts
    from its initial state, the warning names the checkpoint and the feature, and the run trains to its end."""
    out = _copy_of(default_run, tmp_path / "run")
    trainer, _ = build_trainer({"max_steps": 7, "grad_reg": ["zclip"]}, tiny_model_dir, str(out))
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.trainer"):
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-6"))
    assert f"{out / 'checkpoint-6'} holds no state of grad_reg (it was off when the checkpoint was written)" in (
        caplog.text
    )
    assert trainer.state.global_step == 7 and trainer.grad_reg_state is not None


def _snapshot(folder: Path) -> dict[str, tuple[int, bytes] | None]:
    """Every file (modification time in ns, contents) and every folder (None) under `folder`, by relative path."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes()) if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


FINISHED_RUNS = {
    "max_steps": ({}, True, 6, "max_steps=6"),
    "max_steps, checkpoint path": ({}, "checkpoint-6", 6, "max_steps=6"),
    # 2 steps an epoch: the run ends in the middle of epoch 3, where transformers would train step 6
    "num_train_epochs": ({"max_steps": -1, "num_train_epochs": 2.5, "save_steps": 5}, True, 5, "num_train_epochs=2.5"),
}  # fmt: skip


@pytest.mark.parametrize(("config", "resume", "last_step", "bound"), FINISHED_RUNS.values(), ids=FINISHED_RUNS.keys())
def test_resuming_a_finished_run_changes_nothing(
    tmp_path, tiny_model_dir, caplog, config, resume, last_step, bound, default_run
):
    """A finished job relaunched (`train(resume_from_checkpoint=...)` on its last checkpoint): stock TRL trains one
    step past the end and overwrites the final checkpoint; here nothing is trained or written, and a warning says so.
    With the default settings the finished run is a copy of the module's shared `default_run`.
    """
    out = tmp_path / "run"
    if config == {}:
        finished = default_run[0]
        _copy_of(default_run, out)
    else:
        finished = run_phase(config, tiny_model_dir, str(out))
    last = out / f"checkpoint-{last_step}"
    assert last_complete_checkpoint(str(out))[0] == str(last)
    before = _snapshot(out)

    trainer, reward = build_trainer(config, tiny_model_dir, str(out))
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.trainer"):
        output = trainer.train(resume_from_checkpoint=str(out / resume) if isinstance(resume, str) else resume)
    assert f"Run already complete at step {last_step} ({bound}" in caplog.text
    assert "nothing to train" in caplog.text and str(last) in caplog.text
    assert trainer.run_already_complete
    assert output.global_step == trainer.state.global_step == last_step and math.isnan(output.training_loss)
    assert output.metrics["train_loss"] != output.metrics["train_loss"]  # nan: no step ran
    assert _snapshot(out) == before  # no file written, touched or removed, no checkpoint-<last_step + 1>
    assert reward.calls == []  # nothing generated
    assert trainer.state.log_history == json.loads((last / "trainer_state.json").read_text())["log_history"]
    # The model holds the finished run's weights, so a script that saves it after train() saves the final model.
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(param.detach().float(), finished["params"][name], rtol=0, atol=0)

    trainer, _ = build_trainer({**config, "max_steps": last_step + 1}, tiny_model_dir, str(out))
    trainer.train(resume_from_checkpoint=True)  # a longer run goes on from the same checkpoint
    assert not trainer.run_already_complete and trainer.state.global_step == last_step + 1


KILLED = {"save_steps": 1, "max_steps": 4}


@pytest.fixture(scope="module")
def killed_reference(tiny_model_dir, tmp_path_factory) -> dict:
    """The uninterrupted run of `KILLED`, trained once for both killed-process tests."""
    return run_phase(KILLED, tiny_model_dir, str(tmp_path_factory.mktemp("killed-reference") / "run"))


@pytest.mark.parametrize("kill_after", [1, 3], ids=["mid-run", "final-step-or-save"])
def test_killed_process_resumes_to_exactly_max_steps(tmp_path, tiny_model_dir, kill_after, killed_reference):
    """SIGKILL a real training process (a checkpoint every step) at a seeded random moment once checkpoint
    `kill_after` of 4 is complete: in the next step or its save (for 3: the last step or the final checkpoint's
    save); another process resumes to exactly max_steps, as the uninterrupted run (`killed_reference`, shared)."""
    config = KILLED
    out = tmp_path / "killed"
    delay = random.Random(kill_after).uniform(0.0, 0.5)  # seconds after the checkpoint is complete
    complete = out / f"checkpoint-{kill_after}" / MANIFEST_NAME
    proc = start_phase(config, tiny_model_dir, str(out))
    try:
        deadline = time.monotonic() + 120
        while not complete.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        # within the next step or the start of its save, however fast this machine trains
        kill_at, next_save = time.monotonic() + delay, out / f"checkpoint-{kill_after + 1}"
        while time.monotonic() < kill_at and not next_save.exists() and proc.poll() is None:
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, Path(f"{out}.log").read_text()[-3000:]
    path, _ = last_complete_checkpoint(str(out))
    resume_step = int(path.rpartition("-")[2])
    assert kill_after <= resume_step < 4, path

    resumed = run_phase(config, tiny_model_dir, str(out), resume_from=True)
    assert resumed["logs"][-1]["step"] == 4
    assert compare(killed_reference, resumed, resume_step) == 0.0
    assert last_complete_checkpoint(str(out))[0] == str(out / "checkpoint-4")
    assert not (out / "checkpoint-5").exists()


def test_no_complete_checkpoint_is_a_clear_error(tmp_path, tiny_model_dir):
    (tmp_path / "empty" / "checkpoint-2").mkdir(parents=True)
    trainer, _ = build_trainer({}, tiny_model_dir, str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="no complete checkpoint-N folder in output_dir="):
        trainer.train(resume_from_checkpoint=True)
    # a path with nothing there is not "incomplete" (issue #30's fresh-user check): it is not a folder
    with pytest.raises(ValueError, match=r"checkpoint-99' is not a folder; give a checkpoint-N folder"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "empty" / "checkpoint-99"))


@pytest.mark.parametrize(
    ("change", "effect"),
    [
        ({"num_generations": 6}, "num_generations 4 -> 6): transformers counts the 3 steps done as 2 prompts each "
                                 "where they took 3, so it skips the wrong part of the data (about 3 prompts trained "
                                 "again)"),
        ({"per_device_train_batch_size": 24}, "per_device_train_batch_size 12 -> 24, generation_batch_size 12 -> 24): "
                                              "transformers counts the 3 steps done as 6 prompts each where they took "
                                              "3, so it skips the wrong part of the data (about 9 prompts skipped)"),
    ],
    ids=["num_generations", "batch size"],
)  # fmt: skip
def test_resuming_with_another_batch_layout_is_refused_naming_what_changed(tmp_path, default_run, tiny_model_dir,
                                                                           change, effect):  # fmt: skip
    """Issue #71, item 5 (transformers PR #43718, inherited from stock TRL): resumed with another num_generations or
    batch size, transformers skips the steps done counted at the new layout, and prompts were silently skipped or
    trained twice. The checkpoint records its layout; a resume with another one is a ValueError before anything is
    loaded from it."""
    out = _copy_of(default_run, tmp_path / "run")
    checkpoint = out / "checkpoint-3"
    trainer, _ = build_trainer(change, tiny_model_dir, str(out))
    with pytest.raises(ValueError) as raised:
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert str(raised.value) == (
        f"resume_from_checkpoint='{checkpoint}' was saved with another batch layout ({effect}, and the saved "
        f"generation batch no longer fits; resume with the checkpoint's settings "
        f"({', '.join(f'{name}={json.loads((checkpoint / LAYOUT_NAME).read_text())[name]}' for name in change)}"
        f"{', generation_batch_size=12' if 'per_device_train_batch_size' in change else ''}), or start a new run from "
        f"its weights (model_name_or_path='{checkpoint}', without resume_from_checkpoint)"
    )
    assert trainer.state.global_step == 0  # nothing was loaded


def test_manifest_lists_every_file_with_its_size(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"12345")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_text("{}")
    write_manifest(str(tmp_path))
    assert json.loads((tmp_path / MANIFEST_NAME).read_text()) == {"files": {"a.bin": 5, "sub/b.json": 2}}
    assert checkpoint_problem(str(tmp_path)) is None
    (tmp_path / "sub" / "b.json").unlink()
    assert checkpoint_problem(str(tmp_path)) == "sub/b.json is missing"


def test_sampler_orders_match_trl_and_survive_a_new_sampler():
    """The TRL behaviour behind the resume bug, and the fix: epoch e's order depends on e alone."""
    make = lambda: RepeatSampler(range(8), mini_repeat_count=1, batch_size=4, seed=0)  # noqa: E731
    stock = make()
    stock_epochs = [list(stock) for _ in range(3)]
    assert list(make()) == stock_epochs[0] != stock_epochs[1]  # a fresh TRL sampler restarts at epoch 0's order
    ours = EpochSeededSampler(make())
    assert [list(ours) for _ in range(3)] == stock_epochs  # uninterrupted: TRL's orders, bit for bit
    resumed = EpochSeededSampler(make())
    resumed.set_epoch(2)
    assert list(resumed) == stock_epochs[2]

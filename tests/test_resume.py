"""Exact resume: resumed == uninterrupted (metrics at every step, prompts seen, parameters) in every configuration,
and a crash while saving never leaves a checkpoint that resume picks and then fails on."""

import json
import logging

import pytest
from transformers.trainer_utils import get_last_checkpoint
from trl.trainer.utils import RepeatSampler

import trl_grpo_ext.trainer
from tests.resume_check import TIMING_KEYS, build_trainer, check_resume, compare, run_phase
from trl_grpo_ext.resume import MANIFEST_NAME, EpochSeededSampler, checkpoint_problem, write_manifest

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


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_resumed_run_equals_uninterrupted(config, tmp_path, tiny_model_dir):
    max_diff = check_resume(config, tmp_path, tiny_model_dir)
    print(f"max abs diff resumed vs uninterrupted: {max_diff}")


def test_two_processes_resume_exactly(tmp_path, tiny_model_dir):
    """`accelerate launch --multi_gpu --num_processes 2` on the CPU (gloo): both ranks, prompts and weights."""
    max_diff = check_resume({"per_device_train_batch_size": 6}, tmp_path, tiny_model_dir, num_processes=2)
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
    tmp_path, tiny_model_dir, caplog, monkeypatch, save_total_limit, where
):
    config = {"save_total_limit": save_total_limit}
    reference = run_phase(config, tiny_model_dir, str(tmp_path / "reference"))

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
    assert f"Resuming from {out / 'checkpoint-3'}" in caplog.text
    resumed = {
        "logs": [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in trainer.state.log_history],
        "prompts": reward.calls,
        "params": {n: p.detach().float() for n, p in trainer.model.named_parameters() if p.requires_grad},
    }
    assert compare(reference, resumed, resume_step=3) == 0.0
    assert checkpoint_problem(str(out / "checkpoint-6")) is None  # rewritten complete by the resumed run


def test_truncated_checkpoint_file_is_skipped_and_named(tmp_path, tiny_model_dir, caplog):
    out = tmp_path / "run"
    run_phase({}, tiny_model_dir, str(out))
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


def test_no_complete_checkpoint_is_a_clear_error(tmp_path, tiny_model_dir):
    (tmp_path / "empty" / "checkpoint-2").mkdir(parents=True)
    trainer, _ = build_trainer({}, tiny_model_dir, str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="No complete checkpoint found in output_dir="):
        trainer.train(resume_from_checkpoint=True)


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

"""The per-step metrics table and the reward/entropy plot of the recipes."""

from types import SimpleNamespace

from trl_grpo_ext.reporting.callbacks import MetricsTableCallback


def test_table_rows_history_and_plot(tmp_path, capsys):
    callback = MetricsTableCallback()
    args = SimpleNamespace(output_dir=str(tmp_path))
    for step, reward in [(1, 0.25), (2, 0.5), (3, None)]:
        state = SimpleNamespace(is_world_process_zero=True, global_step=step)
        logs = {"reward": reward, "reward_std": 0.1, "entropy": 2.0 - step / 10, "step_time": 0.5}
        callback.on_log(args, state, None, logs=logs)
    callback.on_log(args, state, None, logs={"train_runtime": 3.0})  # the closing summary is no step row
    callback.on_train_end(args, state, None)

    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["step", "reward", "reward", "std"]
    assert out[1].split() == ["1", "0.2500", "0.1000", "1.9000", "-", "0.500"]
    assert out[3].split()[1] == "-"  # a missing value prints as "-"
    assert out[4] == "train_runtime: 3.0 s for 3 steps"
    assert len((tmp_path / "training_metrics.jsonl").read_text().splitlines()) == 3
    png = (tmp_path / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_with_prompt_skipping_the_table_shows_the_tokens(tmp_path, capsys):
    callback = MetricsTableCallback()
    args = SimpleNamespace(output_dir=str(tmp_path), prompt_skip=True)
    state = SimpleNamespace(is_world_process_zero=True, global_step=1)
    logs = {"reward": 0.5, "reward_std": 0.1, "entropy": 2.0, "step_time": 0.5,
            "prompt_skip/completion_tokens": 480.0, "prompt_skip/tokens_saved": 160.0}  # fmt: skip
    callback.on_log(args, state, None, logs=logs)
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[-3:] == ["tokens", "skipped", "(total)"]
    assert row.split()[-2:] == ["480", "160"]


def test_a_resumed_runs_files_cover_every_step_once(tmp_path, tiny_model_dir, capsys):
    """Issue #30: train 4 steps with a checkpoint every 2, then resume from checkpoint-2 twice over (as after two
    interruptions): training_metrics.jsonl holds steps 1-4 once each, the runtime line counts the steps trained."""
    import json

    from datasets import Dataset

    from tests.conftest import small_grpo_kwargs
    from trl_grpo_ext import GRPOConfig, GRPOTrainer

    dataset = Dataset.from_list([{"prompt": f"Count to {i}:"} for i in range(16)])

    def reward(completions, **kwargs):
        return [len(c) % 5 / 5 for c in completions]

    def train(max_steps, resume=None):
        args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=max_steps, save_strategy="steps", save_steps=2))
        trainer = GRPOTrainer(tiny_model_dir, [reward], args, dataset, callbacks=[MetricsTableCallback()])
        trainer.train(resume_from_checkpoint=resume)

    train(2)  # interrupted after its checkpoint-2
    train(4, resume=str(tmp_path / "checkpoint-2"))
    capsys.readouterr()
    train(4, resume=str(tmp_path / "checkpoint-2"))  # again, from the same checkpoint
    rows = [json.loads(line) for line in (tmp_path / "training_metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert all(isinstance(row["reward"], float) for row in rows)
    runtime = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train_runtime")]
    assert len(runtime) == 1 and runtime[0].endswith("s for 2 steps (resumed at step 2)")

"""Smallest reproductions, on stock TRL 1.16 / transformers 5, of the three causes of inexact resume (issue #3).

    python benchmarks/resume/repro_trl_resume.py

1. TRL `RepeatSampler`: one stateful generator draws each epoch's order, so a new sampler (what a resumed run builds)
   gives epoch 0's order in every later epoch. No training needed.
2. TRL `GRPOTrainer`: `_buffered_inputs` and `_step` are not checkpointed. With `steps_per_generation=2` and a
   checkpoint after step 1 (inside a generation cycle) the resumed run generates again at step 2: other completions,
   other rewards.
3. transformers `Trainer`: the running loss since the last log (`_tr_loss`) is not checkpointed, so with
   `logging_steps=2` and a checkpoint at step 3, the loss logged at step 4 averages steps 3-4 uninterrupted but only
   step 4 after the resume (beta > 0 keeps the loss away from 0).

Each case prints what the uninterrupted and the resumed run saw; all three say DIFFERENT on stock TRL.
"""

import tempfile

import trl
from datasets import Dataset
from transformers import PrinterCallback
from trl.trainer.utils import RepeatSampler

from trl_grpo_ext.cli.tiny_model import save_tiny_model
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows


def sampler_case() -> None:
    def make():
        return RepeatSampler(range(8), mini_repeat_count=1, batch_size=4, seed=0)

    sampler = make()
    uninterrupted_epoch_1 = [list(sampler) for _ in range(2)][1]
    resumed_epoch_1 = list(
        make()
    )  # transformers builds a new data loader; it skips batches, it does not replay epochs
    verdict = "same" if uninterrupted_epoch_1 == resumed_epoch_1 else "DIFFERENT"
    print(f"1. epoch 1 order: uninterrupted {uninterrupted_epoch_1}, resumed {resumed_epoch_1}: {verdict}")


def length_reward(completions, **kwargs):
    return [(len(c[0]["content"]) % 7) / 7 for c in completions]


def train(model_dir: str, output_dir: str, resume: str | None, **overrides) -> list[dict]:
    settings = dict(
        per_device_train_batch_size=8, num_generations=4, max_completion_length=16, learning_rate=3e-3, max_steps=4,
        save_steps=1, logging_steps=1, report_to="none", seed=1, use_cpu=True, bf16=False, disable_tqdm=True,
    )  # fmt: skip
    args = trl.GRPOConfig(output_dir=output_dir, **{**settings, **overrides})
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(64)))
    trainer = trl.GRPOTrainer(model=model_dir, reward_funcs=[length_reward], args=args, train_dataset=dataset)
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=resume)
    return [row for row in trainer.state.log_history if "loss" in row]


def trainer_case(number: int, model_dir: str, tmp: str, resume_step: int, key: str, step: int, **overrides) -> None:
    full = train(model_dir, f"{tmp}/full{number}", None, **overrides)
    resumed = train(model_dir, f"{tmp}/resumed{number}", f"{tmp}/full{number}/checkpoint-{resume_step}", **overrides)
    a = next(row[key] for row in full if row["step"] == step)
    b = next(row[key] for row in resumed if row["step"] == step)
    print(
        f"{number}. {key} at step {step}: uninterrupted {a:.4e}, resumed {b:.4e}: {'same' if a == b else 'DIFFERENT'}"
    )


def main() -> None:
    sampler_case()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(f"{tmp}/tiny"))
        trainer_case(2, model_dir, tmp, 1, "grad_norm", 2, steps_per_generation=2, per_device_train_batch_size=4)
        trainer_case(3, model_dir, tmp, 3, "loss", 4, logging_steps=2, beta=0.5)


if __name__ == "__main__":
    main()

"""One check that a resumed run continues exactly as the uninterrupted one, for any trainer configuration.

    max_diff = check_resume({"num_iterations": 2, "beta": 0.04}, tmp_path, model_dir)

runs the configuration for `max_steps` steps uninterrupted (saving every `save_steps`), then again from the
checkpoint at `resume_step`, and asserts that after the resume every logged metric at every step, the prompts seen
(with the step they were generated at) and the final parameters are the same (max abs diff <= `atol`). Features of
trl_grpo_ext that keep state across steps pass their settings in `config` and get the check for free.

Run as a script (`python -m tests.resume_check CONFIG_JSON`) it trains the uninterrupted run in a process of its own
(`start_phase`: a process the tests kill). The two-process runs are scenarios of tests/two_process.py.
"""

import json
import math
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

from datasets import Dataset
from peft import LoraConfig
from transformers import PrinterCallback

from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows

# Timings differ between any two runs; `train_loss` is transformers' mean loss of one `train()` call, which after a
# resume covers only the steps that call ran (by design: `Trainer._initial_global_step`).
REPO_ROOT = Path(__file__).resolve().parents[1]
TIMING_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"}
TIMING_KEYS |= {"fast_generation/merge_time"}
DEFAULTS = dict(
    per_device_train_batch_size=12,
    num_generations=4,
    max_completion_length=16,
    learning_rate=3e-3,
    max_steps=6,
    save_steps=3,
    logging_steps=1,
    report_to="none",
    seed=11,
    use_cpu=True,
    bf16=False,
    disable_tqdm=True,
)


class RecordingReward:
    """Completion length modulo 7, scaled to [0, 1) (spread on a random model), recording each call's prompts."""

    __name__ = "recording_reward"

    def __init__(self):
        self.trainer = None
        self.calls: list[tuple[int, list[str]]] = []

    def __call__(self, completions, prompts, **kwargs):
        step = self.trainer.state.global_step if self.trainer is not None else -1
        self.calls.append((step, [p[-1]["content"] for p in prompts]))
        solved = kwargs.get("solved") or [False] * len(completions)  # a `half_solved` dataset's solved prompts
        return [1.0 if s else (len(c[0]["content"]) % 7) / 7 for c, s in zip(completions, solved, strict=True)]


SCRIPTED_LENGTH = 10  # tokens of every scripted completion


class ScriptedCompletions(GRPOTrainer):
    """Training completions scripted instead of generated: the c-th copy of a prompt at step s gets SCRIPTED_LENGTH
    tokens drawn from a hash of (prompt, c, s), whichever other prompts the generation batch holds (sampling would
    draw each row's tokens from a stream shared by the whole batch). Lets a run that generates for fewer prompts be
    compared with one that generates for all. Evaluation generates as TRL does."""

    def hook_generate_single_turn(self, prompt_ids, *args, **kwargs):
        if not self.model.training:
            return super().hook_generate_single_turn(prompt_ids, *args, **kwargs)
        completions = []
        first = self.accelerator.process_index * len(prompt_ids)  # this process's first row of the global batch
        for i, ids in enumerate(prompt_ids):
            copy = (first + i) % self.num_generations  # each prompt num_generations times in a row (TRL's layout)
            seed = zlib.crc32(repr((tuple(int(t) for t in ids), copy, self.state.global_step)).encode())
            completions.append([100 + (seed * (k + 1) * 2654435761 >> 7) % 300 for k in range(SCRIPTED_LENGTH)])
        return completions, None


class NonFiniteLoss:
    """Mixed into a trainer class: the training loss of optimizer step `nan_step` (1-based, as logged) is NaN, so every
    gradient of that step is NaN: a bad batch at a chosen step."""

    nan_step: int

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if self.model.training and self.state.global_step + 1 == self.nan_step:
            return loss * float("nan")
        return loss


def build_trainer(config: dict, model_dir: str, output_dir: str) -> tuple[GRPOTrainer, RecordingReward]:
    """A trainer on seeded GSM8K-style problems; `config` holds GRPOConfig overrides plus `lora` (rank) and
    `num_problems` (dataset size, default 8: a few steps cross several epochs), `half_solved` (every other problem
    gets reward 1 for every completion: generation groups with nothing to learn), `scripted` (training completions
    from `ScriptedCompletions`) and `nan_step` (that step's loss is NaN: `NonFiniteLoss`)."""
    config = dict(config)
    lora_rank = config.pop("lora", None)
    num_problems = config.pop("num_problems", 8)
    trainer_class = ScriptedCompletions if config.pop("scripted", False) else GRPOTrainer
    nan_step = config.pop("nan_step", None)
    if nan_step is not None:
        trainer_class = type(
            "NonFinite" + trainer_class.__name__, (NonFiniteLoss, trainer_class), {"nan_step": nan_step}
        )
    rows = to_grpo_rows(synthetic_gsm8k(num_problems, seed=2))
    if config.pop("half_solved", False):
        rows = [{**row, "solved": i % 2 == 0} for i, row in enumerate(rows)]
    reward = RecordingReward()
    trainer = trainer_class(
        model=model_dir,
        reward_funcs=[reward],
        args=GRPOConfig(output_dir=output_dir, **{**DEFAULTS, **config}),
        train_dataset=Dataset.from_list(rows),
        peft_config=LoraConfig(r=lora_rank, target_modules=["q_proj", "v_proj"]) if lora_rank else None,
    )
    reward.trainer = trainer
    trainer.remove_callback(PrinterCallback)  # keeps the output readable; logs still reach trainer.state
    return trainer, reward


def trainable_parameters(trainer) -> dict:
    """The trainer's trainable parameters by name, whole, as fp32 CPU copies: FSDP2's `DTensor` shards gathered
    (`full_tensor`) and ZeRO-3's partitions too (`deepspeed.zero.GatheredParameters`), both collectives that every
    process calls alike."""
    from torch.distributed.tensor import DTensor

    # FSDP's activation checkpointing wraps each layer: its names gain "._checkpoint_wrapped_module", dropped here
    named = [(n.replace("._checkpoint_wrapped_module", ""), p) for n, p in trainer.model.named_parameters()]
    named = [(n, p) for n, p in named if p.requires_grad]
    if any(hasattr(p, "ds_id") for _, p in named):
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for _, p in named]):
            return {n: p.detach().float().cpu().clone() for n, p in named}
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().cpu().clone() for n, p in named}


def run_phase(
    config: dict,
    model_dir: str,
    output_dir: str,
    resume_from: str | None = None,
    end: bool = False,
    inspect: Callable[[GRPOTrainer], dict] | None = None,
) -> dict:
    """Train and return what the comparison needs: logged rows, prompts seen, final parameters (as lists); with
    `first_params=True` in `config`, also the parameters before training (`first_params`); with `inspect`, what it
    returns for the trained trainer (`inspected`: the engine it ran under, say).

    `end=True` closes the trainer's process group (the last call of a worker process)."""
    config = dict(config)
    record_first = config.pop("first_params", False)
    trainer, reward = build_trainer(config, model_dir, output_dir)

    def trainable():
        return trainable_parameters(trainer)

    first = trainable() if record_first else None
    trainer.train(resume_from_checkpoint=resume_from)
    inspected = inspect(trainer) if inspect is not None else None
    record = {
        "logs": [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in trainer.state.log_history],
        "prompts": reward.calls,
        "params": trainable(),  # before `end`: gathering sharded weights is a collective
        "output_dir": output_dir,
    }
    if end:
        trainer.end()  # without it, gloo's threads can abort the process at exit ("terminate called ...")
    return record | ({"first_params": first} if record_first else {}) | ({"inspected": inspected} if inspect else {})


def compare(full: dict, resumed: dict, resume_step: int) -> float:
    """Assert resumed == uninterrupted after `resume_step`; return the max abs difference found (metrics, weights)."""
    rows_full = [row for row in full["logs"] if row.get("step", 0) > resume_step]
    rows_resumed = [row for row in resumed["logs"] if row.get("step", 0) > resume_step]
    assert [sorted(r) for r in rows_full] == [sorted(r) for r in rows_resumed], "logged keys or steps differ"
    assert rows_full, "nothing was logged after the resume step"
    diffs = [0.0]
    for row_full, row_resumed in zip(rows_full, rows_resumed, strict=True):
        for key, value in row_full.items():
            other = row_resumed[key]
            if value is None or other is None or (math.isnan(value) and math.isnan(other)):
                assert value is other or (value != value and other != other), (row_full["step"], key)
                continue
            diffs.append(abs(value - other))
    assert [c for c in full["prompts"] if c[0] >= resume_step] == resumed["prompts"], "prompts seen differ"
    assert full["params"].keys() == resumed["params"].keys()
    diffs += [(full["params"][n] - resumed["params"][n]).abs().max().item() for n in full["params"]]
    return max(diffs)


def start_phase(config: dict, model_dir: str, output_dir: str) -> subprocess.Popen:
    """`run_phase` in a new Python process, started and not waited for (a process the tests kill); its output goes to
    `<output_dir>.log`."""
    job = {**config, "model_dir": model_dir, "output_dir": output_dir}
    cmd = [sys.executable, "-m", "tests.resume_check", json.dumps(job)]
    with open(f"{output_dir}.log", "w") as log:
        return subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)


def check_resume(
    config: dict, tmp_path, model_dir: str, resume_step: int = 3, atol: float = 1e-6, full_run=None
) -> float:
    """Run `config` uninterrupted and resumed from `checkpoint-<resume_step>`, assert they match; return max diff.

    `full_run`: (record, output folder) of an uninterrupted run of `config` already done (a test module's shared
    run), resumed from instead of training it again; the resume only reads its checkpoint. The two-process case is a
    scenario of the suite's shared two-process job (tests/two_process.py, `resume_diff`).
    """
    resumed_dir = str(tmp_path / "resumed")
    if full_run is None:
        full = run_phase(config, model_dir, str(tmp_path / "full"))
        checkpoint = tmp_path / "full" / f"checkpoint-{resume_step}"
    else:
        full, checkpoint = full_run[0], Path(full_run[1]) / f"checkpoint-{resume_step}"
    assert checkpoint.is_dir(), f"{checkpoint} was not saved; set save_steps to divide {resume_step}"
    resumed = run_phase(config, model_dir, resumed_dir, resume_from=str(checkpoint))
    max_diff = compare(full, resumed, resume_step)
    assert max_diff <= atol, f"resumed run differs from the uninterrupted one by {max_diff}"
    return max_diff


if __name__ == "__main__":  # one uninterrupted run in a process of its own (start_phase)
    from tests.cpu_compile import use_backend_from_env

    use_backend_from_env()
    config = json.loads(sys.argv[1])
    run_phase(config, config.pop("model_dir"), config.pop("output_dir"))

"""Issue #72: a slow step shows it is alive. SmolLM2's first step on busy CPU cores printed nothing for 11 minutes;
`StepProgress` prints what the step is doing while it runs (the recipe adds it). Here the tiny model's step is made
slow by a reward function that waits, and the lines are read at known points of the step."""

import re
import time

from datasets import Dataset

from tests.conftest import length_reward, small_grpo_kwargs
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.reporting.progress import StepProgress, duration, first_decoder_layer


def test_the_lines_say_what_a_slow_step_is_doing(tiny_model_dir, tmp_path, capsys):
    progress = StepProgress(every_s=0.05, later_every_s=None)  # a line every 50 ms in the first step, none later
    seen = {}

    def slow_reward(completions, **kwargs):
        seen.setdefault("scoring", progress.line(now=time.monotonic() + 60))  # as a minute on, without decoding
        time.sleep(0.4 if "slept" not in seen else 0.0)  # the first step lasts several intervals
        seen["slept"] = True
        return length_reward(completions)

    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}"}]} for i in range(16)])
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=2, max_completion_length=16, temperature=1.0))
    trainer = GRPOTrainer(tiny_model_dir, slow_reward, args, dataset, callbacks=[progress])
    layer = first_decoder_layer(trainer.model)
    assert layer is trainer.model.model.layers[0]

    def after_layer(module, inputs, output):  # runs after the progress hook, which is a pre-hook
        if progress._phase == "generating" and progress._tokens == 5:
            seen.setdefault("generating", progress.line())
        if progress._phase.startswith("the update"):
            seen.setdefault("update", progress.line())

    handle = layer.register_forward_hook(after_layer)
    try:
        trainer.train()
    finally:
        handle.remove()
    # the prefill gives the first token, each decoding step one more
    assert re.fullmatch(r"step 1/2, \d+s in: generating, 5 of at most 16 completion tokens", seen["generating"]), seen
    scoring = re.fullmatch(r"step 1/2, 1m\d\ds in: scoring the completions \(generated (\d+) tokens in \d+s\)",
                           seen["scoring"])  # fmt: skip
    assert scoring and 5 < int(scoring[1]) <= 16, seen
    assert re.fullmatch(r"step 1/2, \d+s in: the update \(forward and backward over the completions\)", seen["update"])
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(printed) >= 3 and all(line.startswith("step 1/2, ") for line in printed), printed  # none in step 2
    assert any(": generating, " in line for line in printed), printed
    # the end of training removes the hook and stops the lines
    assert progress._hook is None and progress._thread is None and not layer._forward_pre_hooks
    time.sleep(0.15)
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]


def test_durations_read_as_a_person_writes_them():
    assert [duration(s) for s in (0.4, 59, 60, 185, 3599, 3720)] == ["0s", "59s", "1m00s", "3m05s", "59m59s", "1h02m"]

"""Issue #71, item 3, through the real entry points: a value of TRL's or transformers' own fields that no run can use,
given in a YAML to the GSM8K recipe or to `trl-grpo-ext grpo`, is one line naming the field and the value, before any
model is loaded (the recipe builds no tiny model; the `grpo` config names a model folder that cannot load). A number in
a YAML mapping (`generation_kwargs: {top_p: 9e-1}`) is read as the number it is, and the run trains."""

import json

import pytest

from tests.conftest import REPO_ROOT
from tests.training import test_cli_errors
from tests.training.test_cli_errors import error_line, run_grpo, run_recipe

grpo_config, no_debug_env = test_cli_errors.grpo_config, test_cli_errors.no_debug_env  # its fixtures, here too

DEMO = (REPO_ROOT / "recipes/configs/demo_cpu.yaml").read_text()

# (YAML line, the start of the message after "error: ") -- the values
VALUES = [
    ("learning_rate: .nan", "learning_rate (the optimizer's step size) must be a finite number >= 0, got nan"),
    ("learning_rate: -1.0e-5", "learning_rate (the optimizer's step size) must be a finite number >= 0, got -1e-05"),
    ("adam_beta1: 1.5", "adam_beta1 (Adam's first-moment decay) must be a finite number in [0, 1), got 1.5"),
    ("top_k: -1", "top_k (tokens top-k sampling keeps; 0 keeps every token) must be an integer >= 0, got -1"),
    ("repetition_penalty: 0", "repetition_penalty (the repetition penalty; 1 is none) must be a finite number > 0, "
                              "got 0"),
    ("min_p: 2", "min_p (min-p sampling's threshold, relative to the likeliest token) must be a finite number in "
                 "[0, 1], got 2"),
    ("beta: -0.1", "beta (the KL coefficient; 0 loads no reference model) must be a finite number >= 0, got -0.1"),
    ("epsilon: -0.2", "epsilon (the lower clip range of the importance ratio) must be a finite number >= 0, got -0.2"),
    ("weight_decay: -1", "weight_decay (AdamW's decoupled weight decay) must be a finite number >= 0, got -1"),
    ("top_p: 1.5", "top_p (nucleus sampling's probability mass; 1 keeps every token) must be a finite number in "
                   "(0, 1], got 1.5"),
    ("max_grad_norm: -1", "max_grad_norm (the gradient-norm clip; 0 turns clipping off) must be a finite number >= 0, "
                          "got -1"),
    ("max_grad_norm: .nan", "max_grad_norm (the gradient-norm clip; 0 turns clipping off) must be a finite number "
                            ">= 0, got nan"),
    ("max_grad_norm: true", "max_grad_norm (the gradient-norm clip; 0 turns clipping off) must be a finite number "
                            ">= 0, got True"),
    ("generation_kwargs: {top_p: 9e0}", "generation_kwargs top_p (nucleus sampling's probability mass; 1 keeps every "
                                        "token) must be a finite number in (0, 1], got 9.0"),
]  # fmt: skip


@pytest.mark.parametrize("entry", ["recipe", "grpo"])
@pytest.mark.parametrize(("line", "message"), VALUES, ids=[line for line, _ in VALUES])
def test_a_trl_field_no_run_can_use_is_one_line_before_the_model_loads(
    tmp_path, capsys, request, entry, line, message
):
    config = tmp_path / "bad.yaml"
    if entry == "recipe":
        config.write_text(f"{DEMO}\n{line}\n")
        code = run_recipe(["--config", str(config), "--output_dir", str(tmp_path / "out")])
        prog = "math_gsm8k.py"
    else:  # its model folder holds an empty config.json: loading it would fail with another message
        config.write_text(f"{request.getfixturevalue('grpo_config').read_text()}\n{line}\n")
        code = run_grpo(["--config", str(config)])
        prog = "trl-grpo-ext grpo"
    assert code == 1
    assert error_line(capsys) == f"{prog}: error: {message} (run with --debug for the traceback)"
    assert not (tmp_path / "out").exists()  # no tiny model built, nothing written


def test_a_yaml_number_in_generation_kwargs_trains(tmp_path, capsys):
    """`generation_kwargs: {top_p: 9e-1}` reached `generate` as the string '9e-1' and the run died there with an
    85-line traceback after the model loaded."""
    config = tmp_path / "top_p.yaml"
    config.write_text(f"{DEMO}\ngeneration_kwargs: {{top_p: 9e-1}}\n")
    out = tmp_path / "out"
    argv = ["--config", str(config), "--output_dir", str(out), "--max_steps", "1", "--synthetic_problems", "16",
            "--eval_limit", "0", "--run_doctor", "false"]  # fmt: skip
    assert run_recipe(argv) == 0, capsys.readouterr().err[-3000:]
    args = json.loads((out / "training_metrics.jsonl").read_text().splitlines()[0])
    assert args["step"] == 1

"""register()/unregister(), TRL's own grpo script picking up our classes, and the trl-grpo-ext command."""

import json
import subprocess
import sys

import pytest
import trl
import trl.trainer
from transformers import AutoModelForCausalLM

import trl_grpo_ext
from trl_grpo_ext import cli

TRL_TRAINER, TRL_CONFIG = trl.trainer.grpo_trainer.GRPOTrainer, trl.trainer.grpo_config.GRPOConfig


def is_registered() -> bool:
    """Whether `trl.GRPOTrainer` is currently this package's class."""
    return trl.GRPOTrainer is trl_grpo_ext.GRPOTrainer


@pytest.fixture(autouse=True)
def _restore_trl():
    yield
    trl_grpo_ext.unregister()
    assert trl.GRPOTrainer is TRL_TRAINER


def test_register_swaps_and_unregister_restores():
    assert not is_registered()
    trl_grpo_ext.register()
    trl_grpo_ext.register()  # idempotent: the originals saved the first time are kept
    from trl import GRPOConfig, GRPOTrainer

    assert GRPOTrainer is trl_grpo_ext.GRPOTrainer and GRPOConfig is trl_grpo_ext.GRPOConfig
    assert trl.trainer.GRPOTrainer is trl_grpo_ext.GRPOTrainer
    trl_grpo_ext.unregister()
    trl_grpo_ext.unregister()
    from trl import GRPOConfig, GRPOTrainer

    assert (GRPOTrainer, GRPOConfig) == (TRL_TRAINER, TRL_CONFIG)
    assert (trl.trainer.GRPOTrainer, trl.trainer.GRPOConfig) == (TRL_TRAINER, TRL_CONFIG)


def _write_prompt_dataset(folder):
    """A local dataset in the form TRL's grpo script expects: `prompt` and `solution` columns."""
    folder.mkdir()
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "solution": str(2 * i)} for i in range(8)]
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def _grpo_script_args(model_dir, data_dir, out_dir):
    return [
        "--model_name_or_path", model_dir, "--dataset_name", str(data_dir), "--reward_funcs", "accuracy_reward",
        "--output_dir", str(out_dir), "--max_steps", "1", "--per_device_train_batch_size", "4",
        "--num_generations", "4", "--max_completion_length", "8", "--report_to", "none", "--use_cpu", "true",
        "--bf16", "false", "--save_strategy", "no", "--logging_steps", "1",
    ]  # fmt: skip


def test_trl_grpo_script_uses_our_classes_after_register(tiny_model_dir, tmp_path, monkeypatch):
    from trl.scripts import grpo

    built = []
    original_init = trl_grpo_ext.GRPOTrainer.__init__

    def recording_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        built.append((type(self), type(self.args)))

    monkeypatch.setattr(trl_grpo_ext.GRPOTrainer, "__init__", recording_init)
    trl_grpo_ext.register()
    parser = grpo.make_parser()
    script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(
        _grpo_script_args(tiny_model_dir, _write_prompt_dataset(tmp_path / "data"), tmp_path / "out")
    )
    assert type(training_args) is trl_grpo_ext.GRPOConfig
    grpo.main(script_args, training_args, model_args, dataset_args)
    assert built == [(trl_grpo_ext.GRPOTrainer, trl_grpo_ext.GRPOConfig)]
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_trl_grpo_script_uses_trl_classes_without_register(tiny_model_dir, tmp_path):
    from trl.scripts import grpo

    _, training_args, _, _ = grpo.make_parser().parse_args_and_config(
        _grpo_script_args(tiny_model_dir, tmp_path, tmp_path / "out")
    )
    assert type(training_args) is TRL_CONFIG


def test_cli_tiny_model_writes_a_loadable_model(tmp_path):
    """In process (`cli.main`); the installed command runs in a process of its own in `make wheel-check`, and
    `python -m trl_grpo_ext.cli` in `test_cli_rejects_unknown_subcommand`."""
    assert cli.main(["tiny-model", str(tmp_path / "m"), "--seed", "3"]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert model.config.model_type == "qwen2" and model.config.eos_token_id is not None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n") and tokenizer.decode(tokenizer(text).input_ids) == text


def test_cli_grpo_trains_with_our_trainer(tiny_model_dir, tmp_path):
    """In process (`cli.main`, which registers our classes: the autouse fixtures restore TRL's after the test); the
    command's exit codes and stderr in a process of its own are tests/training/test_cli_errors.py's."""
    data = _write_prompt_dataset(tmp_path / "data")
    args = _grpo_script_args(tiny_model_dir, data, tmp_path / "o") + ["--save_strategy", "steps", "--save_steps", "1"]
    assert cli.main(["grpo", *args]) == 0
    card = (tmp_path / "o" / "README.md").read_text()  # the model card is written at the top of output_dir
    assert "trl-grpo-ext" in card  # our trainer tags the model card


def test_cli_rejects_unknown_subcommand():
    proc = subprocess.run([sys.executable, "-m", "trl_grpo_ext.cli", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and "tiny-model" in proc.stderr

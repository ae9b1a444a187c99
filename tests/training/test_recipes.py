"""Recipes: every YAML parses into our config, the GSM8K recipe runs end to end on real data, bad input fails early."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM
from trl import ModelConfig

from tests.conftest import REPO_ROOT
from trl_grpo_ext import GRPOConfig
from trl_grpo_ext.gsm8k.data import DatasetFormatError

CONFIGS = sorted((REPO_ROOT / "recipes" / "configs").glob("*.yaml"))


def load_recipe(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_configs():
    assert {p.name for p in CONFIGS} >= {"demo_cpu.yaml", *(f"gsm8k-{gb}gb.yaml" for gb in (8, 12, 16, 24))}


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_yaml_parses_into_our_config(config):
    recipe = load_recipe("math_gsm8k")
    # --use_cpu: GPU configs ask for bf16, which TrainingArguments checks against the device of this machine.
    argv = ["--config", str(config), "--use_cpu", "true"]
    script_args, training_args, model_args = recipe.make_parser().parse_args_and_config(argv)
    assert isinstance(training_args, GRPOConfig)
    assert isinstance(model_args, ModelConfig)
    assert isinstance(script_args, recipe.GSM8KScriptArguments)
    header = config.read_text().splitlines()[:6]
    assert header[0].startswith("# ") and any("recipes/math_gsm8k.py" in line for line in header), header


def test_the_smollm2_cpu_config_says_what_a_step_costs_and_why_completions_are_cut():
    """Issue #72: its comment gives the step time measured on 2 idle cores, the share of it spent generating, and the
    share of completions cut at the length limit with the reason, and no placeholder is left."""
    config = (REPO_ROOT / "recipes/configs/smollm2_cpu.yaml").read_text()
    text = " ".join(line.lstrip("# ") for line in config.splitlines() if line.startswith("#"))
    assert "<LEAD" not in text and "Measured on 2 idle cores" in text
    seconds = re.search(r"(\d+)-(\d+) s a step, (\d+)-(\d+)% \((\d+)-(\d+) s\) of it generating", text)
    assert seconds is not None, text
    low, high, share_low, share_high, gen_low, gen_high = map(int, seconds.groups())
    assert low <= high and gen_low <= gen_high and share_low <= share_high
    assert share_low <= 100 * gen_high / low and 100 * gen_low / high <= share_high  # the share agrees with the times
    assert re.search(r"do not end inside the 128-token limit \(completions/clipped_ratio 0\.\d+", text)
    assert "max_completion_length: 128" in config


def test_unknown_yaml_field_is_named(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text((REPO_ROOT / "recipes/configs/demo_cpu.yaml").read_text() + "\nnum_generatoins: 4\n")
    with pytest.raises(ValueError, match="num_generatoins"):
        load_recipe("math_gsm8k").make_parser().parse_args_and_config(["--config", str(config)])


def test_unknown_command_line_field_is_named():
    argv = ["--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--max_stepz", "3"]
    with pytest.raises(ValueError, match="max_stepz"):
        load_recipe("math_gsm8k").make_parser().parse_args_and_config(argv)


def test_recipe_end_to_end_on_real_gsm8k(gsm8k_dir, tmp_path):
    """16 real GSM8K problems, tiny model, 2 steps, run as a user would: `python recipes/math_gsm8k.py ...`. A run of
    2 steps is a short one (issue #72): its evaluation takes 8 of the 12 problems asked for, and says so."""
    out = tmp_path / "run"
    cmd = [
        sys.executable, "recipes/math_gsm8k.py", "--config", "recipes/configs/demo_cpu.yaml",
        "--dataset_path", str(gsm8k_dir), "--train_limit", "16", "--max_steps", "2", "--eval_limit", "12",
        "--output_dir", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    rows = [json.loads(line) for line in (out / "training_metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(0.0 <= row["entropy"] <= 7.0 and row["reward"] is not None for row in rows)
    assert "reward std" in proc.stdout and "step time (s)" in proc.stdout
    assert (out / "training_curves.png").stat().st_size > 10_000
    assert "{'loss'" not in proc.stdout  # the table replaces transformers' raw dict of every logged value

    before = AutoModelForCausalLM.from_pretrained(out / "tiny-model").state_dict()
    after = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-4

    results = json.loads((out / "eval_results.json").read_text())
    assert results["num_problems"] == 8
    assert (f"max_steps=2 is a short run (under 10 steps): its evaluation takes 8 of eval_limit=12 test problems; "
            f"--eval_limit 0 skips it, and `python recipes/eval_gsm8k.py --model_name_or_path {out} --limit 12` "
            "evaluates the saved model on all 12") in proc.stdout  # fmt: skip
    assert 0.0 <= results["strict_accuracy"] <= results["lenient_accuracy"] <= 1.0
    assert len(results["samples"]) == 8 and all(isinstance(s["completion"], str) for s in results["samples"])
    assert "lenient_accuracy" in proc.stdout


def test_relaunching_a_finished_recipe_run_changes_nothing(tmp_path, capsys):
    """A requeued job: the recipe run again with --resume_from_checkpoint true after it finished neither trains nor
    overwrites the saved model, the metrics, the plots or eval_results.json, and says there is nothing left to do."""
    recipe = load_recipe("math_gsm8k")
    out = tmp_path / "run"
    argv = [
        "--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", str(out), "--synthetic_problems",
        "16", "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "2", "--eval_limit", "2",
    ]  # fmt: skip
    recipe.main(*recipe.make_parser().parse_args_and_config(argv))
    names = {
        "model.safetensors",
        "eval_results.json",
        "training_metrics.jsonl",
        "training_curves.png",
        "checkpoint-2",
        "trl_grpo_ext_model.json",
    }
    assert names <= {p.name for p in out.iterdir()}
    before = {str(p): (p.stat().st_mtime_ns, p.read_bytes()) if p.is_file() else None for p in out.rglob("*")}
    capsys.readouterr()

    results = recipe.main(*recipe.make_parser().parse_args_and_config([*argv, "--resume_from_checkpoint", "true"]))
    assert results == {}
    assert "Run already complete at step 2: its final model and evaluation are written; nothing to do" in (
        capsys.readouterr().out
    )
    assert {str(p): (p.stat().st_mtime_ns, p.read_bytes()) if p.is_file() else None for p in out.rglob("*")} == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--reward_funcs", "gsm8k_acuracy"], r"reward_funcs: unknown name\(s\) \['gsm8k_acuracy'\]"),
        (["--model_name_or_path", "no/such-model-here"], "model_name_or_path"),
        (
            ["--generation_lora_merge", "copy"],
            r"the model has none: train with LoRA \(peft_config; in the recipes --use_peft",
        ),
        (
            ["--use_peft", "true", "--load_in_4bit", "true", "--generation_compile", "true"],
            "does not compile bitsandbytes",
        ),
    ],
)
def test_bad_recipe_settings_fail_before_any_model_is_built(tmp_path, argv, message):
    recipe = load_recipe("math_gsm8k")
    base = ["--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ValueError, match=message):
        recipe.main(*recipe.make_parser().parse_args_and_config(base + argv))
    assert not (tmp_path / "out" / "tiny-model").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--eval_limit", "-1"], "eval_limit must be >= 0"), (["--train_limit", "0"], "train_limit must be >= 1")],
)
def test_bad_script_values_are_named_at_parse_time(argv, message):
    recipe = load_recipe("math_gsm8k")
    with pytest.raises(ValueError, match=message):
        recipe.make_parser().parse_args_and_config(
            ["--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), *argv]
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"limit": -1}, "limit must be >= 1"), ({"maj_k": 4, "temperature": 0.0}, "temperature must be > 0")],
)
def test_bad_eval_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_recipe("eval_gsm8k").EvalArguments(model_name_or_path="m", **kwargs)


@pytest.mark.parametrize("problem", ["missing", "empty", "no_answer_field"])
def test_bad_dataset_path_fails_before_model_is_loaded(tmp_path, problem):
    data = tmp_path / "data"
    if problem != "missing":
        data.mkdir()
        (data / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
        (data / "train.jsonl").write_text("" if problem == "empty" else '{"question": "q"}\n')
    recipe = load_recipe("math_gsm8k")
    argv = ["--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--dataset_path", str(data)]
    script_args, training_args, model_args = recipe.make_parser().parse_args_and_config(
        argv + ["--output_dir", str(tmp_path / "out")]
    )
    expected = {"missing": "no such folder", "empty": "empty", "no_answer_field": "train.jsonl:1: missing .*answer"}
    with pytest.raises(DatasetFormatError, match=expected[problem]):
        recipe.main(script_args, training_args, model_args)
    assert not (tmp_path / "out" / "tiny-model").exists()  # no model was built or loaded


def test_eval_script_on_eight_test_problems(gsm8k_dir, tiny_model_dir, tmp_path):
    recipe = load_recipe("eval_gsm8k")
    args = recipe.EvalArguments(
        model_name_or_path=tiny_model_dir, dataset_path=str(gsm8k_dir), limit=8, batch_size=4, max_new_tokens=12,
        maj_k=3, temperature=1.0, output_file=str(tmp_path / "eval.json"),
    )  # fmt: skip
    results = recipe.main(args)
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["num_problems"] == 8 and len(saved["samples"]) == 8
    assert set(saved) >= {"strict_accuracy", "lenient_accuracy", "maj@3", "model"}
    assert all(0.0 <= saved[k] <= 1.0 for k in ("strict_accuracy", "lenient_accuracy", "maj@3"))
    assert saved["strict_accuracy"] == results["strict_accuracy"]
    # Greedy decoding is deterministic: a second run gives the same completions.
    again = recipe.main(args)
    assert [s["completion"] for s in again["samples"]] == [s["completion"] for s in saved["samples"]]


def test_the_recipe_and_the_eval_script_format_prompts_as_training_did(gsm8k_dir, tmp_path, monkeypatch, capsys):
    """Issue #32.5: `--chat_template_kwargs` reaches the recipe's end-of-run evaluation and, through the run folder's
    chat_template_kwargs.json, `recipes/eval_gsm8k.py` on the run or one of its checkpoints; a flag given wins."""
    recipe = load_recipe("math_gsm8k")
    seen = []

    def spy(evaluate):
        return lambda *args, **kwargs: seen.append(kwargs["chat_template_kwargs"]) or evaluate(*args, **kwargs)

    monkeypatch.setattr(recipe, "evaluate_gsm8k", spy(recipe.evaluate_gsm8k))
    out = tmp_path / "run"
    argv = [
        "--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", str(out), "--synthetic_problems",
        "8", "--max_steps", "1", "--save_strategy", "steps", "--save_steps", "1", "--eval_limit", "2",
        "--chat_template_kwargs", '{"enable_thinking": false}',
    ]  # fmt: skip
    recipe.main(*recipe.make_parser().parse_args_and_config(argv))
    assert seen == [{"enable_thinking": False}]
    assert json.loads((out / "chat_template_kwargs.json").read_text()) == {"enable_thinking": False}

    evaluate = load_recipe("eval_gsm8k")
    monkeypatch.setattr(evaluate, "evaluate_gsm8k", spy(evaluate.evaluate_gsm8k))
    for model, flag in [(out, None), (out / "checkpoint-1", None), (out, '{"enable_thinking": true}')]:
        evaluate.main(evaluate.EvalArguments(model_name_or_path=str(model), dataset_path=str(gsm8k_dir), limit=1,
                                             max_new_tokens=2, chat_template_kwargs=flag))  # fmt: skip
    assert seen[1:] == [{"enable_thinking": False}, {"enable_thinking": False}, {"enable_thinking": True}]
    said = capsys.readouterr().out
    assert f"with chat_template_kwargs {{'enable_thinking': False}} (from {out / 'chat_template_kwargs.json'})" in said
    with pytest.raises(ValueError, match="chat_template_kwargs='true' must be a JSON object"):
        evaluate.EvalArguments(model_name_or_path=str(out), chat_template_kwargs="true")


def test_eval_script_loads_a_lora_adapter_folder(gsm8k_dir, tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    recipe = load_recipe("eval_gsm8k")
    args = recipe.EvalArguments(
        model_name_or_path=str(tmp_path / "adapter"), dataset_path=str(gsm8k_dir), limit=2, max_new_tokens=4
    )
    results = recipe.main(args)
    assert results["num_problems"] == 2
    assert (tmp_path / "adapter" / "eval_gsm8k.json").is_file()  # default name: a run's eval_results.json is kept


def test_ctrl_c_says_which_checkpoint_is_complete_and_the_resume_continues_the_files(tmp_path, capsys, monkeypatch):
    """Issue #30: Ctrl-C at step 3 (checkpoint-2 saved) prints one line with the checkpoint and the command to
    resume, exit code 130; that command resumes (one line says from where), and the run's metrics file covers steps
    1-4 once each."""
    from trl_grpo_ext import GRPOTrainer

    recipe = load_recipe("math_gsm8k")
    out = tmp_path / "run"
    argv = [
        "--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", str(out), "--synthetic_problems",
        "16", "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2", "--eval_limit", "0",
    ]  # fmt: skip
    step = GRPOTrainer.training_step

    def interrupted_at_step_3(self, *args, **kwargs):
        if self.state.global_step == 3:
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "training_step", interrupted_at_step_3)
    assert recipe.cli(argv) == 130
    stderr = capsys.readouterr().err
    err = [line for line in stderr.splitlines() if line.startswith("math_gsm8k.py:")]
    assert len(err) == 1 and "Traceback" not in stderr, stderr
    head = f"math_gsm8k.py: interrupted at step 3; the last complete checkpoint is {out}/checkpoint-2 (step 2); "
    python = os.path.relpath(sys.executable)  # the venv's interpreter where it lies under the working folder
    python = python if not python.startswith("..") and os.sep in python else "python"
    assert err[0].startswith(head + f"resume with: {python} ")
    assert err[0].endswith(" --eval_limit 0 --resume_from_checkpoint true")
    monkeypatch.undo()

    command = err[0].split("resume with: ")[1].split()
    assert command[1].endswith("math_gsm8k.py")
    assert recipe.cli(command[2:]) == 0
    assert "train_runtime" in (out_text := capsys.readouterr().out) and "for 2 steps (resumed at step 2)" in out_text
    rows = [json.loads(line) for line in (out / "training_metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]


def test_a_new_run_in_an_earlier_runs_folder_says_so_and_leaves_nothing_stale(tmp_path, capsys):
    """Issue #30: `make demo` twice: the second run says it replaces the first, the first's doctor.png (which a run
    does not write: `trl-grpo-ext doctor` does) is gone and its other files are this run's."""
    recipe = load_recipe("math_gsm8k")
    out = tmp_path / "run"
    out.mkdir()
    for name in ("doctor.png", "policy_groups.png", "training_metrics.jsonl", "notes.txt"):
        (out / name).write_text("earlier")
    argv = ["--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", str(out),
            "--synthetic_problems", "16", "--max_steps", "1", "--eval_limit", "0"]  # fmt: skip
    recipe.main(*recipe.make_parser().parse_args_and_config(argv))
    printed = capsys.readouterr().out
    # no checkpoint to resume from in that folder: the line does not suggest resuming
    assert (
        f"{out} holds an earlier run (training_metrics.jsonl, policy_groups.png, doctor.png): replacing it\n"
        in printed
    )
    assert not (out / "doctor.png").exists() and (out / "policy_groups.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "training_metrics.jsonl").read_text() != "earlier" and (out / "notes.txt").read_text() == "earlier"


GPU_PRESETS = [p for p in CONFIGS if p.name.startswith("gsm8k-")]


@pytest.mark.parametrize("config", GPU_PRESETS, ids=[p.stem for p in GPU_PRESETS])
def test_a_gpu_preset_without_cuda_is_one_line_naming_the_cpu_configs(config, monkeypatch, capsys):
    """Issue #72: a GPU preset on a machine without CUDA answered with transformers' "bf16/gpu" message (the T4's fp16
    preset got further, to the model's download); now one line, before anything is parsed or loaded, that points to
    the CPU configs."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = load_recipe("math_gsm8k")
    monkeypatch.setattr(recipe, "main", lambda *args: pytest.fail("the recipe went on"))
    assert recipe.cli(["--config", str(config)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    precision = "fp16" if config.stem == "gsm8k-t4" else "bf16"
    assert line.startswith(f"math_gsm8k.py: error: {config} is a GPU config ({precision}: true) and this machine has "
                           "no CUDA device: on a CPU use ")  # fmt: skip
    assert "smollm2_cpu.yaml (SmolLM2-135M-Instruct with LoRA" in line and "demo_cpu.yaml (the tiny random" in line


def test_a_config_is_a_gpu_config_by_its_values_and_the_command_lines():
    from trl_grpo_ext.consumer_gpu.presets import no_cuda_problem

    assert no_cuda_problem("c.yaml", {}, [], cuda=False).startswith("c.yaml is a GPU config (bf16: true)")  # TRL's
    assert no_cuda_problem("c.yaml", {"fp16": "yes"}, [], cuda=False).startswith("c.yaml is a GPU config (fp16: true)")
    for config, argv in [
        ({"bf16": True}, ["--use_cpu", "true", "--bf16", "false"]),
        ({"bf16": True}, ["--use_cpu"]),
        ({"bf16": True}, ["--bf16=false"]),
        ({"bf16": False}, []),
        ({"bf16": True, "use_cpu": True}, []),
    ]:
        assert no_cuda_problem("c.yaml", config, argv, cuda=False) is None, (config, argv)
    assert no_cuda_problem("c.yaml", {"bf16": True}, [], cuda=True) is None
    assert no_cuda_problem("c.yaml", {"bf16": False}, ["--bf16"], cuda=False) is not None  # a bare flag is true


def test_only_a_short_run_shortens_its_evaluation():
    short_run_evaluation = load_recipe("math_gsm8k").short_run_evaluation
    assert short_run_evaluation(3, 50, "out")[0] == 8  # the SmolLM2 CPU config with --max_steps 3
    for max_steps, eval_limit in [(10, 50), (-1, 50), (3, 8), (3, 0), (40, 16)]:  # long, by epochs, small, none
        assert short_run_evaluation(max_steps, eval_limit, "out") == (eval_limit, None)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_demo_evaluation_tells_an_untrained_model_from_a_collapsed_one(tmp_path, capsys, lora):
    """Issue #72: the tiny random model's greedy completions are blank before any training (its argmax is a newline),
    and the recipe said "collapsed" of them. It now runs the model before training (the tiny model's folder; with
    LoRA, the adapter disabled) on the first problems and says it gave no answer before either."""
    recipe = load_recipe("math_gsm8k")
    argv = ["--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", str(tmp_path / "run"),
            "--synthetic_problems", "16", "--max_steps", "1", "--eval_limit", "4", "--run_doctor", "no"]  # fmt: skip
    # one step that moves the model too little to change its greedy answers: trained, yet as blank as before
    argv += ["--use_peft", "true", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"] if lora else []
    argv += [] if lora else ["--learning_rate", "1e-6"]
    results = recipe.main(*recipe.make_parser().parse_args_and_config(argv))
    assert results["empty_completions"] == 1.0
    assert results["untrained"] == {"empty_completions": 1.0, "num_problems": 4}
    saved = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert saved["untrained"] == results["untrained"]
    assert (
        "Note: 100% of the evaluation's completions are empty or blank, and so were 100% of the untrained "
        "model's on 4 of these problems: the model gave no answer before training either"
    ) in capsys.readouterr().out

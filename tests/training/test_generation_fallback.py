"""Fast generation that fails on the machine it meets falls back to TRL's generation (`generation.fallback`,
`FastGenerationFeature`): a failure injected at each stage of the fast path (its setup, the compile of the decode
step, its first decode, a later decode at a new shape) leaves a run that trains on with stock TRL's completions, the
base weights bit for bit, TRL's generation settings, one warning and the doctor's finding; `generation_fallback=False`
raises instead; the compiled decode step's recompile-limit hits are reported."""

import functools
import logging
import math
import weakref

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from torch._dynamo import lookup_backend
from torch._dynamo.exc import BackendCompilerFailed

from tests.conftest import length_reward, small_grpo_kwargs
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.doctor import diagnose
from trl_grpo_ext.error_reports import CAUSES
from trl_grpo_ext.generation import lora_merge, static_cache
from trl_grpo_ext.generation.fallback import fallback_cause
from trl_grpo_ext.generation.feature import FastGeneration
from trl_grpo_ext.trl_contact import TRLContact

LEVERS = {"generation_compile": True, "generation_lora_merge": "inplace"}  # the whole fast path: merge, cache, compile
# 4 steps of 2 prompts x 4 completions, and an evaluation every 2 steps on 4 completions at a time: a second batch
# size, so a second static cache and a second compile of the decode step ("a later decode at a new shape")
RUN = dict(max_steps=4, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4)
IGNORED = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second", "eval_runtime",
           "eval_samples_per_second", "eval_steps_per_second"}  # fmt: skip
WARNING = "Fast generation fell back to TRL's generation"


def _dataset(n=16):
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i} plus {i}?" + " and more" * (i % 6)}]} for i in range(n)]
    )


def _trainer(model_dir, output_dir, **overrides):
    return GRPOTrainer(
        model=model_dir,
        reward_funcs=[length_reward],
        args=GRPOConfig(**small_grpo_kwargs(output_dir, **{**RUN, **overrides})),
        train_dataset=_dataset(),
        eval_dataset=_dataset(4),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    )


def _logs(trainer):
    return [{k: v for k, v in row.items() if k not in IGNORED and not k.startswith(("fast_generation/", "timing/"))}
            for row in trainer.state.log_history]  # fmt: skip


def _trainable(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def _base(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}


@pytest.fixture(scope="module")
def stock_run(tiny_model_dir, tmp_path_factory):
    """TRL's generation: the logs, the trained adapters and the generation settings of the run."""
    trainer = _trainer(tiny_model_dir, tmp_path_factory.mktemp("stock"))
    trainer.train()
    return _logs(trainer), _trainable(trainer), trainer.generation_config.to_dict()


def _backend(fail_compile: int | None = None, fail_call: int | None = None, error: Exception | None = None):
    """A torch.compile backend (`aot_eager`, the CPU tests' own) that raises `error` at its `fail_compile`-th compile
    or in the `fail_call`-th run of a compiled graph. A function, not an object: transformers' `CompileConfig`
    deep-copies its fields."""
    compiles, calls = [], []

    def backend(graph, example_inputs):
        compiles.append(1)
        if len(compiles) == fail_compile:
            raise type(error)(*error.args)  # a new one: a raised error holds its frames (the fast path) until freed
        compiled = lookup_backend("aot_eager")(graph, example_inputs)

        def run(*args):
            calls.append(1)
            if len(calls) == fail_call:
                raise type(error)(*error.args)
            return compiled(*args)

        return run

    return backend


def _use_backend(monkeypatch, backend) -> None:
    """Fast generation compiles its decode step with `backend` (as tests/cpu_compile.py sets `aot_eager`)."""
    original = static_cache.compile_config_for

    def compile_config_for(device_type):
        config = original(device_type)
        config.backend = backend
        return config

    monkeypatch.setattr(static_cache, "compile_config_for", compile_config_for)


def _fail_setup(monkeypatch):
    """The in-place merge's pinned host copy runs out of memory: after the static-cache sizer has switched TRL's
    generation settings to compilation (`FastGeneration.setup` builds the sizer first)."""

    def out_of_memory(self, model):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (pinned host memory)")

    monkeypatch.setattr(lora_merge.InplaceMerge, "__init__", out_of_memory)


no_compiler = RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
STAGES = {
    # stage: (how the failure is injected, the cause the warning names, the step it is logged at)
    "setup": (_fail_setup, "out_of_memory", 1),
    "compile": (lambda mp: _use_backend(mp, _backend(fail_compile=1, error=no_compiler)), "no_compiler", 1),
    "first_decode": (
        lambda mp: _use_backend(
            mp, _backend(fail_call=1, error=torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"))
        ),
        "out_of_memory",
        1,
    ),  # fmt: skip
    # the evaluation at step 2 generates 4 sequences at a time: the decode step compiles again, and fails there
    "later_decode_at_a_new_shape": (
        lambda mp: _use_backend(
            mp,
            _backend(fail_compile=2, error=RuntimeError("InductorError: LoweringException: an unsupported operation")),
        ),
        "compile_error",
        3,
    ),  # fmt: skip
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_failure_at_each_stage_falls_back_to_stock_generation(
    tiny_model_dir, tmp_path, stock_run, monkeypatch, caplog, stage
):
    """The run trains all its steps; its rewards, losses and adapters are stock TRL's (the same completions, from the
    same random state: a failed attempt and the probe put it back); the base weights are bit for bit what they were;
    TRL's generation settings are as TRL made them; one warning names the cause and the setting to change; the cause
    is logged once, and the doctor reports it."""
    inject, cause, logged_at = STAGES[stage]
    inject(monkeypatch)
    built = []  # a weak reference to each fast path built: freed once fallen back, before TRL's generation runs
    setup = FastGeneration.setup.__func__

    def watched_setup(cls, *args):
        fast = setup(cls, *args)
        built.append(weakref.ref(fast))
        return fast

    monkeypatch.setattr(FastGeneration, "setup", classmethod(watched_setup))
    trainer = _trainer(tiny_model_dir, tmp_path, **LEVERS, run_doctor=True)
    base = _base(trainer)
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.generation.feature"):
        trainer.train()

    assert trainer.state.global_step == 4
    logs, trainable = _logs(trainer), _trainable(trainer)
    assert [sorted(row) for row in logs] == [sorted(row) for row in stock_run[0]]
    for row, stock in zip(logs, stock_run[0], strict=True):
        for key, value in row.items():  # the fast path's completions before a late failure: fp32 rounding only
            assert math.isclose(value, stock[key], abs_tol=1e-5) or math.isnan(value) and math.isnan(stock[key]), (
                row.get("step"), key, value, stock[key])  # fmt: skip
    for name, value in trainable.items():
        torch.testing.assert_close(value, stock_run[1][name], rtol=0, atol=1e-5)
    assert all(torch.equal(value, _base(trainer)[name]) for name, value in base.items())
    assert trainer.generation_config.to_dict() == stock_run[2]

    feature = trainer.features["fast_generation"]
    assert (feature.fell_back, feature.fast) == (cause, None)
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith(WARNING)]
    assert len(warnings) == 1, warnings
    assert CAUSES[cause][0] in warnings[0] and CAUSES[cause][1] in warnings[0]
    log = tmp_path / "fast_generation_fallback.log"  # the full traceback, which the warning names
    assert (
        warnings[0].endswith(f"The full traceback: {log}.") and "Traceback (most recent call last)" in log.read_text()
    )
    assert all(ref() is None for ref in built) and len(built) == (0 if stage == "setup" else 1)
    key = f"fast_generation/fell_back/{cause}"
    assert [row["step"] for row in trainer.state.log_history if key in row] == [logged_at]
    findings = diagnose(trainer.state.log_history, {"generation_compile": True}, checks=["fast_generation"]).findings
    assert [(f.title, f.step) for f in findings] == [("fast generation fell back to TRL's generation", logged_at)]
    assert CAUSES[cause][0] in findings[0].evidence and findings[0].suggestion == CAUSES[cause][1]


def test_with_generation_fallback_false_the_error_is_raised(tiny_model_dir, tmp_path, monkeypatch):
    _use_backend(monkeypatch, _backend(fail_compile=1, error=no_compiler))
    trainer = _trainer(tiny_model_dir, tmp_path, **LEVERS, generation_fallback=False)
    base = _base(trainer)
    with pytest.raises(BackendCompilerFailed, match="Failed to find C compiler"):
        trainer.train()
    assert all(torch.equal(value, _base(trainer)[name]) for name, value in base.items())  # restored on the error


def test_the_probe_leaves_the_random_state_and_generation_settings_as_they_were(tiny_model_dir, tmp_path):
    """The probe is TRL's generation of the first batch, cut to a few tokens, through the whole fast path: the
    decode step is compiled once, for the shapes the run then uses, and the random state is as before it."""
    from torch._dynamo.utils import counters

    trainer = _trainer(tiny_model_dir, tmp_path, **LEVERS)
    feature = trainer.features["fast_generation"]
    settings = trainer.generation_config.to_dict()
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    counters.clear()
    torch.manual_seed(3)
    state = torch.get_rng_state()
    feature._start(prompts, functools.partial(TRLContact.hook_generate_single_turn, trainer, prompts, None, {}, 2))
    assert torch.equal(torch.get_rng_state(), state)
    assert feature.fell_back is None and feature.fast is not None
    assert counters["stats"]["unique_graphs"] == 1  # the probe compiled the decode step
    changed = {k: v for k, v in trainer.generation_config.to_dict().items() if settings.get(k) != v}
    assert set(changed) == {"disable_compile", "compile_config", "cache_implementation"} - {
        k for k in ("cache_implementation",) if settings.get(k) is None}, changed  # fmt: skip
    assert trainer.generation_config.max_new_tokens == settings["max_new_tokens"]  # the probe's 4 tokens undone


def test_a_recompile_limit_hit_is_warned_once_and_found_by_the_doctor(tiny_model_dir, tmp_path, monkeypatch, caplog):
    """With torch's recompile limit at 1, the evaluation's second batch size cannot compile again: dynamo runs that
    decode step uncompiled from then on, without an error. The trainer notices it in torch's counters."""
    import torch._dynamo

    torch._dynamo.reset()  # the decode steps compiled by earlier tests would count towards the limit
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    trainer = _trainer(tiny_model_dir, tmp_path, **LEVERS)
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.generation.feature"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "recompile limit" in r.getMessage()]
    assert len(warnings) == 1 and "(step 3)" in warnings[0], warnings
    assert trainer.features["fast_generation"].fell_back is None  # not an error: the fast path stays
    steps = [row["step"] for row in trainer.state.log_history if "fast_generation/recompile_limit_hits" in row]
    assert steps == [3]
    findings = diagnose(trainer.state.log_history, {"generation_compile": True}, checks=["fast_generation"]).findings
    assert [(f.subject, f.step) for f in findings] == [("recompile limit hit", 3)]


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB"), "out_of_memory"),
        (
            ValueError(
                "generation_lora_merge='copy' needs 2.00 GiB for the generation copy, and training will allocate "
                "at least 1.00 GiB more"
            ),
            "out_of_memory",
        ),  # fmt: skip
        (RuntimeError("Failed to find C compiler. Please specify via CC environment variable."), "no_compiler"),
        (RuntimeError("/tmp/x/main.c:5:10: fatal error: Python.h: No such file or directory"), "no_compiler"),
        (
            RuntimeError(
                "Cannot find a working triton installation. Either the package is not installed or it is too old."
            ),
            "no_triton",
        ),  # fmt: skip
        (
            RuntimeError(
                "Found Tesla P100-PCIE-16GB which is too old to be supported by the triton GPU compiler, which "
                "is used as the backend. Triton only supports devices of CUDA Capability >= 7.0"
            ),
            "old_card",
        ),
        (
            BackendCompilerFailed(lookup_backend("eager"), RuntimeError("an inductor lowering error"), None),
            "compile_error",
        ),  # fmt: skip
        (KeyError("lora_A"), "other"),
    ],
    ids=["oom", "copy_does_not_fit", "no_cc", "no_python_h", "no_triton", "old_card", "dynamo", "other"],
)
def test_the_cause_is_read_from_the_error_and_its_chain(error, cause):
    assert fallback_cause(error) == cause
    try:  # the same error as the cause of another, as dynamo wraps a backend's error
        raise RuntimeError("backend compiler failed") from error
    except RuntimeError as wrapped:
        assert fallback_cause(wrapped) == cause


def test_the_doctor_skips_a_run_without_fast_generation_and_is_quiet_on_one_that_kept_it():
    rows = [{"step": step, "loss": 0.1, "reward": 0.5} for step in range(1, 6)]
    skipped = diagnose(rows, {}, checks=["fast_generation"]).skipped
    assert [skip.check for skip in skipped] == ["fast_generation"] and "generation_compile" in skipped[0].reason
    kept = diagnose(rows, {"generation_compile": True}, checks=["fast_generation"])
    assert (kept.findings, kept.skipped) == ([], [])


# --- on CUDA (skipped without it; `scripts/gpu_check.sh` runs them): the probe on a real compile, Triton hidden ---

CUDA_RUN = dict(use_cpu=False, bf16=True, model_init_kwargs={"dtype": torch.bfloat16}, max_steps=3,
                generation_max_prompt_length=64)  # fmt: skip


@pytest.mark.parametrize("merge", ["inplace", "copy"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_probe_compiles_with_inductor_and_cuda_graphs_and_the_fast_path_stays(
    tiny_model_dir, tmp_path, caplog, merge
):
    """The preset's fast path on the card (transformers' own compile settings there: inductor with CUDA graphs,
    not the CPU tests' backend): inductor's code generation, Triton and CUDA-graph trees run in the probe,
    and the run keeps them: no fall back, no recompile-limit hit, no CUDA graph skipped."""
    trainer = _trainer(tiny_model_dir, tmp_path, **CUDA_RUN, generation_compile=True,
                       generation_lora_merge=merge, eval_strategy="no")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.generation.feature"):
        trainer.train()
    feature = trainer.features["fast_generation"]
    assert feature.fell_back is None and feature.fast is not None, caplog.text
    assert not [r for r in caplog.records if r.name == "trl_grpo_ext.generation.feature"], caplog.text
    assert not any(k.startswith("fast_generation/") and k != "fast_generation/merge_time"
                   for row in trainer.state.log_history for k in row)  # fmt: skip


HIDDEN_TRITON = """
import sys
sys.modules["triton"] = None  # as if Triton were not installed: `import triton` fails, find_spec finds nothing
import json, logging
from tests.training.test_generation_fallback import CUDA_RUN, _trainer
import torch
trainer = _trainer(sys.argv[1], sys.argv[2], **CUDA_RUN, generation_compile=True,
                   generation_lora_merge="inplace", eval_strategy="no")
trainer.train()
print(json.dumps({"fell_back": trainer.features["fast_generation"].fell_back, "step": trainer.state.global_step,
                  "logged": [k for row in trainer.state.log_history for k in row if "fell_back" in k]}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_without_triton_the_run_falls_back_and_trains(tiny_model_dir, tmp_path):
    import json
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    done = subprocess.run([sys.executable, "-c", HIDDEN_TRITON, tiny_model_dir, str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"fell_back": "no_triton", "step": 3, "logged": ["fast_generation/fell_back/no_triton"]}
    assert WARNING in done.stderr and CAUSES["no_triton"][1] in done.stderr

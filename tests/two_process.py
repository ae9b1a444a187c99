"""Every two-process scenario of the suite in one `accelerate launch`: two CPU processes (gloo) that each import
torch, transformers and TRL once and run every scenario in turn, instead of one launch (a launcher and two fresh
interpreters, ~15 s on 2 cores before any training) per phase of each test.

A test module declares its scenario and marks each test that reads it:

    GROUPED_2P = two_process("grouped", {**GROUPED, "per_device_train_batch_size": 6}, resume_step=3)

    @GROUPED_2P
    def test_two_processes_grouped_run_resumes_exactly(two_process_runs):
        assert resume_diff(two_process_runs["grouped"], 3) == 0.0

The session fixture `two_process_runs` (tests/conftest.py) launches the scenarios the selected tests are marked with,
once per test session (under pytest-xdist, the first worker that needs it runs the job while holding a file lock; the
other waits for it and reads the same records). Each process of the job runs a scenario's uninterrupted phase
(`resume_check.run_phase`, in `<out>/<name>/full`) and, with `resume_step`, the phase resumed from that phase's
`checkpoint-<resume_step>`, and writes each rank's record (or the traceback of the phase that failed) to its own file.
A test asserts on its own scenario's records only; a scenario that failed fails the tests that read it, and every
scenario after it in the job (which it ended) fails its tests with "the job ended before <name>".

The resumed phase runs in the same two processes, after the uninterrupted one (before the shared job, a fresh launch
of its own): everything it resumes comes from the checkpoint, and each trainer seeds itself when it is built. The
recipe scenario calls the recipe's `cli` as `accelerate launch recipes/math_gsm8k.py` does, after the other
scenarios, in their process group.
"""

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

from tests.resume_check import REPO_ROOT, compare

SCENARIOS: dict[str, dict] = {}  # name -> {"config": GRPOConfig overrides (resume_check.build_trainer), "resume_step"}
LAUNCHED: dict[str, list[dict]] = {}  # name -> each rank's record, of the scenarios this session's jobs ran
MARK = "two_process"  # the marker naming the scenario a test reads
# engine -> what a job on CPU processes adds to `accelerate launch --config_file recipes/accelerate/<engine>.yaml`, and
# the patch each worker applies first (tests/engines/fsdp_cpu.py: accelerate 1.16 takes its FSDP branch only on
# GPU-like devices, so on CPU it would run DDP without a word). The trainers set `use_cpu=True` (gloo).
# "hidden_size": the job's model is the tiny model widened to it (`widened_model`): ZeRO-3 keeps a parameter of fewer
# than `stage3_param_persistence_threshold` elements (1e5, accelerate's config sets no other) whole on every process,
# which would be every parameter of the tiny model; at 256 its embedding table and MLP weights are partitioned.
ENGINES = {
    "ddp": {"patch": None},
    "deepspeed_zero2": {"patch": None},
    "deepspeed_zero3": {"patch": None, "hidden_size": 256},
    "fsdp2": {"patch": "tests.engines.fsdp_cpu"},
}


def two_process(
    name: str,
    config: dict | None = None,
    resume_step: int | None = None,
    recipe: list | None = None,
    engine: str = "ddp",
):
    """Declare the scenario `name` (`config` as `resume_check.build_trainer` takes it; with `resume_step`, also the
    run resumed from `checkpoint-<resume_step>`), or, with `recipe`, a run of `recipes/math_gsm8k.py` with those
    arguments and `--output_dir <out>/<name>/full` (its `cli`, as `accelerate launch recipes/math_gsm8k.py` calls it;
    it closes the process group at its end, so the job runs it last, and one recipe scenario at most per engine);
    return the decorator that marks a test reading it. `engine`: the accelerate config of `recipes/accelerate/` the
    scenario's job is launched with (`deepspeed_zero2`, ...; one job per engine, ENGINES gives its CPU overrides)."""
    if (config is None) == (recipe is None):
        raise ValueError(f"two-process scenario {name!r}: give config or recipe, not both")
    if engine not in ENGINES:
        raise ValueError(f"two-process scenario {name!r}: engine {engine!r} is none of {sorted(ENGINES)}")
    scenario = {"config": dict(config or {}), "resume_step": resume_step, "recipe": recipe, "engine": engine}
    if SCENARIOS.setdefault(name, scenario) != scenario:
        raise ValueError(f"two-process scenario {name!r} declared twice with different settings")

    return getattr(pytest.mark, MARK)(name)


def selected_scenarios(items) -> list[str]:
    """The scenarios the selected test items are marked with, in the order the items run, each once."""
    names = [mark.args[0] for item in items for mark in item.iter_markers(MARK)]
    return list(dict.fromkeys(names))


def launch(names: list[str], model_dir: str, out_dir: Path, num_processes: int = 2) -> dict[str, list[dict]]:
    """The records of the scenarios `names`: from `out_dir` if a job already wrote them there (another pytest-xdist
    worker: the caller holds the lock), else from a job run now, one `accelerate launch` of `num_processes` CPU
    processes. Per scenario, one record per rank: {"full": run_phase's record, "resumed": the resumed one or None,
    "error": a traceback or None}; a scenario the job did not reach (an earlier one ended it) gets "error" saying so
    and the job's stderr."""
    done = out_dir.parent / f"{out_dir.name}.done"
    if not done.is_file():
        (engine,) = {SCENARIOS[name]["engine"] for name in names}  # one job per engine
        hidden_size = ENGINES[engine].get("hidden_size")
        if hidden_size is not None:
            model_dir = widened_model(model_dir, out_dir.parent / f"{out_dir.name}-model", hidden_size)
        done.write_text(_run(names, model_dir, out_dir, num_processes, engine))
    stderr = done.read_text()
    records = {}
    for name in names:
        ranks = []
        for rank in range(num_processes):
            path = out_dir / f"{name}.rank{rank}"
            if path.is_file():
                ranks.append(torch.load(path, weights_only=False))
            else:
                ranks.append({"full": None, "resumed": None, "error": f"the job ended before {name}:\n{stderr}"})
        records[name] = ranks
    LAUNCHED.update(records)
    return records


def widened_model(model_dir: str, output_dir: Path, hidden_size: int) -> str:
    """The model of `model_dir` with its hidden size set to `hidden_size` (MLP width twice that, head size
    `hidden_size` / its heads), random init, its tokenizer copied: written to `output_dir` once; returns the folder."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    if not (output_dir / "config.json").is_file():
        config = Qwen2Config.from_pretrained(model_dir, hidden_size=hidden_size, intermediate_size=2 * hidden_size)
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(output_dir)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(output_dir)
    return str(output_dir)


def _run(names: list[str], model_dir: str, out_dir: Path, num_processes: int, engine: str = "ddp") -> str:
    """Run the job; return "" if it succeeded, else the failure (the tail of its stderr). The launch is the one the
    multi-GPU recipes document (`--config_file recipes/accelerate/<engine>.yaml`), on CPU processes (gloo), with the
    CPU overrides of docs/multi-gpu.md (no mixed precision: the trainers run fp32 on CPU)."""
    names = sorted(names, key=lambda name: SCENARIOS[name]["recipe"] is not None)  # a recipe run ends the group
    if sum(SCENARIOS[name]["recipe"] is not None for name in names) > 1:
        raise ValueError(f"more than one recipe scenario in the two-process job: {names}")
    job = {name: SCENARIOS[name] for name in names}
    job_file = out_dir.parent / f"{out_dir.name}.json"  # outside out_dir, which a rerun (gloo's abort) removes
    job_file.write_text(json.dumps({"model_dir": model_dir, "scenarios": job, "patch": ENGINES[engine]["patch"]}))
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"recipes/accelerate/{engine}.yaml",
        "--num_processes", str(num_processes), "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "--main_process_port", "0",
        "-m", "tests.two_process", str(job_file), str(out_dir),
    ]  # fmt: skip
    try:
        run_distributed(cmd, timeout=1200, output_dir=str(out_dir))
    except AssertionError as error:  # a scenario failed on one rank: the launcher ended the others
        return str(error) or "the job failed"
    except Exception as error:  # timed out (its processes killed), or could not start: each scenario's tests say so
        return f"the job did not finish: {type(error).__name__}: {error}"
    return ""


GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def run_distributed(cmd: list[str], timeout: int, output_dir: str | None = None) -> subprocess.CompletedProcess:
    """Run an `accelerate launch` command line from the repository root; assert it succeeded; return it.

    A run whose only failure is gloo's abort while a process tears down its threads (a C++ `std::thread` destroyed
    while joinable, printed as GLOO_TEARDOWN_ABORT; about one launch in twenty on this 2-core machine, with or without
    our code) is run once more, after `output_dir` is removed. Any other failure, or the abort twice in a row, fails
    the test. Each process runs one thread (2 processes on 2 cores). Past `timeout` seconds the launcher and its
    workers (one process group) are killed and `subprocess.TimeoutExpired` is raised.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for attempt in (1, 2):
        launcher = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=env, start_new_session=True)  # fmt: skip
        try:
            stdout, stderr = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)  # the workers too, not only the launcher
            launcher.communicate()
            raise
        proc = subprocess.CompletedProcess(cmd, launcher.returncode, stdout, stderr)
        if proc.returncode == 0 or GLOO_TEARDOWN_ABORT not in proc.stderr or attempt == 2:
            break
        if output_dir is not None:
            shutil.rmtree(output_dir, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def checked(ranks: list[dict]) -> list[dict]:
    """`ranks` after asserting that no rank's scenario failed (the failure's traceback in the message)."""
    errors = [f"rank {rank}: {record['error']}" for rank, record in enumerate(ranks) if record["error"]]
    assert not errors, "\n".join(errors)
    return ranks


def full_records(ranks: list[dict]) -> list[dict]:
    """Each rank's record of the scenario's uninterrupted run, after `checked`."""
    return [record["full"] for record in checked(ranks)]


def resume_diff(ranks: list[dict], resume_step: int, atol: float = 1e-6) -> float:
    """`resume_check.check_resume`'s comparison on every rank: resumed == uninterrupted after `resume_step`; the max
    abs difference (metrics, weights), asserted <= `atol`."""
    max_diff = max(compare(r["full"], r["resumed"], resume_step) for r in checked(ranks))
    assert max_diff <= atol, f"resumed run differs from the uninterrupted one by {max_diff}"
    return max_diff


def engine_facts(trainer) -> dict:
    """The engine a trained trainer really ran under, read off what accelerate prepared, not off the launch (every
    fallback of accelerate on CPU is silent): its distributed type, the class of the prepared model, the processes,
    the parameters held as FSDP2's `DTensor` shards and as ZeRO-3's partitions against all, and DeepSpeed's ZeRO
    stage and its own count of skipped optimizer steps."""
    from torch.distributed.tensor import DTensor

    params = list(trainer.model_wrapped.parameters())
    facts = {
        "distributed_type": trainer.accelerator.distributed_type.value,
        "model_class": type(trainer.model_wrapped).__name__,
        "num_processes": trainer.accelerator.num_processes,
        "params": len(params),
        "dtensor_params": sum(isinstance(p, DTensor) for p in params),
        # a ZeRO-3 parameter between uses holds an empty tensor; its shard (`ds_tensor`) is 1/N of `ds_numel`
        "zero3_partitioned_params": sum(hasattr(p, "ds_numel") and p.numel() == 0 < p.ds_numel for p in params),
    }
    engine = getattr(trainer, "deepspeed", None)
    if engine is not None:
        facts |= {"zero_stage": engine.zero_optimization_stage(), "skipped_steps": engine.skipped_steps}
    return facts


def _run_job(job_file: str, out_dir: str) -> None:
    """One worker process: every scenario in turn; its record written as soon as the scenario is done."""
    from tests.cpu_compile import use_backend_from_env
    from tests.resume_check import run_phase
    from tests.training.test_recipes import load_recipe

    use_backend_from_env()
    job = json.loads(Path(job_file).read_text())
    if job.get("patch"):
        importlib.import_module(job["patch"]).apply()
    rank = int(os.environ.get("RANK", "0"))
    os.makedirs(out_dir, exist_ok=True)
    names = list(job["scenarios"])
    for i, (name, scenario) in enumerate(job["scenarios"].items()):
        record = {"full": None, "resumed": None, "error": None}
        last = i == len(names) - 1
        full_dir = os.path.join(out_dir, name, "full")
        resume_step = scenario["resume_step"]
        try:
            if scenario["recipe"] is not None:
                code = load_recipe("math_gsm8k").cli([*scenario["recipe"], "--output_dir", full_dir])
                assert code == 0, f"recipes/math_gsm8k.py exited with {code}"
                record["full"] = {"output_dir": full_dir}
                torch.save(record, os.path.join(out_dir, f"{name}.rank{rank}"))
                continue
            end = last and not resume_step
            record["full"] = run_phase(scenario["config"], job["model_dir"], full_dir, end=end, inspect=engine_facts)
            if resume_step:
                checkpoint = os.path.join(full_dir, f"checkpoint-{resume_step}")
                assert os.path.isdir(checkpoint), f"{checkpoint} was not saved; set save_steps to divide {resume_step}"
                resumed_dir = os.path.join(out_dir, name, "resumed")
                record["resumed"] = run_phase(
                    scenario["config"], job["model_dir"], resumed_dir, checkpoint, end=last, inspect=engine_facts
                )
        except Exception:  # recorded for the scenario's tests; the other rank is stopped by the launcher
            record["error"] = traceback.format_exc()
            torch.save(record, os.path.join(out_dir, f"{name}.rank{rank}"))
            sys.stderr.write(record["error"])
            sys.stderr.flush()
            os._exit(1)
        torch.save(record, os.path.join(out_dir, f"{name}.rank{rank}"))


if __name__ == "__main__":  # a worker of the job: python -m tests.two_process JOB_JSON OUT_DIR
    _run_job(*sys.argv[1:3])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # records written and the process group closed: skip the interpreter's teardown (gloo threads)

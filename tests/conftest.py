"""Shared fixtures: a tiny random-init Qwen2 model built once per session, real GSM8K from a local folder (the folder
`GSM8K_DATASET_PATH` names, by default the project's shared data folder next to the repository), no downloads."""

import gc
import os
from pathlib import Path

import pytest

from tests.cpu_compile import BACKEND_ENV

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs 2 pytest-xdist workers on 2 cores: one thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
GSM8K_DIR = Path(os.environ.get("GSM8K_DATASET_PATH") or REPO_ROOT.parent / "shared" / "data" / "gsm8k")


os.environ.setdefault(BACKEND_ENV, "aot_eager")  # tests/cpu_compile.py


def pytest_collection_finish(session):
    """Once the test modules are imported (torch, transformers, TRL: about half a million objects the garbage
    collector tracks), move every object then alive out of the collector's reach (`gc.freeze`), so that a full
    collection scans only what the tests create. transformers' `Trainer.train` starts with one (through accelerate's
    `free_memory`), ~0.3 s a run over the frozen objects and nearly none without. Objects made later are collected
    as before; the frozen ones are module-level objects that stay alive until the process ends."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def cpu_compile_backend():
    """Compiled generation off CUDA uses the backend of tests/cpu_compile.py (`aot_eager`; set the environment
    variable to `inductor` to run the CPU compile tests with transformers' default)."""
    from tests.cpu_compile import use_backend

    undo = use_backend(os.environ[BACKEND_ENV])
    yield
    undo()


@pytest.fixture(autouse=True)
def trl_keeps_its_classes():
    """Every test starts with `trl.GRPOConfig` / `trl.GRPOTrainer` as TRL's own classes, whatever an earlier test
    did: `trl-grpo-ext grpo` run in process calls `register()` and leaves it on, after which a test comparing with
    `trl.GRPOTrainer` would compare our trainer with itself."""
    import trl_grpo_ext

    trl_grpo_ext.unregister()
    yield
    trl_grpo_ext.unregister()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from trl_grpo_ext.cli.tiny_model import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    if not (GSM8K_DIR / "train.jsonl").is_file():
        message = f"real GSM8K data not found at {GSM8K_DIR} (set GSM8K_DATASET_PATH to a GSM8K-format folder)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI always has it: a skip there would hide the real-data tests
        pytest.skip(message)
    return GSM8K_DIR


def length_reward(completions, **kwargs) -> list[float]:
    """A reward with spread on a random model: completion length in characters modulo 5, scaled to [0, 0.8]."""
    return [(len(c[0]["content"]) % 5) / 5 for c in completions]


def small_grpo_kwargs(output_dir, **overrides) -> dict:
    """GRPOConfig keyword arguments for a few fast CPU steps on the tiny model."""
    kwargs = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        learning_rate=1e-2,
        max_steps=3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=7,
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
    )
    kwargs.update(overrides)
    return kwargs


@pytest.fixture(scope="session")
def two_process_runs(request, tiny_model_dir, tmp_path_factory) -> dict:
    """The records of every two-process scenario the selected tests read (tests/two_process.py), from one
    `accelerate launch` run per engine the first time a test asks: {scenario: [rank 0's record, rank 1's]}.
    pytest-xdist workers share them: the base temp folder's parent is common to them, and a file lock per engine lets
    one run each job."""
    from filelock import FileLock

    from tests.two_process import SCENARIOS, launch, selected_scenarios

    names = selected_scenarios(request.session.items)
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    records = {}
    for engine in dict.fromkeys(SCENARIOS[name]["engine"] for name in names):  # one job per engine, in test order
        job = [name for name in names if SCENARIOS[name]["engine"] == engine]
        folder = "two-process" if engine == "ddp" else f"two-process-{engine}"
        with FileLock(str(root / f"{folder}.lock")):
            records |= launch(job, tiny_model_dir, root / folder)
    return records

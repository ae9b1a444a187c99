"""Shared fixtures: a tiny random-init Qwen2 model built once per session, real GSM8K from ../shared, no downloads."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
GSM8K_DIR = REPO_ROOT.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from trl_grpo_ext.tiny_model import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    if not (GSM8K_DIR / "train.jsonl").is_file():
        message = f"real GSM8K data not found at {GSM8K_DIR} (the shared folder next to the repository)"
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

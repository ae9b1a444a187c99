"""Exact resume inside a generation cycle on CUDA (skipped without it): bf16, LoRA, and every feature on.

A checkpoint saved inside a generation cycle (`num_iterations > 1`, or `steps_per_generation` above
`gradient_accumulation_steps`) holds the buffered generation batch, which the resumed run trains on before it
generates again. `resume_inside_cycle` runs a configuration uninterrupted and resumed from such a checkpoint and
asserts that the resumed run continues exactly (`tests.resume_check.compare`: every logged metric, the prompts seen,
the final parameters) and that the restored batch sits on the trainer's device, not on the CPU it was loaded to.
It takes the device, so the same logic runs on the CPU for debugging:

    python -c "from tests.gpu.test_resume_gpu import main; main()"      # both cases on the CPU, fp32

The every-feature case also runs on the CPU as a collected test; tests/training/test_resume.py covers the other cycle
shapes on the CPU.
"""

import os
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from tests.resume_check import TIMING_KEYS, build_trainer, compare

# cuBLAS picks a deterministic workspace only if this is set before its first handle (pytest imports every module
# before running any test); the comparison needs the same kernels to give the same bits in both runs.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# Every opt-in feature whose state crosses steps: policy groups (per-group entropy targets), entropy regularization,
# ZClip + AGC and the adaptive KL coefficient, on LoRA. 2 steps per generation x 2 iterations: a cycle of 4 optimizer
# steps, so the checkpoint at step 3 falls inside one.
EVERY_FEATURE = {
    "lora": 4,
    "learning_rate": 3e-2,
    "num_problems": 24,
    "per_device_train_batch_size": 8,
    "steps_per_generation": 2,
    "num_iterations": 2,
    "policy_group_column": "task",
    "policy_group_update_steps": 2,
    "policy_group_sampling": "progress",
    "policy_group_loss_weighting": True,
    "entropy_reg": ["target", "clip_cov", "advantage"],
    "entropy_target": 7.0,
    "entropy_target_per_group": True,
    "clip_cov_lb": -1e9,
    "clip_cov_ub": 1e9,
    "clip_cov_ratio": 0.05,
    "grad_reg": ["zclip", "agc"],
    "zclip_warmup_steps": 2,
    "beta": 0.04,
    "kl_target": 0.01,
    "kl_horizon": 100,
}
CASES = {
    # bf16 weights (as the presets load them), the cycle made by num_iterations
    "every_feature_bf16_weights": (EVERY_FEATURE, "bf16"),
    # fp32 weights under bf16 autocast, the cycle made by steps_per_generation (4) > gradient_accumulation_steps (2):
    # the checkpoint at step 3 is micro-step 6 of a cycle of 4
    "accumulation_bf16_autocast": (
        {"lora": 4, "learning_rate": 3e-2, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
         "steps_per_generation": 4, "entropy_reg": ["kl_cov"], "grad_reg": ["zclip"], "zclip_warmup_steps": 2},
        "bf16_autocast",
    ),
}  # fmt: skip
# A log key of each feature, to show it ran (a feature left off by a renamed field would make the check vacuous).
FEATURE_METRICS = {
    "policy_group_column": "policy_groups/",
    "entropy_reg": "entropy_reg/",
    "grad_reg": "grad_reg/",
    "kl_target": "kl_coef",
}


class RestoredBufferProbe(TrainerCallback):
    """At the first optimizer step of a `train()` call, the devices of the tensors in the trainer's buffered
    generation batch: after a resume inside a generation cycle, the batch restored from the checkpoint (a fresh run
    has none yet: it generates at its first step)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.devices: list[str] | None = None
        self.done = False

    def on_step_begin(self, args, state, control, **kwargs):
        if self.done:
            return
        self.done = True
        buffered = self.trainer._buffered_inputs
        if buffered is not None:
            tensors = [v for batch in buffered for v in batch.values() if isinstance(v, torch.Tensor)]
            self.devices = sorted({str(t.device) for t in tensors})


def device_settings(device: str, dtype: str) -> dict:
    """GRPOConfig fields that put a run on `device` ("cuda" or "cpu") in `dtype`: "bf16" (bf16 weights and
    autocast), "bf16_autocast" (fp32 weights, bf16 autocast) or "fp32". Eager attention on CUDA: SDPA's fused
    backward kernels accumulate with atomics, so two identical runs could differ in the last bits."""
    if dtype not in ("bf16", "bf16_autocast", "fp32"):
        raise ValueError(f"dtype must be bf16, bf16_autocast or fp32, got {dtype!r}")
    init = {"dtype": "bfloat16" if dtype == "bf16" else "float32"}
    if device == "cuda":
        init["attn_implementation"] = "eager"
    return {"use_cpu": device == "cpu", "bf16": dtype != "fp32", "model_init_kwargs": init}


def record_run(config: dict, model_dir: str, output_dir: str, resume_from: str | None = None) -> dict:
    """`tests.resume_check.run_phase` with a `RestoredBufferProbe`: its record plus `buffer_devices` (None when the
    first step found no buffered batch) and `trainer_device`."""
    trainer, reward = build_trainer(config, model_dir, output_dir)
    probe = RestoredBufferProbe(trainer)
    trainer.add_callback(probe)
    trainer.train(resume_from_checkpoint=resume_from)
    return {
        "logs": [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in trainer.state.log_history],
        "prompts": reward.calls,
        "params": {n: p.detach().float().cpu() for n, p in trainer.model.named_parameters() if p.requires_grad},
        "buffer_devices": probe.devices,
        "trainer_device": str(trainer.accelerator.device),
    }


def resume_inside_cycle(
    config: dict, tmp_path, model_dir: str, device: str = "cuda", dtype: str = "bf16", resume_step: int = 3,
    atol: float = 1e-6,
) -> dict:  # fmt: skip
    """Run `config` on `device` in `dtype` for 6 steps (checkpoints every 3) uninterrupted, then resumed from
    `checkpoint-<resume_step>`, which must fall inside a generation cycle; assert that the resumed run found the
    restored generation batch on `device` and continued exactly (max abs diff of metrics and weights <= `atol`).

    Deterministic algorithms are on while it runs (warn-only), so that the two runs take the same kernels.

    Returns:
        `{"max_diff": float, "buffer_devices": [str], "features": [log key prefixes seen]}`.

    Raises:
        AssertionError: what differs, or the first step after the resume found no buffered batch.
    """
    config = {"max_steps": 6, "save_steps": 3, **config, **device_settings(device, dtype)}
    micro_steps = resume_step * config.get("gradient_accumulation_steps", 1)
    cycle = config.get("steps_per_generation", config.get("gradient_accumulation_steps", 1))
    cycle *= config.get("num_iterations", 1)
    assert micro_steps % cycle != 0, f"checkpoint-{resume_step} (micro-step {micro_steps}) ends a cycle of {cycle}"

    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        full = record_run(config, model_dir, str(Path(tmp_path) / "full"))
        checkpoint = Path(tmp_path) / "full" / f"checkpoint-{resume_step}"
        assert checkpoint.is_dir(), f"{checkpoint} was not saved"
        resumed = record_run(config, model_dir, str(Path(tmp_path) / "resumed"), resume_from=str(checkpoint))
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)

    assert torch.device(resumed["trainer_device"]).type == device, f"the trainer ran on {resumed['trainer_device']}"
    assert resumed["buffer_devices"] is not None, "the first step after the resume found no buffered generation batch"
    on_other = [d for d in resumed["buffer_devices"] if torch.device(d).type != device]
    assert not on_other, f"restored buffered generation batch is on {resumed['buffer_devices']}, not {device}"
    keys = {key for row in full["logs"] for key in row}
    features = [FEATURE_METRICS[name] for name in FEATURE_METRICS if config.get(name)]
    missing = [prefix for prefix in features if not any(key.startswith(prefix) for key in keys)]
    assert not missing, f"no metric logged under {missing}: the feature did not run"
    max_diff = compare(full, resumed, resume_step)
    assert max_diff <= atol, f"resumed run differs from the uninterrupted one by {max_diff}"
    return {"max_diff": max_diff, "buffer_devices": resumed["buffer_devices"], "features": features}


@pytest.mark.gpu
@cuda_only
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_resume_inside_a_generation_cycle_on_cuda_is_exact(case, tmp_path, tiny_model_dir):
    config, dtype = case
    result = resume_inside_cycle(config, tmp_path, tiny_model_dir, device="cuda", dtype=dtype)
    print(f"max abs diff resumed vs uninterrupted on CUDA: {result['max_diff']}; batch on {result['buffer_devices']}")


def test_every_feature_with_lora_resumes_inside_a_cycle_on_cpu(tmp_path, tiny_model_dir):
    """The CUDA test's logic on the CPU (fp32): LoRA with every feature, a checkpoint inside a cycle."""
    result = resume_inside_cycle(EVERY_FEATURE, tmp_path, tiny_model_dir, device="cpu", dtype="fp32")
    assert result["buffer_devices"] == ["cpu"]


def main() -> None:
    """Every case on the CPU in fp32 (the CUDA tests' logic, for debugging without a GPU)."""
    from trl_grpo_ext.cli.tiny_model import save_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(Path(tmp) / "tiny-model"))
        for name, (config, _) in CASES.items():
            result = resume_inside_cycle(config, Path(tmp) / name, model_dir, device="cpu", dtype="fp32")
            print(name, result)

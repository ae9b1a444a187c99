"""The run doctor's side of the trainer (`GRPOConfig.run_doctor`): the timings and the memory its checks read, and
the callback that runs them.

Once per optimizer step, next to TRL's `step_time` (and averaged over a logging window the same way), it logs:
    timing/generation   seconds of the step in TRL's `model.generate` calls (with fast generation on: its merge and
                        cache too); 0 in a step that generated nothing (`steps_per_generation` > 1, `num_iterations`
                        > 1 reuse a generation batch)
    timing/scoring      seconds from the end of generation to the advantages: reward functions, old and reference
                        log-probabilities, the gathers
on a CUDA device `memory/peak_reserved_gib` (the process's peak reserved memory so far), `memory/total_gib` and
`device/bf16_supported` (1 where the card computes in bf16, 0 on one without, a T4), and with fp16 loss scaling
`loss_scale`, the scale of the step's backward (`feature_api.loss_scaler`; the value at the last step of a logging
window, as `grad_norm` is). Generation for an evaluation is not counted.
"""

import time
from contextlib import contextmanager

import torch

from ..feature_api import Feature, loss_scaler
from ..trl_contact import log_total, metrics
from .callback import DoctorCallback


class RunDoctor(Feature):
    """Times generation and scoring and reads CUDA memory for the run doctor (module docstring); adds a
    `DoctorCallback` to the trainer unless it has one."""

    name = "doctor"
    reads = ("fast_generation",)  # its settings, shown with the findings (`callback.SETTINGS`)

    @classmethod
    def build(cls, trainer) -> "RunDoctor | None":
        if not trainer.args.run_doctor:
            return None
        if not any(isinstance(callback, DoctorCallback) for callback in trainer.callback_handler.callbacks):
            trainer.add_callback(DoctorCallback())
        return cls(trainer)

    def __init__(self, trainer):
        super().__init__(trainer)
        self._generation = 0.0  # seconds since the last optimizer step was noted
        self._scoring = 0.0
        self._generated_at: float | None = None
        self._step_times = 0  # how many step times TRL had noted before this micro-step

    @contextmanager
    def generation(self, prompt_ids, generate):
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.trainer.model.training:
                self._generated_at = time.perf_counter()
                self._generation += self._generated_at - start

    def advantages(self, output: dict) -> None:
        if self.trainer.model.training and self._generated_at is not None:
            self._scoring += time.perf_counter() - self._generated_at
        self._generated_at = None

    def training_step(self, model) -> None:
        self._step_times = len(metrics(self.trainer, "train")["step_time"])

    def training_step_end(self) -> None:
        logged = metrics(self.trainer, "train")
        if len(logged["step_time"]) == self._step_times:  # not the last micro-step of an optimizer step
            return
        logged["timing/generation"].append(self._generation)
        logged["timing/scoring"].append(self._scoring)
        self._generation = self._scoring = 0.0
        device = self.trainer.accelerator.device
        if device.type == "cuda":
            logged["memory/peak_reserved_gib"].append(torch.cuda.max_memory_reserved(device) / 2**30)
            logged["memory/total_gib"].append(torch.cuda.get_device_properties(device).total_memory / 2**30)
            log_total(self.trainer, "train", "device/bf16_supported",
                      float(torch.cuda.is_bf16_supported(including_emulation=False)))  # fmt: skip
        scaler = loss_scaler(self.trainer)
        if scaler is not None:  # the scale this step's backward used: the scaler updates it after the step
            log_total(self.trainer, "train", "loss_scale", float(scaler.get_scale()))

"""The run doctor's side of the trainer (`GRPOConfig.run_doctor`): the timings and the memory its checks read, and
the callback that runs them.

Per generation batch it logs, as seconds per optimizer step (the batch's time × the generation batches per
optimizer step, `gradient_accumulation_steps / (steps_per_generation × num_iterations)`, so each compares with
TRL's `step_time`):
    timing/generation   in TRL's `model.generate` calls (with fast generation on: its merge and cache too)
    timing/scoring      from the end of generation to the advantages: reward functions, old and reference
                        log-probabilities, the gathers
and on a CUDA device `memory/peak_reserved_gib` (the process's peak reserved memory so far) and `memory/total_gib`.
"""

import time
from contextlib import contextmanager

import torch

from ..features import Feature
from ..trl_contact import metrics
from .callback import DoctorCallback


class RunDoctor(Feature):
    """Times generation and scoring and reads CUDA memory for the run doctor (module docstring); adds a
    `DoctorCallback` to the trainer unless it has one."""

    name = "doctor"

    @classmethod
    def build(cls, trainer) -> "RunDoctor | None":
        if not trainer.args.run_doctor:
            return None
        if not any(isinstance(callback, DoctorCallback) for callback in trainer.callback_handler.callbacks):
            trainer.add_callback(DoctorCallback())
        return cls(trainer)

    def __init__(self, trainer):
        super().__init__(trainer)
        args = trainer.args
        self.per_step = args.gradient_accumulation_steps / (args.steps_per_generation * args.num_iterations)
        self._generation = 0.0
        self._generated_at: float | None = None

    @contextmanager
    def generation(self, prompt_ids):
        start = time.perf_counter()
        try:
            yield
        finally:
            self._generated_at = time.perf_counter()
            self._generation += self._generated_at - start

    def advantages(self, output: dict) -> None:
        mode = "train" if self.trainer.model.training else "eval"
        logged = metrics(self.trainer, mode)
        scoring = time.perf_counter() - self._generated_at if self._generated_at is not None else 0.0
        logged["timing/generation"].append(self._generation * self.per_step)
        logged["timing/scoring"].append(scoring * self.per_step)
        self._generation, self._generated_at = 0.0, None
        device = self.trainer.accelerator.device
        if device.type == "cuda":
            logged["memory/peak_reserved_gib"].append(torch.cuda.max_memory_reserved(device) / 2**30)
            logged["memory/total_gib"].append(torch.cuda.get_device_properties(device).total_memory / 2**30)

"""The run doctor's setting: `run_doctor`, its part of `GRPOConfig` (`RUN_DOCTOR_CONFIG`, composed by
`trl_grpo_ext.config`)."""

from dataclasses import dataclass, field

from ..field_checks import ConfigPart


@dataclass
class RunDoctorFields:
    r"""
    > Parameters that control the run doctor

    run_doctor (`bool`, *optional*, defaults to `False`):
        Check the logged metrics at every log for the known ways a GRPO run wastes its steps (no learning
        signal, overall and per policy group; generation groups too small for the pass rate; truncation; entropy
        collapse or explosion; KL runaway; format-only learning; a reward plateau; non-finite values; parameters
        that do not change; gradient-norm spikes; generation-bound steps; CUDA memory headroom) and warn once per
        finding with its evidence and the setting to change
        (`trl_grpo_ext.doctor.DoctorCallback`). Also logs `timing/generation` and `timing/scoring` (seconds per
        optimizer step spent in `model.generate` and in scoring: rewards and log-probabilities) and, on CUDA,
        `memory/peak_reserved_gib` and `memory/total_gib`. Training is unchanged. `trl-grpo-ext doctor RUN_DIR`
        runs the same checks on a run's output folder.
    """

    run_doctor: bool = field(
        default=False,
        metadata={
            "help": "Check the logged metrics at every log for the known ways a GRPO run wastes its steps and warn "
            "once per finding with the setting to change; also logs timing/generation, timing/scoring and, on CUDA, "
            "memory/peak_reserved_gib and memory/total_gib. Training is unchanged."
        },
    )


# The run doctor's part of `GRPOConfig` (found from its base `RunDoctorFields`: `field_checks.config_parts`).
RUN_DOCTOR_CONFIG = ConfigPart(RunDoctorFields)

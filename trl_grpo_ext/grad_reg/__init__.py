"""Adaptive gradient regularization: update size constrained by the state of training, off by default
(`GRPOConfig.grad_reg`, `kl_target`).

* `config`: the settings (`GradRegFields`, `GRPOConfig`'s `grad_reg`, ZClip, AGC and adaptive-KL fields), their ranges
  and modes (`GRAD_REG_CONFIG`).
* `modes`: the registry `GRAD_REG_MODES`, one class per mode (`zclip`, `agc`, `skip_nonfinite`); the config's
  validation, `--help` text and docs come from it.
* `clipping`: ZClip (arXiv:2504.02507) and unit-wise AGC (arXiv:2102.06171), pure functions and ZClip's state.
* `adaptive_kl`: the adaptive KL coefficient β (arXiv:1909.08593) and the per-token KL it measures.
* `state`: `GradRegState`, what is kept across optimizer steps and checkpointed.
* `feature`: the trainer wiring (`GradReg`): where transformers clips gradients, the non-finite guard, DeepSpeed.
"""

"""Entropy regularization that keeps exploration alive: the modes of `GRPOConfig.entropy_reg`, off by default.

Entropy is that of the full next-token distribution, in nats per token (TRL's `entropy_from_logits`).

* `config`: the settings (`EntropyRegFields`, `GRPOConfig`'s entropy fields), their ranges and modes
  (`ENTROPY_REG_CONFIG`).
* `modes`: the registry `ENTROPY_REG_MODES`, one class per mode (`target`, `clip_cov`, `kl_cov`, `advantage`); the
  config's validation, `--help` text and docs come from it. Adding a mode is one class there plus its config fields.
* `bonus`: the entropy bonus and the entropy-shaped advantage.
* `covariance`: Clip-Cov and KL-Cov (arXiv:2505.22617): token covariance, the tokens picked, KL-Cov's penalty.
* `controller`: `EntropyPI`, the `target` mode's PI controllers (one per key: all, or each policy group).
* `feature`: the trainer wiring (`EntropyReg`): the optimizer step's accumulation window, scored completions, and
  calling the modes at each point of TRL's loss.
"""

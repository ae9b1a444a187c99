"""`GRPOLoopState`: the state of TRL's and transformers' training loop that neither checkpoints (the micro-step
counter, the buffered generations, what was gathered since the last log), saved and restored for exact resume."""

import transformers
from trl.trainer.grpo_trainer import GRPOTrainer as TRLGRPOTrainer

from .accessors import to_device


class GRPOLoopState:
    """The training loop's state that TRL and transformers do not checkpoint: the micro-step counter `_step`, the
    buffered generations reused for `steps_per_generation * num_iterations` micro-steps, and what was gathered since
    the last log (with `logging_steps > 1`): TRL's metrics and transformers' running loss.

    Restored tensors go to the trainer's device (`accelerator.device`) with their saved dtypes: the state file is read
    onto the CPU, and the buffered batch is fed to the model as it is.
    """

    def __init__(self, trainer: TRLGRPOTrainer):
        self.trainer = trainer

    def state_dict(self) -> dict:
        trainer = self.trainer
        return {
            "step": trainer._step,
            "buffered_inputs": trainer._buffered_inputs,
            "pending_metrics": {key: list(values) for key, values in trainer._metrics["train"].items()},
            "pending_loss": trainer._tr_loss.item(),
            "last_logged_step": trainer._globalstep_last_logged,
        }

    def load_state_dict(self, state: dict) -> None:
        trainer = self.trainer
        trainer._step = state["step"]
        trainer._buffered_inputs = to_device(state["buffered_inputs"], trainer.accelerator.device)
        trainer._metrics["train"].clear()
        trainer._metrics["train"].update(state["pending_metrics"])
        # transformers resets its running loss after this runs: `restore_pending_loss` puts it back.
        trainer._trl_grpo_ext_pending_loss = (state["pending_loss"], state["last_logged_step"])

    @staticmethod
    def restore_pending_loss(trainer: transformers.Trainer) -> None:
        """Add the running loss of a resumed checkpoint back; call once transformers has reset it (in
        `_load_rng_state`, where the resumed run rejoins the uninterrupted one)."""
        pending = getattr(trainer, "_trl_grpo_ext_pending_loss", None)
        if pending is not None:
            trainer._tr_loss += pending[0]
            trainer._globalstep_last_logged = pending[1]
            trainer._trl_grpo_ext_pending_loss = None

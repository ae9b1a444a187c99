"""`GradRegState`: what gradient regularization keeps across optimizer steps, saved in every checkpoint."""

from .adaptive_kl import AdaptiveKL
from .clipping import ZClip


class GradRegState:
    """What gradient regularization keeps across optimizer steps: ZClip's statistics, the adaptive β, the count of
    skipped (non-finite) steps, in total and in a row, and of the fp16 loss scaler's overflow steps."""

    def __init__(self, zclip: ZClip | None, kl: AdaptiveKL | None):
        self.zclip, self.kl = zclip, kl
        self.skipped = 0
        self.consecutive_skips = 0
        self.scaler_overflows = 0

    def state_dict(self) -> dict:
        return {
            "zclip": None if self.zclip is None else self.zclip.state_dict(),
            "kl": None if self.kl is None else self.kl.state_dict(),
            "skipped": self.skipped,
            "consecutive_skips": self.consecutive_skips,
            "scaler_overflows": self.scaler_overflows,
        }

    def load_state_dict(self, state: dict) -> None:
        if self.zclip is not None:
            self.zclip.load_state_dict(state["zclip"])
        if self.kl is not None:
            self.kl.load_state_dict(state["kl"])
        self.skipped, self.consecutive_skips = state["skipped"], state["consecutive_skips"]
        self.scaler_overflows = state.get("scaler_overflows", 0)  # absent from checkpoints before it was counted

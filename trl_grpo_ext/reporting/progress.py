"""`StepProgress`: lines that show a slow training step is alive.

transformers prints nothing while an optimizer step runs (the recipe's table prints a row when a step ends, and with
`disable_tqdm` there is no bar), so a first step of SmolLM2 on busy CPU cores printed nothing for 11 minutes. While a
step runs longer than an interval, this callback prints what the step is doing, from a timer thread:

    step 1/10, 1m30s in: generating, 54 of at most 128 completion tokens
    step 1/10, 5m00s in: scoring the completions (generated 128 tokens in 4m12s)
    step 1/10, 5m30s in: the update (forward and backward over the completions)

The phase is read from the model's first decoder layer (a forward pre-hook, public torch API): a call without gradient
on one position per sequence is a decoding step of `generate` (one completion token for every sequence of the
batch; the prefill gives the first), a call without gradient on more positions is the prompt's prefill or, after
decoding, scoring (old and reference log-probabilities), a call with gradient is the update. Generation has ended,
and scoring begun (the reward functions call no layer), once no decoding step came for `GAP_TOKENS` times the mean
time of one, and at least `GAP_S` seconds. No hook is set where generation is compiled
(`generation_compile`) or runs in vLLM (`use_vllm`): the lines then give the time only.

An error that ends training skips the Trainer's closing event: call `close()` then (the recipe does, in a `finally`),
or the timer thread goes on printing until the process ends.
"""

import threading
import time

import torch
from transformers import TrainerCallback

GAP_TOKENS, GAP_S = 4, 2.0  # no decoding step for this many mean token times (and seconds): generation has ended


def first_decoder_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The first block of the first non-empty `layers` / `h` / `blocks` list of `model` (Qwen2, Llama, GPT-2 and most
    decoders of transformers; through a PEFT wrapper too), or None."""
    for name, module in model.named_modules():
        listed = name.split(".")[-1] in ("layers", "h", "blocks")
        if listed and isinstance(module, torch.nn.ModuleList) and len(module):
            return module[0]
    return None


def duration(seconds: float) -> str:
    """`seconds` as "42s", "3m05s" or "1h02m" (the recipes' progress lines: training steps and the evaluation)."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class StepProgress(TrainerCallback):
    """Print a progress line every `every_s` seconds while the first optimizer step runs, and every `later_every_s`
    seconds while a later one does (None: no lines after the first step); the main process only. A step shorter than
    the interval prints nothing. The module docstring shows the lines and how the phase is read.

    Args:
        every_s: seconds between the lines of the first step, which also compiles, warms up and sets the pace.
        later_every_s: seconds between the lines of a later step.
    """

    def __init__(self, every_s: float = 30.0, later_every_s: float | None = 300.0):
        self.every_s, self.later_every_s = every_s, later_every_s
        self._hook = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._step_number = self._steps_planned = self._max_tokens = 0
        self._reset(time.monotonic())

    def _reset(self, now: float) -> None:
        self._start = now
        self._phase = "starting (the batch drawn)" if self._hook is not None else "generation, scoring and the update"
        self._tokens = 0
        self._generation_start = self._generation_end = None

    def _observe(self, module, args, kwargs) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(hidden, torch.Tensor) or hidden.dim() < 2:
            return
        now = time.monotonic()
        if torch.is_grad_enabled():
            self._phase = "the update (forward and backward over the completions)"
        elif hidden.shape[1] == 1:  # a decoding step: one token for every sequence of the batch
            self._tokens += 1
            self._phase = "generating"
            self._generation_end = now
        elif self._generation_end is None:  # a prefill, before any decoding step of this optimizer step
            self._phase = "generating"
            self._tokens = 1  # the prefill gives each sequence its first token
            self._generation_start = self._generation_start or now
        else:
            self._phase = "scoring the completions"

    def line(self, now: float | None = None) -> str:
        """The progress line at `now` (`time.monotonic()`, default the present): the step, the time since it began,
        and what it is doing."""
        now = time.monotonic() if now is None else now
        head = f"step {self._step_number}/{self._steps_planned}, {duration(now - self._start)} in"
        generated = None
        if self._generation_end is not None:
            took = self._generation_end - (self._generation_start or self._start)
            generated = f"generated {self._tokens} tokens in {duration(took)}"
            per_token = took / max(self._tokens - 1, 1)
            if self._phase == "generating" and now - self._generation_end > max(GAP_S, GAP_TOKENS * per_token):
                return f"{head}: scoring the completions ({generated})"
        if self._phase == "generating":
            return f"{head}: generating, {self._tokens} of at most {self._max_tokens} completion tokens"
        if self._phase == "scoring the completions" and generated is not None:
            return f"{head}: scoring the completions ({generated})"
        return f"{head}: {self._phase}"

    def _report(self, every: float) -> None:
        while not self._stop.wait(every):
            print(self.line(), flush=True)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._steps_planned = state.max_steps
        self._max_tokens = getattr(args, "max_completion_length", None) or 0
        compiled = getattr(args, "generation_compile", False) or getattr(args, "use_vllm", False)
        layer = first_decoder_layer(model) if model is not None and not compiled else None
        if layer is not None and state.is_world_process_zero:
            self._hook = layer.register_forward_pre_hook(self._observe, with_kwargs=True)

    def on_step_begin(self, args, state, control, **kwargs):
        self._stop_thread()
        self._step_number = state.global_step + 1
        self._reset(time.monotonic())
        every = self.every_s if self._step_number == 1 else self.later_every_s
        if every is None or not state.is_world_process_zero:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._report, args=(every,), daemon=True, name="step-progress")
        self._thread.start()

    def on_step_end(self, args, state, control, **kwargs):
        self._stop_thread()

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """Stop the lines and remove the hook (the end of training calls it; call it after an error too)."""
        self._stop_thread()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _stop_thread(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

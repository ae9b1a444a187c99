"""What a feature is written against: the points of a GRPO training step where this package's features act, the
events they exchange, and `Registry`, the modes a config field picks by name.

A feature (the `Feature` of each feature folder of the package, `composition.PACKAGE_FEATURES`) is an object that the
trainer builds when the feature's settings are on; it holds the trainer it works for (`self.trainer`). It overrides
the methods of `Feature` for the points where it acts. `composition.STEP` lists, point by point, which features act
and in which order; the trainer calls them there and nowhere else, so `composition.py` alone tells what runs when.

Points, in the order of a step (B completions on this process, N over all processes, F reward functions, T completion
tokens; TRL generates a generation batch once every `steps_per_generation` micro-steps):

    prompt_filter      whether a prompt drawn for the generation batch is kept (else the draw goes on)
    generation_batch   which prompts the generation batch holds (before generation): the first feature listed
                       there that draws the batch draws it, through the prompt filters
    skip_prompts       the prompts taken out of the drawn generation batch before generation, not replaced
    generation         around each of TRL's `model.generate` calls (generated again when a feature stops its error)
    rewards            the reward functions' scores of the generation batch, gathered over all processes
    advantages         TRL's output for the generation batch: advantages (B,), masks, log-probabilities
    loss_start         before TRL's loss on a micro-batch (training and evaluation)
    policy_logps       the policy's per-token log-probabilities and entropies, inside TRL's loss
    loss_end           after TRL's loss: terms added to it
    training_step      before transformers' forward-backward of a micro-step
    training_step_end  after it (and after TRL has noted the step time, at the last micro-step of an optimizer step)
    clip_gradients     where transformers clips the gradients, once per optimizer step, before `optimizer.step()`
    regroup            event: policy groups changed (merge, split, refinement), announced by the policy groups
    checkpoint         the state saved in every checkpoint and restored on resume (`state()`)

Modes: `Registry` maps a name to a class for the modes a config field picks by name (`entropy_reg`, `grad_reg`), as
verl's `register_policy_loss` (`verl/trainer/ppo/core_algos.py`) maps a loss name to its function. The config's
validation, its `--help` text and its docs read the registry, so adding a mode is one registered class plus its config
fields. A name is registered once (PEFT's `register_peft_method` refuses duplicates the same way).
"""

import textwrap
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch

POINTS = ("prompt_filter", "generation_batch", "skip_prompts", "generation", "rewards", "advantages", "loss_start",
          "policy_logps", "loss_end", "training_step", "training_step_end", "clip_gradients", "regroup",
          "checkpoint")  # fmt: skip


@dataclass(frozen=True)
class Regroup:
    """Policy groups changed: group ids before and after, for every training-dataset row.

    Attributes:
        old_names: the K group names before (index = group id).
        old_assignment: (num_rows,) int64 group id of each row before.
        names: the K' group names after.
        assignment: (num_rows,) int64 group id of each row after.
        reason: what happened, e.g. "step 20: merged 'a' and 'b' (...)".
    """

    old_names: tuple[str, ...]
    old_assignment: torch.Tensor
    names: tuple[str, ...]
    assignment: torch.Tensor
    reason: str

    def parents(self) -> dict[str, dict[str, float]]:
        """New group name -> {old group name: rows it took from that group}, for every new group."""
        old = np.asarray(self.old_assignment)
        new = np.asarray(self.assignment)
        parents = {}
        for group, name in enumerate(self.names):
            ids, counts = np.unique(old[new == group], return_counts=True)
            parents[name] = {self.old_names[i]: float(c) for i, c in zip(ids.tolist(), counts.tolist(), strict=True)}
        return parents


def total_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """(N,) the reward of each completion as TRL forms it from (N, F) `rewards_per_func`: the `reward_weights` (F,)
    weighted sum over reward functions, NaN where every function returned None (on the CPU)."""
    rewards_per_func = rewards_per_func.cpu()
    rewards = (rewards_per_func * reward_weights.cpu()).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def prompts_per_draw(trainer, local_size: int) -> int:
    """P, the prompts of one global generation batch whose slice on each process is `local_size` rows."""
    return local_size * trainer.accelerator.num_processes // trainer.num_generations


def local_rows(trainer, prompt_rows: torch.Tensor, local_size: int) -> list[dict]:
    """This process's `local_size` training-dataset rows of a global draw `prompt_rows` (P,): every prompt repeated
    `num_generations` times in a row, and process i taking rows [i·local_size, (i+1)·local_size), as TRL's sampler
    lays a generation batch out (the same draw on every process)."""
    rows = prompt_rows.repeat_interleave(trainer.num_generations)
    start = trainer.accelerator.process_index * local_size
    return [trainer.train_dataset[int(row)] for row in rows[start : start + local_size]]


def loss_scaler(trainer) -> "torch.amp.GradScaler | None":
    """The fp16 loss scaler the trainer's accelerator scales the loss with (`mixed_precision="fp16"`: torch's
    `GradScaler`), None without one. A step whose scaled gradients overflow is the scaler's: it skips that optimizer
    step itself and halves its scale (torch.amp docs, "Gradient scaling")."""
    scaler = trainer.accelerator.scaler
    return scaler if scaler is not None and scaler.is_enabled() else None


# Every feature class by its `name`, recorded when the class is defined (`Feature.__init_subclass__`); the trainer
# builds the ones `composition.STEP` names, so a new feature is its folder plus its lines in `composition.py`.
FEATURE_CLASSES: dict[str, type["Feature"]] = {}


class Feature:
    """One feature of the trainer. Each method is a point of the step (module docstring); the defaults do nothing,
    and `composition.STEP` names the points each feature overrides (a test keeps the two in sync).

    A subclass that sets `name` is recorded in `FEATURE_CLASSES` under it when defined. Raises ValueError when
    another class already took the name, or the name it `exposes`."""

    name: str  # its key in `trainer.features`, `composition.STEP` and checkpoints
    # The trainer attribute that shows the feature's state to tests, callbacks and notebooks, or None: then
    # `trainer.<exposes>` is `exposed()` while the feature is on and None while it is off.
    exposes: str | None = None
    # What the feature touches beyond its own state, declared here so that the coupling reads in one place
    # (`tests/meta/test_architecture.py` checks the code against both, both ways):
    # `reads`: the other features whose state (`trainer.policy_groups`, ...) or settings (fields of their config
    # part) it reads, by name;
    # `writes`: what it sets on objects it does not own, as the code names them: the trainer's attributes
    # ("trainer.beta"), keys of TRL's output dict and batches ("output['policy_group_ids']"), the policy's
    # `generate` ("policy.generate"), a DeepSpeed engine's clip threshold ("deepspeed clip_grad").
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is None:  # an abstract helper class, or a subclass of a feature that keeps its name
            return
        if name in FEATURE_CLASSES:
            raise ValueError(f"feature {name!r} is already defined ({FEATURE_CLASSES[name].__qualname__})")
        exposes = cls.__dict__.get("exposes")
        owner = next((other for other in FEATURE_CLASSES.values() if exposes and other.exposes == exposes), None)
        if owner is not None:
            raise ValueError(f"feature {name!r} exposes {exposes!r}, which feature {owner.name!r} already exposes")
        FEATURE_CLASSES[name] = cls

    def __init__(self, trainer):
        self.trainer = trainer

    def exposed(self):
        """What `trainer.<exposes>` returns while the feature is on: `state()` unless it says otherwise."""
        return self.state()

    @classmethod
    def build(cls, trainer) -> "Feature | None":
        """The feature for `trainer` (its model loaded, its `args` checked), or None when its settings are off.

        Raises:
            ValueError: a setting that cannot apply to this model, data or engine, naming it.
        """
        raise NotImplementedError

    def prompt_filter(self, row: int) -> bool:
        """Whether the training-dataset row `row`, drawn for the generation batch, is kept (generated for)."""
        return True

    def generation_batch(self, inputs: list[dict], keep: Callable[[int], bool] | None) -> list[dict] | None:
        """The rows TRL generates for instead of the data loader's `inputs` (B rows, `num_generations` per prompt),
        each drawn row passed through `keep` (the prompt filters; None: there are none); None: this feature does not
        draw this batch."""
        return None

    def skip_prompts(self, inputs: list[dict]) -> list[dict]:
        """This process's rows of the drawn generation batch `inputs` (B rows) that are generated for: the same
        number on every process, `num_generations` per prompt in a row over the processes."""
        return inputs

    def generation(self, prompt_ids: list[list[int]], generate: Callable[[], tuple]) -> AbstractContextManager:
        """A context entered around one of TRL's `model.generate` calls, for the batch's `prompt_ids`; `generate()`
        is TRL's generation of this batch without the features (`_generate_single_turn`: completion ids and
        log-probabilities), which a feature may call inside its context before the block (fast generation's probe).
        A context that stops an error of the block makes the trainer generate the batch again."""
        return nullcontext()

    def rewards(self, inputs: list[dict], rewards_per_func: torch.Tensor) -> None:
        """`rewards_per_func` (N, F) of the generation batch (NaN where a function returned None), over all
        processes; `inputs` are this process's B rows."""

    def advantages(self, output: dict) -> None:
        """TRL's output for the generation batch on this process (advantages (B,), masks (B, T), ...); may change
        its values or add entries, which TRL then buffers for the micro-steps."""

    def loss_start(self, model, inputs: dict, batch: dict) -> None:
        """Before TRL's loss on a micro-batch: `inputs` is the micro-batch TRL buffers, `batch` the shallow copy that
        TRL's loss reads (a feature may change its entries for this pass only)."""

    def policy_logps(self, batch: dict, logps: torch.Tensor, entropies: torch.Tensor | None) -> torch.Tensor:
        """The policy's per-token log-probabilities (B, T) and entropies (B, T) inside TRL's loss; returns the
        log-probabilities TRL's loss goes on with."""
        return logps

    def loss_end(self, batch: dict, loss: torch.Tensor) -> torch.Tensor:
        """After TRL's loss on `batch`; returns the loss (with any terms added)."""
        return loss

    def training_step(self, model) -> None:
        """Before transformers' forward-backward of a micro-step."""

    def training_step_end(self) -> None:
        """After TRL's training step of a micro-step (its forward-backward, and generation when the micro-step
        starts a generation batch)."""

    def clip_gradients(self, model, clip):
        """Clip the gradients where transformers does; `clip(model)` is transformers' own clipping. Returns the total
        gradient norm, as `clip` does."""
        return clip(model)

    def regroup(self, event: Regroup) -> None:
        """Policy groups changed (`Regroup`)."""

    def state(self):
        """The object (with `state_dict()` / `load_state_dict()`) saved in checkpoints, or None."""
        return None


class Registry(dict):
    """Mode name -> mode class, in registration order.

    Args:
        field: the config field whose values are names in this registry (for error messages).
    """

    def __init__(self, field: str):
        super().__init__()
        self.field = field

    def register(self, name: str) -> Callable[[type], type]:
        """Class decorator: register the class under `name` and set its `name` attribute.

        Raises:
            ValueError: `name` is already registered, or is not a lowercase identifier (it is written in YAML files
                and on the command line, comma-separated).
        """

        def add(cls: type) -> type:
            if not name.isidentifier() or name != name.lower():
                raise ValueError(f"{self.field} mode names are lowercase identifiers, got {name!r}")
            if name in self:
                raise ValueError(f"{self.field} mode {name!r} is already registered ({self[name].__qualname__})")
            cls.name = name
            self[name] = cls
            return cls

        return add

    def unregister(self, name: str) -> None:
        """Remove `name` (for a test that registered a mode of its own). Raises KeyError if it is not registered."""
        del self[name]

    def describe(self, indent: str = "", width: int = 119) -> str:
        """A list item per mode, `- name: summary`, wrapped at `width` columns after `indent` (between words only),
        for docstrings."""
        items = [f"- `{name}`: {cls.summary}." for name, cls in self.items()]
        fill = dict(initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False)
        return "\n".join(textwrap.fill(item, width, break_long_words=False, **fill) for item in items)

    def help(self) -> str:
        """The modes on one line, `name (summary); ...`, for `--help`."""
        return "; ".join(f"{name} ({cls.summary})" for name, cls in self.items())

"""What the trainer is composed of: the package's features, the settings each adds to `GRPOConfig`, and the points of
a training step where each acts (`STEP`).

This is the one module a new feature is added to, besides its own folder and its docs page
(`docs/adding-a-feature.md`): the import of its `Feature` class and its fields class, the fields class among
`FeatureFields`' bases, and its lines in `STEP`. `config.GRPOConfig` has `FeatureFields` as a base, and
`trainer.GRPOTrainer` builds the features `STEP` names, in the order it first names them, and calls them at its
points.
"""

from dataclasses import dataclass

from .doctor.config import RunDoctorFields
from .doctor.feature import RunDoctor
from .entropy.config import EntropyRegFields
from .entropy.feature import EntropyReg
from .feature_api import FEATURE_CLASSES, Feature
from .generation.config import FastGenerationFields
from .generation.feature import FastGenerationFeature
from .grad_reg.config import GradRegFields
from .grad_reg.feature import GradReg
from .policy_groups.config import PolicyGroupFields
from .policy_groups.feature import PolicyGroups
from .prompt_skip.config import PromptSkipFields
from .prompt_skip.feature import PromptSkip
from .vllm_lora.config import VLLMLoRAFields
from .vllm_lora.feature import VLLMLoRASync

# The package's features, imported by name. Defining a `Feature` subclass records it by its `name`
# (`feature_api.FEATURE_CLASSES`), the name `STEP` uses; a feature of another package is imported by its user before
# the trainer is built. `STEP` must name exactly these (checked below, when the package is imported).
PACKAGE_FEATURES = (
    PolicyGroups,
    PromptSkip,
    EntropyReg,
    GradReg,
    FastGenerationFeature,
    VLLMLoRASync,
    RunDoctor,
)


# Each feature's settings: its fields class (`<feature>/config.py`, whose `field_checks.ConfigPart` is found from it:
# `field_checks.config_parts`). The bases are named, so that type checkers and editors see every field of
# `GRPOConfig`. dataclasses collect fields from the last base to the first, so `GRPOConfig`'s docstring and the
# configuration reference list the sections in that order: the policy groups' first.
@dataclass
class FeatureFields(
    RunDoctorFields,
    VLLMLoRAFields,
    FastGenerationFields,
    GradRegFields,
    EntropyRegFields,
    PromptSkipFields,
    PolicyGroupFields,
):
    """The settings of every feature of the package: a base of `config.GRPOConfig`, before TRL's `GRPOConfig`."""


# Which features act at each point of a training step, in this order (`feature_api` says what each point is). Within a
# point the order matters where one feature reads what another wrote: the policy groups reweight the advantages
# before entropy regularization marks the scored completions and shifts the advantages inside the loss; the entropy
# terms are added to the loss after the policy groups and the adaptive KL have measured it.
STEP = {
    # with refilling: a prompt whose recent generation groups were uninformative may be replaced in the draw
    "prompt_filter": ("prompt_skip",),
    # the first that draws the batch: per policy group, else (no groups, or their `uniform` order) uniformly
    "generation_batch": ("policy_groups", "prompt_skip"),
    # without refilling: the prompts predicted uninformative taken out of the drawn batch
    "skip_prompts": ("prompt_skip",),
    # timed (around all of it); static cache, compiled decode step, merged LoRA weights (a probe generation first;
    # on failure the fall back to TRL's generation, which generates the batch again); vLLM: only the LoRA adapter
    # synced, and every generation through it
    "generation": ("doctor", "fast_generation", "vllm_lora"),
    # rows and rewards noted; which completions some reward function scored
    "rewards": ("policy_groups", "prompt_skip", "entropy_reg"),
    # statistics, weights, regroup, reweighted advantages; each prompt's history; the scored mask; the timings
    "advantages": ("policy_groups", "prompt_skip", "entropy_reg", "doctor"),
    # the accumulation window planned (Clip-Cov/KL-Cov tokens); this step's β
    "loss_start": ("entropy_reg", "grad_reg"),
    # entropies and log-probabilities noted; advantages shifted, Clip-Cov's tokens detached
    "policy_logps": ("policy_groups", "grad_reg", "entropy_reg"),
    # the loss normalized as if the skipped completions were there; each group's entropy and the KL measured; the
    # entropy terms added to the loss (over the generated completions: not scaled for the skipped ones)
    "loss_end": ("prompt_skip", "policy_groups", "grad_reg", "entropy_reg"),
    # DeepSpeed: its clip bound set from ZClip; the step times TRL has noted so far
    "training_step": ("grad_reg", "doctor"),
    # the generation and scoring time of the optimizer step noted, once TRL has noted its step time
    "training_step_end": ("doctor",),
    # AGC, the non-finite guard, ZClip
    "clip_gradients": ("grad_reg",),
    # event: the per-group entropy controllers follow the policy groups
    "regroup": ("entropy_reg",),
    # the state saved in checkpoints and restored on resume
    "checkpoint": ("policy_groups", "prompt_skip", "entropy_reg", "grad_reg"),
}


def step_features(step: dict[str, tuple[str, ...]]) -> tuple[type[Feature], ...]:
    """The feature classes `step` names (a table like `STEP`), in the order it first names them: the order the trainer
    builds them in (each `build` returns None when its settings are off; the policy groups come before entropy
    regularization, whose per-group controllers read them). Raises KeyError for a name no feature has."""
    names = dict.fromkeys(name for acting in step.values() for name in acting)
    return tuple(FEATURE_CLASSES[name] for name in names)


FEATURES = step_features(STEP)  # the package's features, in the order they are built
if set(FEATURES) != set(PACKAGE_FEATURES):  # a feature imported but never built, or built but not imported here
    raise ImportError(
        f"composition.STEP names {sorted(f.name for f in FEATURES)}, PACKAGE_FEATURES holds "
        f"{sorted(f.name for f in PACKAGE_FEATURES)}: each feature of the package belongs in both"
    )

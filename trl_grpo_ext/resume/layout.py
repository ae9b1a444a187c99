"""The batch layout a checkpoint was written with, and a resume with another one refused.

transformers resumes by skipping, in the data of the epoch under way, the batches of the optimizer steps already
done, counted at the *resumed* run's layout (transformers PR #43718; stock TRL the same). With another
`num_generations` or batch size that is another number of prompts: resumed at step 2 after 4 prompts a step, with 2
prompts a step now, it skips 4 prompts and trains 4 of the 8 done a second time, while the buffered generation
batch saved with the checkpoint (`GRPOLoopState`) holds the old layout's completions. Each checkpoint therefore
records its layout (`LAYOUT_NAME`), and `layout_problem` says what changed and what a resume would skip or repeat.
"""

import json
import os

from .checkpoints import write_json_atomically

LAYOUT_NAME = "trl_grpo_ext_layout.json"
# The settings that decide how many prompts and completions an optimizer step takes, and the generation cycle.
LAYOUT_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                 "steps_per_generation", "generation_batch_size", "num_iterations")  # fmt: skip


def batch_layout(args, num_processes: int) -> dict:
    """The layout of a run: `LAYOUT_FIELDS` of its config `args`, and `num_processes`."""
    return {**{name: getattr(args, name) for name in LAYOUT_FIELDS}, "num_processes": num_processes}


def prompts_per_step(layout: dict) -> float:
    """Prompts an optimizer step takes: completions a step (per device x accumulation x processes), over the passes
    over each generation batch (`num_iterations`) and the completions a prompt (`num_generations`)."""
    completions = layout["per_device_train_batch_size"] * layout["gradient_accumulation_steps"]
    return completions * layout["num_processes"] / layout["num_iterations"] / layout["num_generations"]


def save_layout(checkpoint_dir: str, layout: dict) -> str:
    """Write `layout` into `checkpoint_dir` (`LAYOUT_NAME`, atomically); its path."""
    path = os.path.join(checkpoint_dir, LAYOUT_NAME)
    write_json_atomically(path, layout)
    return path


def layout_problem(checkpoint_dir: str, layout: dict, step: int) -> str | None:
    """Why resuming from `checkpoint_dir` (saved at optimizer `step`) with `layout` would not be the run that was
    saved: the settings that changed, with their values, and how many prompts of the epoch a resume would skip or
    train again, and the fix; None when the layouts agree or the checkpoint records none (stock TRL's, or written
    before layouts were recorded)."""
    path = os.path.join(checkpoint_dir, LAYOUT_NAME)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        saved = json.load(f)
    changed = [name for name in layout if name in saved and saved[name] != layout[name]]
    if not changed:
        return None
    was, now = prompts_per_step(saved), prompts_per_step(layout)
    what = ", ".join(f"{name} {saved[name]} -> {layout[name]}" for name in changed)
    moved = f"about {abs(now - was) * step:g} prompts {'skipped' if now > was else 'trained again'}"
    effect = (f"transformers counts the {step} steps done as {now:g} prompts each where they took {was:g}, so it "
              f"skips the wrong part of the data ({moved}), and the saved generation batch no longer fits"
              if now != was else "the saved generation batch and its cycle no longer fit the run")  # fmt: skip
    settings = ", ".join(f"{name}={saved[name]}" for name in changed)
    return (f"resume_from_checkpoint={checkpoint_dir!r} was saved with another batch layout ({what}): {effect}; "
            f"resume with the checkpoint's settings ({settings}), or start a new run from its weights "
            f"(model_name_or_path={checkpoint_dir!r}, without resume_from_checkpoint)")  # fmt: skip

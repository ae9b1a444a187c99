"""The run doctor's checks of what a step costs: fast generation that fell back or stopped being fast,
generation-bound steps and the CUDA memory headroom."""

import numpy as np

from ..error_reports import CAUSES, COMPILE_TROUBLE
from . import series as S
from .checks import Finding, Run, Skip, check, missing, span, too_short
from .thresholds import value


@check("fast_generation")
def fast_generation(run: Run) -> list[Finding] | Skip:
    """Fast generation fell back to TRL's generation (`fast_generation/fell_back/<cause>`, logged once, when it fell
    back), or its compiled decode step silently stopped being fast (`fast_generation/recompile_limit_hits`,
    `fast_generation/cudagraph_skips`, logged at each generation that added to torch's counts)."""

    causes = run.keys_like("fast_generation/fell_back/", "")
    troubles = [kind for kind in COMPILE_TROUBLE if len(run.finite(f"fast_generation/{kind}")[0])]
    if not causes and not troubles:
        on = run.settings.get("generation_compile") or run.settings.get("generation_lora_merge")
        if on or run.keys_like("fast_generation/", ""):  # the settings, or (a run folder read alone) its metrics
            return []
        return missing("fast_generation", "fast_generation/...", "logged with generation_compile or "
                       "generation_lora_merge on")  # fmt: skip
    findings = []
    for cause in causes:
        steps, _ = run.finite(f"fast_generation/fell_back/{cause}")
        what, fix = CAUSES.get(cause, CAUSES["other"])
        findings.append(Finding(
            "fast_generation", "run", "fast generation fell back to TRL's generation",
            f"fast_generation/fell_back/{cause} at step {steps[0]}: {what} (the warning in the training log names the "
            "error, fast_generation_fallback.log in the run folder holds its traceback)",
            fix, int(steps[0]),
        ))  # fmt: skip
    for kind in troubles:
        steps, counts = run.finite(f"fast_generation/{kind}")
        what, fix = COMPILE_TROUBLE[kind]
        findings.append(Finding(
            "fast_generation", kind.removesuffix("s").replace("_", " "), what,
            f"fast_generation/{kind} {counts.sum():.0f} over steps {steps[0]}-{steps[-1]}", fix, int(steps[0]),
        ))  # fmt: skip
    return findings


@check("generation_bound")
def generation_bound(run: Run) -> list[Finding] | Skip:
    """Nearly all of the step time goes to `model.generate` (`timing/generation`, logged with `run_doctor`, against
    TRL's `step_time`)."""
    if not len(run.series("timing/generation")[0]):
        return missing(
            "generation_bound", "timing/generation", "trl_grpo_ext's GRPOTrainer logs it with run_doctor=True"
        )
    steps, (generation, step_time) = run.aligned("timing/generation", "step_time")
    width = run.window(steps)
    if len(steps) < width:
        return too_short("generation_bound", "timing/generation", len(steps), width)
    share = np.convolve(generation, np.ones(width), "valid") / np.convolve(step_time, np.ones(width), "valid")
    end = S.first_window(share >= value("generation_share"), width)
    if end is None:
        return []
    ideas = []
    if not run.settings.get("use_vllm"):
        ideas.append("use_vllm=True with vllm_mode=colocate (TRL generates in vLLM)")
    if not run.settings.get("generation_compile"):
        ideas.append("generation_compile=True (trl_grpo_ext: static KV cache and a compiled decode step)")
    if run.settings.get("use_peft", True) and not run.settings.get("generation_lora_merge"):
        ideas.append("with LoRA, generation_lora_merge=True")
    ideas.append("generate less: prompt_skip=True, or a smaller max_completion_length"
                 f"{run.now('max_completion_length')} or num_generations{run.now('num_generations')}")  # fmt: skip
    return [Finding(
        "generation_bound", "run", f"steps are generation-bound: {share[end - width + 1]:.0%} of the step time",
        f"timing/generation {generation[end - width + 1 : end + 1].sum():.3g} s of step_time "
        f"{step_time[end - width + 1 : end + 1].sum():.3g} s over {span(steps, end, width)} "
        f"(>= {value('generation_share'):.0%})",
        "; ".join(ideas), int(steps[S.onset(end, width, generation >= value("generation_share") * step_time)]),
    )]  # fmt: skip


@check("memory")
def memory(run: Run) -> list[Finding] | Skip:
    """The CUDA memory headroom: the peak reserved memory near the card's size (an out-of-memory error is close) or
    far below it over the run (room for larger generation batches)."""
    if not len(run.series("memory/peak_reserved_gib")[0]):
        return missing("memory", "memory/peak_reserved_gib", "logged with run_doctor=True on a CUDA device only")
    steps, (peak, total) = run.aligned("memory/peak_reserved_gib", "memory/total_gib")
    if not len(steps):
        return too_short("memory", "memory/peak_reserved_gib and memory/total_gib", 0, 1)
    share = np.maximum.accumulate(peak) / total
    high = np.flatnonzero(share >= value("memory_high"))
    if len(high):
        i = high[0]
        return [Finding(
            "memory", "run", "CUDA memory is nearly full: an out-of-memory error is close",
            f"peak reserved {peak[i]:.3g} GiB of {total[i]:.3g} GiB ({share[i]:.0%} >= {value('memory_high'):.0%}) "
            f"at step {steps[i]}",
            "gradient_checkpointing=True, a smaller per_device_train_batch_size"
            f"{run.now('per_device_train_batch_size')} with more gradient_accumulation_steps, QLoRA "
            "(load_in_4bit=True), "
            "or a shorter max_completion_length; `trl-grpo-ext memory --config ...` estimates each term",
            int(steps[i]),
        )]  # fmt: skip
    width = run.window(steps)
    if len(steps) >= width and share[width - 1] <= value("memory_low"):
        i = width - 1
        return [Finding(
            "memory", "run", f"CUDA memory is mostly unused: {share[i]:.0%} of the card at most",
            f"peak reserved {np.nanmax(peak[: i + 1]):.3g} GiB of {total[i]:.3g} GiB over steps {steps[0]}-{steps[i]} "
            f"(<= {value('memory_low'):.0%})",
            "generate more at once for faster steps: a larger per_device_train_batch_size"
            f"{run.now('per_device_train_batch_size')} or steps_per_generation; or turn gradient_checkpointing off",
            int(steps[i]),
        )]  # fmt: skip
    return []

"""What a step that did not generate the skipped prompts must change so that TRL's loss normalizes as if it had.

A skipped prompt's generation group is treated as present with zero advantage: under TRL's clipped surrogate (GRPO,
arXiv:2402.03300, eq. 3, with β = 0) a zero-advantage completion adds nothing to the loss's sum, only to its
normalizer. So the sum TRL computes over the generated completions is kept and the normalizer is made the one of the
whole draw, per `GRPOConfig.loss_type` (TRL's `_compute_loss`; `NORMALIZERS` maps each to how):

- `tokens` (dapo, cispo, vespo): the sum over tokens is divided by `num_items_in_batch`, the generation batch's
  completion tokens over all processes. The skipped completions' tokens (estimated) are added to it.
- `sequences` (grpo, sapo, luspo, dr_grpo): the loss is a mean over the micro-batch's completions (for dr_grpo, of
  each completion's token sum over `max_completion_length`). A micro-batch holds kept/drawn of the completions it would
  have held, so the loss is multiplied by kept/drawn (B'/B, B' = B·kept/drawn completions).
- `micro_batch_tokens` (bnpo): the sum is divided by the micro-batch's own completion tokens, so the loss is
  multiplied by generated/(generated + skipped) tokens of the generation batch (exact where the micro-batches share
  the skipped tokens in proportion; in expectation otherwise).

With β > 0 the KL term of a skipped completion, which would not be zero, is left out of the sum (the normalizer
still counts it): the KL penalty acts as if the skipped completions had not moved from the reference.

The premise, that an uninformative generation group has zero advantage and leaves the others' as they are, fails
under some settings; `no_refill_problem` names them (the config refuses them without refilling).
"""

# loss_type -> the normalizer TRL's `_compute_loss` divides its sum by
NORMALIZERS = {"dapo": "tokens", "cispo": "tokens", "vespo": "tokens", "grpo": "sequences", "sapo": "sequences",
               "luspo": "sequences", "dr_grpo": "sequences", "bnpo": "micro_batch_tokens"}  # fmt: skip


def normalizer_correction(
    loss_type: str, kept: int, drawn: int, generated_tokens: float, skipped_tokens: float
) -> tuple[float, float]:
    """(tokens to add to `num_items_in_batch`, factor to multiply the loss by) for a generation batch of which
    `kept` of `drawn` prompts were generated for, with `generated_tokens` completion tokens (over all processes)
    and an estimated `skipped_tokens` for the skipped ones.

    Raises:
        ValueError: a loss type outside `NORMALIZERS` (a TRL newer than this package).
    """
    kind = NORMALIZERS.get(loss_type)
    if kind == "tokens":
        return skipped_tokens, 1.0
    if kind == "sequences":
        return 0.0, kept / drawn
    if kind == "micro_batch_tokens":
        total = generated_tokens + skipped_tokens
        return 0.0, generated_tokens / total if total > 0 else 1.0
    raise ValueError(
        f"prompt_skip cannot count the skipped completions in the normalizer of loss_type={loss_type!r} "
        f"(it can for {', '.join(sorted(NORMALIZERS))}); set prompt_skip_refill=True, which keeps the batch full"
    )


def no_refill_problem(args) -> str | None:
    """Why skipping without refilling cannot leave the update as it was under the `GRPOConfig` `args`, or None.

    An all-equal generation group has zero advantage and does not move the others' only with per-prompt baselines
    and per-group (or no) scaling; a loss scaled for the skipped completions would also scale TRL's entropy bonus,
    which it adds inside the loss.
    """
    fix = "; set prompt_skip_refill=True, which keeps the batch full"
    kind = NORMALIZERS.get(args.loss_type)
    if kind is None:
        return (f"prompt_skip=True cannot count the skipped completions in the normalizer of "
                f"loss_type={args.loss_type!r} (it can for {', '.join(sorted(NORMALIZERS))}){fix}, if TRL knows "
                "that loss type")  # fmt: skip
    if args.scale_rewards == "batch":
        return ("prompt_skip=True with scale_rewards='batch': the advantages are divided by the whole batch's reward "
                f"std, which leaving out the uninformative generation groups would change{fix}")  # fmt: skip
    if args.multi_objective_aggregation == "normalize_then_sum":
        return ("prompt_skip=True with multi_objective_aggregation='normalize_then_sum': the advantages are "
                f"normalized over the whole batch, which leaving out generation groups would change{fix}")  # fmt: skip
    if kind != "tokens" and (args.entropy_coef != 0 or args.use_adaptive_entropy):
        return (f"prompt_skip=True with loss_type={args.loss_type!r} and TRL's entropy bonus (entropy_coef="
                f"{args.entropy_coef}, use_adaptive_entropy={args.use_adaptive_entropy}): the loss is scaled for the "
                "skipped completions, and TRL adds the bonus inside it; use loss_type='dapo' (its normalizer takes "
                f"the skipped tokens instead){fix}")  # fmt: skip
    return None

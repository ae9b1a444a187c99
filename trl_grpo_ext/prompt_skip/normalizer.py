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

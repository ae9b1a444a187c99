"""The torch internals fast generation reads (`TORCH_INTERNALS` in `surface`, checked at import): dynamo's counters,
where torch records that a compiled function hit its recompile limit or ran without its CUDA graph. Neither is an
error, and neither has a public API in torch 2.13: the counters are how torch's own tests and `torch._dynamo.utils`
report them."""

_RECOMPILE_LIMIT = "Dynamo recompile limit exceeded"  # the start of dynamo's graph-break message for a limit hit


def compile_counters() -> tuple[int, int]:
    """(recompile-limit hits, CUDA-graph skips) in this process so far: the `unimplemented` entries of
    `torch._dynamo.utils.counters` whose message is a recompile-limit hit (one per function given up on), and
    `counters["inductor"]["cudagraph_skips"]` (one per skipped graph; `torch._inductor.cudagraph_utils`)."""
    from torch._dynamo.utils import counters

    hits = sum(n for message, n in counters["unimplemented"].items() if message.startswith(_RECOMPILE_LIMIT))
    return hits, counters["inductor"]["cudagraph_skips"]

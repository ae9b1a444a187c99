"""When fast generation fails on the machine it meets: what went wrong in words, the setting to change, the random
state a retry needs, and what later generations report that silently slows them.

The first generation of a run is where fast generation meets the real machine: torch.compile's code generation
(inductor, Triton, CUDA graphs), the pinned host copy of the in-place merge, the generation copy and the static cache
on the GPU. Each can fail there, after the model has downloaded and loaded: no C compiler or Python headers for
Triton's launcher (slim Docker images, WSL), Triton missing, a card older than Triton supports (before Volta), a
dynamo error through PEFT's layers, an out-of-memory error in the compiled decode. `FastGenerationFeature`
(`generation.feature`) then falls back to TRL's generation with one warning built here (`fallback_cause`, the
words in `trl_grpo_ext.error_reports`), unless `generation_fallback=False`.

`RNGState` keeps the random state of every generator a generation draws from, so that the short probe generation
and a failed attempt leave the run drawing what stock TRL draws. `CompileTrouble` reads torch's counters of the two
ways a compiled decode step silently stops being fast after it worked (`trl_contact.compile_counters`).
"""

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..error_reports import CAUSES, write_traceback

# (cause, lower-case fragments of an error message in the chain that mean it), tried in this order
_MESSAGES = (
    ("out_of_memory", ("out of memory", "for the generation copy, and training will allocate")),
    ("old_card", ("too old to be supported by the triton", "cuda capability >= 7.0", "compute capability < 7.0")),
    ("no_triton", ("cannot find a working triton", "no module named 'triton'", "triton is not installed")),
    ("no_compiler", ("failed to find c compiler", "python.h", "no working c++ compiler", "invalidcxxcompiler",
                     "compiler not found", "cc: not found", "gcc: not found")),
)  # fmt: skip


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and the exceptions it was raised from or during (`__cause__`, `__context__`), outermost first."""
    chain = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def fallback_cause(error: BaseException) -> str:
    """The key of `CAUSES` for an error of the fast path, from its type and the messages of its chain: torch's
    `OutOfMemoryError` or a message that names the cause; any other error raised inside torch.compile
    (`torch._dynamo`, `torch._inductor`) is "compile_error"; the rest "other"."""
    chain = _chain(error)
    if any(isinstance(e, torch.OutOfMemoryError) for e in chain):
        return "out_of_memory"
    text = " ".join(f"{type(e).__name__} {e}" for e in chain).lower()
    for cause, fragments in _MESSAGES:
        if any(fragment in text for fragment in fragments):
            return cause
    if any(type(e).__module__.startswith(("torch._dynamo", "torch._inductor")) for e in chain):
        return "compile_error"
    return "other"


def fallback_warning(error: BaseException, cause: str, where: str, log: Path | None = None) -> str:
    """The one warning of a fall back: where it happened, the error's type and first line, the cause in words, the
    setting to change and the file that holds the full traceback (`write_fallback_log`, when written)."""
    what, fix = CAUSES[cause]
    first_line = (str(error).strip().splitlines() or [""])[0][:1000]
    saved = f" The full traceback: {log}." if log is not None else ""
    return (
        f"Fast generation fell back to TRL's generation ({where}): {type(error).__name__}: {first_line}. Cause: "
        f"{what}. To change: {fix}. Training goes on with TRL's generation (generation_fallback=False raises the "
        f"error instead).{saved}"
    )


FALLBACK_LOG = "fast_generation_fallback.log"


def write_fallback_log(output_dir: str, process_index: int, error: BaseException, where: str) -> Path | None:
    """Write the full traceback of the error fast generation fell back on (its first line alone is in the warning:
    a compiler's output, inductor's generated code, are below it) to `<output_dir>/fast_generation_fallback.log`
    (`...log.<process index>` on processes other than the first), with where it happened and the versions
    (`error_reports.write_traceback`, as `error.log`). Returns the path, or None when it cannot be written (the run
    goes on)."""
    name = FALLBACK_LOG if process_index == 0 else f"{FALLBACK_LOG}.{process_index}"
    return write_traceback(Path(output_dir) / name, error, [f"fast generation fell back {where}"])


class RNGState:
    """The state of every random generator a generation may draw from (torch's CPU generator and each CUDA
    device's, Python's `random`, NumPy's global one), taken when built; `restore()` puts it back."""

    def __init__(self):
        self.cpu = torch.get_rng_state()
        on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.cuda = torch.cuda.get_rng_state_all() if on_cuda else None
        self.python = random.getstate()
        self.numpy = np.random.get_state()

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)


@dataclass(frozen=True)
class CompileTrouble:
    """torch's running counts, over the process, of the two ways a compiled decode step stops being fast without an
    error: `recompile_limit_hits`, dynamo giving up on a function after `torch._dynamo.config.recompile_limit`
    recompilations (it runs uncompiled from then on), and `cudagraph_skips`, inductor running a graph without its
    CUDA graph (a re-record limit, a CPU tensor, a mutated input). Compare two readings taken around a generation."""

    recompile_limit_hits: int
    cudagraph_skips: int

    @classmethod
    def now(cls) -> "CompileTrouble":
        from ..trl_contact import compile_counters  # here: the run doctor reads `CAUSES` without loading TRL

        return cls(*compile_counters())

    def since(self, earlier: "CompileTrouble") -> "CompileTrouble":
        return CompileTrouble(
            self.recompile_limit_hits - earlier.recompile_limit_hits, self.cudagraph_skips - earlier.cudagraph_skips
        )

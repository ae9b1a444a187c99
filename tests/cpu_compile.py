"""The torch.compile backend of fast generation in the CPU tests: `aot_eager` instead of inductor.

The CPU tests of `generation_compile` check what compilation does to training and generation: which graphs dynamo
traces and how often (`unique_graphs`), the one static cache and its addresses, and that training equals stock
generation. dynamo traces the same graphs whatever the backend; `aot_eager` runs them through AOTAutograd in eager
mode instead of building C++ kernels (inductor's CPU build of the lever test's decode step: 48 s in CI on a cold
cache, 2 cores; 4-5 s with `aot_eager`). Inductor is what matters on the card, and the GPU-marked tests
(`tests/gpu/test_generation_gpu.py`, `benchmarks/generation/gpu_checks.py`) compile with it, CUDA graphs included;
they have not run on a GPU yet, so until they do, CI compiles nothing with inductor.
`TRL_GRPO_EXT_TEST_CPU_COMPILE_BACKEND=inductor make test` runs the CPU compile tests with inductor (all passed with
it when this module was written).

tests/conftest.py sets `BACKEND_ENV` for the session, unless it is set already (subprocesses inherit it: the
two-process job's workers call `use_backend_from_env`), and patches the function once for the session, before any
module's fixtures train.
"""

import os

BACKEND_ENV = "TRL_GRPO_EXT_TEST_CPU_COMPILE_BACKEND"


def use_backend(backend: str):
    """Make `generation.static_cache.compile_config_for` give `backend` off CUDA; return what undoes it."""
    from trl_grpo_ext.generation import static_cache

    original = static_cache.compile_config_for

    def compile_config_for(device_type: str):
        config = original(device_type)
        if device_type != "cuda":
            config.backend = backend
        return config

    static_cache.compile_config_for = compile_config_for

    def undo():
        static_cache.compile_config_for = original

    return undo


def use_backend_from_env() -> None:
    """`use_backend` with the backend `BACKEND_ENV` names, if it is set (a subprocess of the test session)."""
    if os.environ.get(BACKEND_ENV):
        use_backend(os.environ[BACKEND_ENV])

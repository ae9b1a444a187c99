"""The words of fast generation's fall back and of its compile troubles: what happened and the setting to change,
by key. The fast-generation feature warns with them (`generation.fallback`) and logs the key
(`fast_generation/fell_back/<cause>`, `fast_generation/<trouble>`); the run doctor reads the key from the log and
reports the same words (`doctor.resources.fast_generation`). Here, apart from both, so that neither feature imports
the other."""

# cause -> (what happened, in words; the setting to change). `fallback_cause` picks one from the error.
CAUSES = {
    "out_of_memory": (
        "the GPU ran out of memory",
        "generation_lora_merge='inplace' or 'none' (no generation copy on the GPU), or a smaller "
        "generation_max_prompt_length, max_completion_length or per_device_train_batch_size "
        "(`trl-grpo-ext memory --config ...` estimates each term)",
    ),
    "no_compiler": (
        "torch.compile could not build its kernels: no working compiler (on a GPU Triton builds its launcher with a "
        "C compiler and Python's headers, Python.h; on a CPU inductor needs a C++ compiler), as in slim Docker images "
        "and WSL",
        "install the compilers and Python's headers (Debian/Ubuntu: apt install build-essential python3-dev), or set "
        "generation_compile=False",
    ),
    "no_triton": (
        "Triton, which torch.compile needs on CUDA, is missing or too old",
        "pip install triton (on Windows: pip install triton-windows), or set generation_compile=False",
    ),
    "old_card": (
        "the GPU is older than Triton supports (CUDA compute capability 7.0, Volta, or newer)",
        "set generation_compile=False (generation_lora_merge still applies)",
    ),
    "compile_error": (
        "torch.compile failed on the decode step",
        "set generation_compile=False (generation_lora_merge still applies)",
    ),
    "other": (
        "the fast path raised an error",
        "set generation_compile=False and generation_lora_merge='none'",
    ),
}

COMPILE_TROUBLE = {
    "recompile_limit_hits": (
        "the compiled decode step hit torch's recompile limit, so it runs uncompiled from now on",
        "keep the shapes of generation fixed: generation_max_prompt_length at least the longest prompt, one "
        "generation batch size (an evaluation batch size equal to the training one)",
    ),
    "cudagraph_skips": (
        "the compiled decode step ran without its CUDA graph (TORCH_LOGS=cudagraphs says why)",
        "generation_max_prompt_length at least the longest prompt (a grown cache re-records the graph), or set "
        "generation_compile=False if it recurs",
    ),
}

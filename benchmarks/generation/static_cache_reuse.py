"""How many static KV caches a run builds, and at how many addresses its keys sit (issue #27), on the CPU.

    python benchmarks/generation/static_cache_reuse.py [--generations 40] [--output-dir benchmarks/generation/results]

A CUDA graph of the decode step takes the cache's key/value tensors as static inputs: a cache at new addresses in a
generation means the graph is recorded again. The CPU has no CUDA graphs, but the cache's lifetime is the same on any
device, so it is counted here, over `--generations` calls of the trainer's generation path (TRL's
`_generate_single_turn`, 8 prompts of 3-40 random tokens each, the tiny model with LoRA), for:

* `trl_static`: stock TRL with `cache_implementation="static"` (transformers builds a cache in every `generate`);
* `generation_compile`: this package's fast generation (one cache for the run, reset in place; a compiled decode
  step), with the in-place LoRA merge of the presets.

Prints a table (caches built, distinct key addresses per layer, median milliseconds a generation after the first);
with `--output-dir` also writes it to `static_cache_reuse.txt` there (`--output-dir benchmarks/generation/results`
refreshes the committed result). The GPU's side (CUDA graphs recorded over 150
generations) is `scripts/gpu_check.sh`'s re-record probe.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def count_caches(setting: str, model_dir: str, work: Path, generations: int) -> dict:
    """Caches built and distinct key addresses over `generations` generations with `setting` (module docstring)."""
    import random

    import transformers

    from tests.gpu.test_generation_gpu import probe_trainer

    built = []  # every StaticCache transformers or the trainer constructed (kept, so that addresses stay distinct)

    class CountedStaticCache(transformers.StaticCache):
        def __init__(self, *args, **kwargs):
            built.append(self)
            super().__init__(*args, **kwargs)

    originals = (transformers.StaticCache, transformers.generation.utils.StaticCache)
    transformers.StaticCache = transformers.generation.utils.StaticCache = CountedStaticCache
    try:
        if setting == "trl_static":
            trainer = probe_trainer(model_dir, work / setting, merge=None, dtype="fp32", device="cpu",
                                    cache_implementation="static")  # fmt: skip
        else:
            trainer = probe_trainer(model_dir, work / setting, merge="inplace", dtype="fp32", device="cpu")
        rng, seconds, addresses = random.Random(0), [], set()
        for _ in range(generations):
            prompt_ids = [[rng.randint(5, 400) for _ in range(rng.randint(3, 40))] for _ in range(8)]
            start = time.perf_counter()
            trainer._generate_single_turn(prompt_ids, None, {}, 4)
            seconds.append(time.perf_counter() - start)
            addresses |= {layer.keys.data_ptr() for cache in built for layer in cache.layers if layer.is_initialized}
    finally:
        transformers.StaticCache, transformers.generation.utils.StaticCache = originals
    layers = trainer.model.config.num_hidden_layers
    return {
        "setting": setting,
        "generations": generations,
        "caches_built": len(built),
        "key_addresses_per_layer": len(addresses) / layers,
        "median_ms": 1000 * statistics.median(seconds[1:]),
        "first_s": seconds[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generations", type=int, default=40)
    parser.add_argument("--output-dir", type=Path, help="write static_cache_reuse.txt there (default: print only)")
    args = parser.parse_args()
    from trl_grpo_ext.cli.tiny_model import save_tiny_model

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(Path(tmp) / "tiny-model"))
        rows = [count_caches(setting, model_dir, Path(tmp), args.generations)
                for setting in ("trl_static", "generation_compile")]  # fmt: skip
    lines = [
        f"static caches over {args.generations} generations (tiny Qwen2 + LoRA, 8 prompts of 3-40 tokens, CPU, torch "
        f"{torch.__version__})",
        f"{'setting':<20}{'caches built':>14}{'key addresses/layer':>21}{'median ms/gen':>15}{'first gen s':>13}",
    ]
    for row in rows:
        lines.append(f"{row['setting']:<20}{row['caches_built']:>14}{row['key_addresses_per_layer']:>21.0f}"
                     f"{row['median_ms']:>15.1f}{row['first_s']:>13.1f}")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if args.output_dir is not None:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "static_cache_reuse.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()

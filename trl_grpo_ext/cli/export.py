"""Export a trained run as one full Hugging Face model folder for serving: the LoRA/QLoRA adapter merged into its base.

    trl-grpo-ext export RUN_DIR OUT_DIR [--dtype {auto,bfloat16,float16,float32}] [--base-model PATH] [--force]
    export_merged("outputs/gsm8k-8gb", "exports/gsm8k-8gb")  # the same from Python; returns the output folder

The output holds `config.json`, `model.safetensors` (sharded past transformers' `max_shard_size`), the tokenizer
with its chat template and `generation_config.json`: `vllm serve OUT_DIR` serves it, and llama.cpp's
`convert_hf_to_gguf.py OUT_DIR` converts it. It has no LoRA modules and no `adapter_config.json`.

What is exported (`find_export_source`): RUN_DIR itself when it holds an adapter (`adapter_config.json`: the recipe's
final `save_model`) or a full model (`config.json` and weights: a run with LoRA off, exported as is); else its newest
complete `checkpoint-N` folder holding one (checkpoints whose save did not finish are skipped, see
`trl_grpo_ext.resume.checkpoint_problem`). RUN_DIR may also be a checkpoint folder.

The merge: the base named by `adapter_config.json`'s `base_model_name_or_path` (or `base_model=`) is loaded on the
CPU in float32, the adapter applied with PEFT and folded in with `merge_and_unload`, W' = W + s B A for every
adapted (out, in) weight W, B (out, r), A (r, in), s = alpha / r (LoRA, arXiv:2106.09685, eq. 3 and section 4.1;
alpha / sqrt(r) with rsLoRA), and the result cast to the output dtype: one rounding of W + s B A. Where a LoRA adapts
the input embeddings or the output layer of a base that ties the two, they are untied first
(`untie_adapted_embeddings`): the merge then changes only the adapted one, as in training, and the export is saved
untied (`tie_word_embeddings=false`, both weights written). The merged model's logits on a 16-token probe are checked
against the adapter model's (within `MERGE_TOLERANCE` of their largest value) before anything is written: a merge
that does not compute what the adapter model did is refused with a ValueError. This needs about
4 bytes of RAM per parameter (about 6 GiB for a 1.5B model) and no GPU. A QLoRA adapter (trained on a 4-bit NF4
base, arXiv:2305.14314) is merged the same way, into the original full-precision weights, never into 4-bit ones:
4-bit weights cannot hold W + s B A, and the output is for serving in 16 bits. The merged model then differs from
the 4-bit model the adapter was trained with by the base's quantization error W - dequant(quant(W)) only, about as
much as the 16-bit base differs from its 4-bit version. A base stored 4-bit (`quantization_config` in its
`config.json`) is refused: pass the full-precision original with `base_model=`.

dtype: "auto" is the base's stored dtype when it is bfloat16 or float16 (the dtype it was published and trained in;
Qwen2.5 is bfloat16), else bfloat16, the usual serving dtype. It does not depend on the exporting machine (the
output is served elsewhere); on a GPU without bfloat16 (compute capability < 8.0, e.g. T4, V100) export
`dtype="float16"` or serve with `vllm serve --dtype half`. "float32" keeps the merge exact (for checks).

Errors: `FileNotFoundError` for a missing RUN_DIR or base folder, `ValueError` for a folder with no adapter and no
model, a base that cannot be loaded (a Hub id not cached while offline), a 4-bit base, or a non-empty OUT_DIR
without `force=True`; each message is one line naming the path and the fix. `cli` prints that line and returns 1.
"""

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..resume import checkpoint_problem
from .errors import looks_like_local_path, run

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
ADAPTER_CONFIG = "adapter_config.json"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# Files a previous export (or a copied adapter) may have left in OUT_DIR that a loader would pick up; `force` removes
# them so that old shards do not mix with new ones and transformers does not load the folder as an adapter.
STALE_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", ADAPTER_CONFIG)


@dataclass
class ExportSource:
    """What `find_export_source` chose: `path` holds an adapter (`kind="adapter"`) or a full model (`kind="model"`);
    `why` says why it was chosen; `skipped` lists `(checkpoint folder, reason)` of newer checkpoints passed over."""

    path: Path
    kind: str
    why: str
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def _kind(folder: Path) -> str | None:
    if (folder / ADAPTER_CONFIG).is_file():
        return "adapter"
    if (folder / "config.json").is_file() and any((folder / name).is_file() for name in WEIGHT_FILES):
        return "model"
    return None


def find_export_source(run_dir: str | Path) -> ExportSource:
    """The adapter or full model to export from `run_dir`: the folder itself if it holds one, else its newest
    complete `checkpoint-N` (by N) that does.

    Raises:
        FileNotFoundError: `run_dir` is not a folder.
        ValueError: neither `run_dir` nor any complete checkpoint in it holds an adapter or a model.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such folder; pass the recipe's output_dir or a checkpoint-N folder")
    kind = _kind(run_dir)
    if kind is not None:
        return ExportSource(run_dir, kind, f"the {kind} in {run_dir}")
    steps = []
    for child in run_dir.iterdir():
        prefix, _, step = child.name.rpartition("-")
        if prefix == PREFIX_CHECKPOINT_DIR and step.isdigit() and child.is_dir() and _kind(child) is not None:
            steps.append((int(step), child))
    skipped = []
    for _, path in sorted(steps, reverse=True):
        problem = checkpoint_problem(str(path))
        if problem is None:
            kind = _kind(path)
            return ExportSource(path, kind, f"the {kind} in {path}, the newest complete checkpoint", skipped)
        skipped.append((path, problem))
    reasons = "; ".join(f"{path.name}: {reason}" for path, reason in skipped)
    raise ValueError(
        f"{run_dir} holds no adapter ({ADAPTER_CONFIG}) and no model (config.json + weights)"
        + (
            f", and no complete checkpoint-N folder with one ({reasons})"
            if skipped
            else ", nor a checkpoint-N with one"
        )
        + ": pass the recipe's output_dir or a checkpoint folder"
    )


def _load_config(name: str, origin: str, revision: str | None = None):
    """The `PretrainedConfig` of model `name` (a folder or a Hub id), or a one-line error naming the fix."""
    from transformers import AutoConfig

    fix = "check that path" if origin == "--base-model" else "pass --base-model PATH"
    if looks_like_local_path(name) and not Path(name).expanduser().is_dir():
        raise FileNotFoundError(f"model folder {name} ({origin}) does not exist: {fix}")
    try:
        config = AutoConfig.from_pretrained(name, revision=revision)
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"cannot load model {name!r} ({origin}): not a model folder and not in the Hugging Face cache "
            f"(offline?): {fix if origin == '--base-model' else 'pass --base-model PATH to a local copy'} ({first})"
        ) from error
    quantization = getattr(config, "quantization_config", None)
    if quantization is not None:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization.quant_method
        raise ValueError(
            f"model {name} ({origin}) is stored quantized ({method}); merging needs full-precision weights: pass "
            "--base-model with the original 16-bit model"
        )
    return config


def resolve_dtype(dtype: str, config) -> torch.dtype:
    """The output dtype: `dtype` by name, or for "auto" the model's stored dtype if 16-bit, else bfloat16."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: choose one of auto, {', '.join(DTYPES)}")
        return DTYPES[dtype]
    stored = getattr(config, "dtype", None)
    stored = DTYPES.get(stored, stored) if isinstance(stored, str) else stored
    return stored if stored in (torch.bfloat16, torch.float16) else torch.bfloat16


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _prepare_out_dir(out_dir: Path, force: bool, inputs: list[Path]) -> list[str]:
    """Check `out_dir` may be written; with `force`, remove stale weight/adapter files. Returns the removed names."""
    for path in inputs:
        if out_dir.resolve() == path.resolve():
            raise ValueError(f"OUT_DIR {out_dir} is the run, checkpoint or base folder: choose another OUT_DIR")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"OUT_DIR {out_dir} is a file: choose a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not force:
            raise ValueError(f"OUT_DIR {out_dir} is not empty: choose an empty or new folder, or pass --force")
        stale = sorted({p for pattern in STALE_PATTERNS for p in out_dir.glob(pattern) if p.is_file()})
        for path in stale:
            path.unlink()
        return [p.name for p in stale]
    return []


def untie_adapted_embeddings(peft_model) -> str | None:
    """Give the output layer its own copy of the weight it shares with the input embeddings (`tie_word_embeddings`,
    as Qwen2.5 0.5B-3B and the tiny model) when a LoRA layer adapts either, so that merging changes only the module
    the adapter adapted, as in training.

    A LoRA on `embed_tokens` adds s·BA to the input embeddings only, while the tied output layer goes on using W (and a
    LoRA on `lm_head` the other way round): merged into the one shared weight, it would change both, and the model,
    saved tied, would compute other logits (PEFT #2018, #2777). PEFT's `modules_to_save` and trainable tokens handle
    tied weights themselves and are left alone.

    Returns:
        The adapted module names (e.g. "model.embed_tokens") when it untied them (the config then says
        `tie_word_embeddings=False`), else None.
    """
    from peft.tuners.lora import LoraLayer

    model = peft_model.get_base_model()
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    base_of = lambda module: module.get_base_layer() if isinstance(module, LoraLayer) else module  # noqa: E731
    if outputs is None or base_of(outputs).weight is not base_of(inputs).weight:
        return None
    adapted = [name for name, module in model.named_modules() if module in (inputs, outputs)
               and isinstance(module, LoraLayer)]  # fmt: skip
    if not adapted:
        return None
    base_of(outputs).weight = torch.nn.Parameter(base_of(inputs).weight.detach().clone())
    model.config.tie_word_embeddings = False
    model.config.get_text_config().tie_word_embeddings = False
    return ", ".join(adapted)


# the merged model's logits on a probe must match the adapter model's within this, relative to their largest value
MERGE_TOLERANCE = 1e-3


def _probe_logits(model, vocab_size: int) -> torch.Tensor:
    """(1, 16, V) float32 logits of a fixed 16-token probe."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (1, 16), generator=generator)
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _first_with(folders: list[Path], filename: str) -> Path | None:
    return next((folder for folder in folders if (folder / filename).is_file()), None)


def export_merged(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    dtype: str = "auto",
    base_model: str | None = None,
    force: bool = False,
    verbose: bool = True,
) -> Path:
    """Merge the run's adapter into its base (or copy its full model) and save a serving-ready folder at `out_dir`.

    Args:
        run_dir: the recipe's `output_dir`, or one checkpoint folder (see the module docstring for the choice).
        out_dir: folder to write; created if missing, must be empty unless `force`.
        dtype: "auto", "bfloat16", "float16" or "float32": the dtype of the saved weights (merging is in float32).
        base_model: folder or Hub id of the base, instead of `adapter_config.json`'s `base_model_name_or_path`; for a
            full model, where to take the tokenizer from if the run has none.
        force: write into a non-empty `out_dir` (its old weight and adapter files are removed first).
        verbose: print what was chosen and written.

    Returns:
        `out_dir` as a `Path`.

    Raises:
        FileNotFoundError, ValueError: see the module docstring; one line each.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    say = print if verbose else (lambda *_: None)
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    source = find_export_source(run_dir)
    say(f"Exporting {source.why}")
    for path, reason in source.skipped:
        say(f"  skipped {path.name}: {reason}")
    # Where the tokenizer and generation config come from, first found: the chosen folder, the run folder, the base.
    folders = [source.path, run_dir] if source.path != run_dir else [source.path]

    if source.kind == "adapter":
        adapter_config = json.loads((source.path / ADAPTER_CONFIG).read_text())
        if not any((source.path / name).is_file() for name in ADAPTER_WEIGHT_FILES):
            raise FileNotFoundError(f"{source.path} has {ADAPTER_CONFIG} but no adapter_model.safetensors")
        name = base_model or adapter_config.get("base_model_name_or_path")
        origin = "--base-model" if base_model else f"base_model_name_or_path in {source.path / ADAPTER_CONFIG}"
        if not name:
            raise ValueError(f"{source.path / ADAPTER_CONFIG} names no base model: pass --base-model PATH")
        name = str(Path(name).expanduser()) if name.startswith("~") else name
        revision = None if base_model else adapter_config.get("revision")
        config = _load_config(name, origin, revision)
        out_dtype = resolve_dtype(dtype, config)
        _prepare_out_dir(out_dir, force, [source.path, run_dir, Path(name)])
        say(f"Base model: {name} ({origin})")
        say(
            f"Merging the {adapter_config.get('peft_type', 'LoRA')} adapter on the CPU into the base in float32 "
            "(full precision, never 4-bit: a QLoRA adapter trained on a 4-bit base is merged into the original "
            f"weights the same way); saving in {_dtype_name(out_dtype)}"
        )
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(name, revision=revision, dtype=torch.float32)
        adapter_model = PeftModel.from_pretrained(base, str(source.path)).eval()
        untied = untie_adapted_embeddings(adapter_model)
        if untied:
            say(f"The adapter adapts {untied}, which the base ties to its output layer: the export is saved untied "
                "(tie_word_embeddings=false, both weights written), as the adapter model computes")  # fmt: skip
        vocab_size = base.get_input_embeddings().weight.shape[0]
        expected = _probe_logits(adapter_model, vocab_size)
        model = adapter_model.merge_and_unload(safe_merge=True)
        error = (_probe_logits(model, vocab_size) - expected).abs().max().item()
        if not error <= MERGE_TOLERANCE * max(1.0, expected.abs().max().item()):
            raise ValueError(
                f"{source.path}: the merged model's logits differ from the adapter model's by up to {error:.3g} on a "
                "probe, so it is not exported; serve the adapter on its base instead (vllm serve BASE --enable-lora)"
            )
        tokenizer_source = _first_with(folders, "tokenizer_config.json") or name
    else:
        config = _load_config(str(source.path), f"the model in {source.path}")
        out_dtype = resolve_dtype(dtype, config)
        _prepare_out_dir(out_dir, force, [source.path, run_dir])
        tokenizer_source = _first_with(folders, "tokenizer_config.json") or base_model
        if tokenizer_source is None:
            raise ValueError(f"{source.path} holds no tokenizer: pass --base-model with the model it was trained from")
        say(f"No adapter (LoRA was off): copying the full model as is, in {_dtype_name(out_dtype)}")
        model = AutoModelForCausalLM.from_pretrained(str(source.path), dtype=out_dtype)

    generation_folder = _first_with(folders, "generation_config.json")
    if generation_folder is not None:  # else the base's, loaded with it
        model.generation_config = GenerationConfig.from_pretrained(generation_folder)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source))
    model = model.to(out_dtype)
    model.save_pretrained(out_dir)  # transformers 5 writes safetensors only
    tokenizer.save_pretrained(out_dir)
    template = "with its chat template" if tokenizer.chat_template else "WITHOUT a chat template"
    say(f"Wrote {out_dir}: the model in {_dtype_name(out_dtype)}, the tokenizer {template} from {tokenizer_source}")
    return out_dir


def cli(argv: list[str]) -> int:
    """`trl-grpo-ext export RUN_DIR OUT_DIR ...` as a command line: returns 0, or 1 after printing a user error as one
    line (`errors.run`: `--debug` shows its traceback)."""
    return run(command, argv, prog="trl-grpo-ext export")


def command(argv: list[str]) -> None:
    """`trl-grpo-ext export RUN_DIR OUT_DIR ...`; user errors (ValueError, FileNotFoundError) are raised."""
    parser = argparse.ArgumentParser(
        prog="trl-grpo-ext export",
        description="Merge a run's LoRA/QLoRA adapter into its base (in float32 on the CPU, never 4-bit) and save a "
        "full model with its tokenizer and chat template, ready for `vllm serve OUT_DIR` or llama.cpp's "
        "convert_hf_to_gguf.py. A run without an adapter (LoRA off) is copied as is.",
    )
    parser.add_argument(
        "run_dir", help="the recipe's output_dir (its final save, else its newest checkpoint-N) or a checkpoint folder"
    )
    parser.add_argument("out_dir", help="folder to write (must be empty unless --force)")
    parser.add_argument(
        "--dtype",
        choices=["auto", *DTYPES],
        default="auto",
        help="dtype of the saved weights; auto: the base's if bfloat16/float16, else bfloat16 (default auto)",
    )
    parser.add_argument(
        "--base-model",
        metavar="PATH",
        help="base model folder or Hub id, instead of the one adapter_config.json names",
    )
    parser.add_argument("--force", action="store_true", help="write into a non-empty OUT_DIR")
    args = parser.parse_args(argv)
    export_merged(args.run_dir, args.out_dir, dtype=args.dtype, base_model=args.base_model, force=args.force)


if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))

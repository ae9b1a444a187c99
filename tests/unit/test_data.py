"""GSM8K data loading: real rows, bad files named precisely, rows without `####` skipped, seeded problems."""

import json
import logging

import pytest

from trl_grpo_ext.gsm8k.data import (
    SYSTEM_PROMPT,
    DatasetFormatError,
    check_dataset_path,
    load_gsm8k,
    read_gsm8k_jsonl,
    synthetic_gsm8k,
    to_grpo_rows,
)
from trl_grpo_ext.gsm8k.rewards import gsm8k_accuracy


def test_real_gsm8k_rows(gsm8k_dir):
    train = load_gsm8k("train", gsm8k_dir, limit=16)
    test = load_gsm8k("test", gsm8k_dir)
    assert len(train) == 16 and len(test) == 1319
    row = train[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][0]["content"] == SYSTEM_PROMPT and "\\boxed{}" in SYSTEM_PROMPT
    first = json.loads((gsm8k_dir / "train.jsonl").read_text().splitlines()[0])
    assert row["prompt"][1]["content"] == first["question"]
    assert first["answer"].rstrip().endswith("#### " + row["answer"])
    assert all(a.lstrip("-").replace(".", "").isdigit() for a in test["answer"])


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], r"bad\.jsonl: file is empty"),
        (
            ['{"question": "q", "answer": "#### 1"}', '{"question": "q2"}'],
            r"bad\.jsonl:2: missing string field 'answer'",
        ),
        (['{"answer": "#### 1"}'], r"bad\.jsonl:1: missing string field 'question'"),
        (['{"question": "q", "answer": 5}'], r"bad\.jsonl:1: missing string field 'answer'"),
        (['{"question": "q", "answer": "#### 1"}', "{not json"], r"bad\.jsonl:2: not valid JSON"),
        (["[1, 2]"], r"bad\.jsonl:1: expected a JSON object, got list"),
        (['{"question": " ", "answer": "#### 1"}'], r"bad\.jsonl:1: field 'question' is empty"),
    ],
    ids=["empty", "no-answer", "no-question", "answer-not-str", "bad-json", "not-object", "blank-question"],
)
def test_bad_file_names_file_line_and_field(tmp_path, lines, message):
    with pytest.raises(DatasetFormatError, match=message):
        read_gsm8k_jsonl(_write(tmp_path / "bad.jsonl", lines))


def test_non_utf8_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"question": "q", "answer": "#### 1"}\n{"question": "caf\xe9", "answer": "#### 2"}\n')
    with pytest.raises(DatasetFormatError, match=r"bad\.jsonl:2: not UTF-8 text \(byte 17 of the line\)"):
        read_gsm8k_jsonl(path)


def test_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"question": "q", "answer": "#### 1"}\n')
    assert read_gsm8k_jsonl(path)[0]["question"] == "q"


def test_missing_folder_and_file_are_named(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"dataset_path='.*nowhere': no such folder"):
        check_dataset_path(tmp_path / "nowhere")
    (tmp_path / "d").mkdir()
    _write(tmp_path / "d" / "train.jsonl", ['{"question": "q", "answer": "#### 1"}'])
    with pytest.raises(DatasetFormatError, match=r"test\.jsonl: file not found"):
        check_dataset_path(tmp_path / "d")


def test_row_without_gold_line_is_reported_and_skipped(tmp_path, caplog):
    (tmp_path / "d").mkdir()
    _write(
        tmp_path / "d" / "train.jsonl",
        ['{"question": "a", "answer": "2+2=4\\n#### 4"}', '{"question": "b", "answer": "no marker"}',
         '{"question": "c", "answer": "#### 1,000"}', '{"question": "d", "answer": "#### two"}'],
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.gsm8k.data"):
        dataset = load_gsm8k("train", tmp_path / "d")
    assert dataset["answer"] == ["4", "1000"]
    assert "line 2: answer has no '#### N' line; row skipped" in caplog.text
    assert "line 4: '#### two' is not a number; row skipped" in caplog.text


def test_no_usable_row_is_an_error(tmp_path):
    (tmp_path / "d").mkdir()
    _write(tmp_path / "d" / "train.jsonl", ['{"question": "a", "answer": "no marker"}'])
    with pytest.raises(DatasetFormatError, match=r"train\.jsonl: no usable row"):
        load_gsm8k("train", tmp_path / "d")


def test_synthetic_problems_are_seeded_and_correct():
    rows = synthetic_gsm8k(50, seed=5)
    assert rows == synthetic_gsm8k(50, seed=5) and rows != synthetic_gsm8k(50, seed=6)
    grpo = to_grpo_rows(rows)
    assert len(grpo) == 50
    # The worked solution's last equation gives the gold answer: the generator's arithmetic is right.
    for row, grpo_row in zip(rows, grpo, strict=True):
        last_equation = row["answer"].splitlines()[-2]
        assert str(eval(last_equation.split("=")[0])) == grpo_row["answer"]  # e.g. "7 + 5" -> "12"
    assert gsm8k_accuracy([f"\\boxed{{{r['answer']}}}" for r in grpo], [r["answer"] for r in grpo]) == [1.0] * 50

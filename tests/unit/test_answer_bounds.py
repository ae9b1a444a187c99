r"""Answers that are not the answer (a relation, a negation, a set, a hedge: Math-Verify #14) and answer checks in
bounded time on any thread (Math-Verify #50/#55, TRL PR #5281, verl PR #5839): issue #32, items 1 and 2."""

import logging
import threading
import time

import pytest

from trl_grpo_ext.gsm8k import bounded
from trl_grpo_ext.gsm8k.rewards import (
    answer_is_correct,
    extract_final_answer,
    gsm8k_accuracy,
    gsm8k_strict_accuracy,
    not_a_number,
    same_answer,
)

R = "First 48 / 2 = 24, then 48 - 6 = 42 in all.\n"

# boxed answers holding 42 that do not say the answer is 42
NOT_THE_NUMBER = [
    r"x \neq 42", r"x \ne 42", r"x\neq42", r"x \not= 42", r"42 < x", r"x > 42", r"x \lt 42", r"x \gt 42",
    r"x \le 42", r"x \leq 42", r"x \geq 42", r"x \geqslant 42", r"42 \leq x \leq 50", r"x \approx 42",
    r"\approx 42", r"\sim 42", r"x \equiv 42", r"x \in \{42\}", r"\{42\}", r"\left\{ 42 \right\}", r"\pm 42",
    r"\neg 42", r"\lnot 42", "x \u2260 42", "x \u2264 42", "\u2248 42", "x != 42", r"\text{not } 42",
    r"\text{not }42", r"\text{Not } 42", r"\text{no more than } 42", r"\text{at least } 42", r"\text{at most } 42",
    r"\text{about } 42", r"\text{approximately } 42", r"\text{more than } 42", r"\text{over } 42",
    r"42 \text{ or more}", r"42 \text{ or } 43", r"42 \text{ or fewer}", r"\text{either } 42",
    r"\text{not } 42 \text{ but } 43", r"x \neq 42 \text{ dollars}",
]  # fmt: skip
# boxed answers that do say 42
THE_NUMBER = [
    r"42", r"x = 42", r"n = 42", r"x=42", r"42 = x", r"\text{Total} = 42", r"\text{x = 42}", r"42 \text{ dollars}",
    r"\$42", r"42\%", r"42 \text{ more than Tom}", r"42 \text{ apples}", r"42.0",
]  # fmt: skip


@pytest.mark.parametrize("answer", NOT_THE_NUMBER)
def test_a_boxed_relation_negation_set_or_hedge_is_not_the_number(answer):
    completion = R + rf"\boxed{{{answer}}}"
    assert not_a_number(answer)
    assert gsm8k_accuracy([completion], ["42"]) == [0.0]
    assert gsm8k_strict_accuracy([completion], ["42"]) == [0.0]
    assert not answer_is_correct(answer, "42") and not same_answer(answer, "42")


@pytest.mark.parametrize("answer", THE_NUMBER)
def test_an_equation_naming_the_value_or_a_unit_is_the_number(answer):
    completion = R + rf"\boxed{{{answer}}}"
    assert not not_a_number(answer)
    assert gsm8k_accuracy([completion], ["42"]) == [1.0]
    assert gsm8k_strict_accuracy([completion], ["42"]) == [1.0]
    assert gsm8k_accuracy([completion], ["43"]) == [0.0]


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (r"The answer is $x \neq 42$", None),
        ("so 42 < x.", None),
        (r"so $42 \leq x$", None),
        ("The answer is not 42.", None),
        ("It is at least 42", None),
        ("He needs 42 or more", None),
        ("It holds about 42", None),
        ("x \u2260 42", None),
        ("So the total is 42.", "42"),  # the relatives that stay answers
        ("We have y = 42 > x", "42"),  # an equation names the value
        ("It is not 40, it is 42.", "42"),
        ("He has 42 more than Tom", "42"),
    ],
)
def test_running_text_relation_or_hedge_is_not_the_answer(text, answer):
    assert extract_final_answer(text) == answer
    assert gsm8k_accuracy([text], ["42"]) == [float(answer == "42")]


# answers sympy can spend minutes on, each on the main thread and on another one
SLOW = [
    r"\boxed{\binom{10000000}{5000000}}",  # the example
    r"\boxed{\dbinom{1000000}{500000}}",  # 189 s on its own
    r"\boxed{{10000000 \choose 5000000}}",
    r"\boxed{\frac{\binom{10000000}{5000000}}{3}}",
    r"\boxed{\sqrt{\binom{1000000}{500000}}}",
]


def _score_on(where: str, completions: list, gold: list) -> tuple[list | None, float]:
    """gsm8k_accuracy on the main thread or on a new one: (rewards, or None if it did not return in 30 s; seconds)."""
    results = []
    start = time.perf_counter()
    if where == "main":
        results.append(gsm8k_accuracy(completions, gold))
    else:
        thread = threading.Thread(target=lambda: results.append(gsm8k_accuracy(completions, gold)), daemon=True)
        thread.start()
        thread.join(timeout=30)
    return (results[0] if results else None), time.perf_counter() - start


@pytest.mark.parametrize("where", ["main", "thread"])
@pytest.mark.parametrize("completion", SLOW)
def test_a_slow_answer_is_given_up_within_the_bound_on_any_thread(completion, where, monkeypatch, caplog):
    monkeypatch.setattr(bounded, "ANSWER_TIMEOUT_S", 1.0)
    completions = [R + completion, R + r"\boxed{42}", R + r"\boxed{41}"]
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.gsm8k.rewards"):
        rewards, seconds = _score_on(where, completions, ["42"] * 3)
    # the slow answer counts as wrong; the worker restarted after it still scores the answers after it
    assert rewards == [0.0, 1.0, 0.0]
    # 1 s given to the slow answer, a worker restart off the main thread (~1 s), the other two in milliseconds
    assert seconds < 8.0
    assert [r.getMessage() for r in caplog.records] == [
        "gsm8k_accuracy: gave up on 1 of 3 answers (checking each took over 1 s); they count as wrong"
    ]


def test_every_answer_slow_is_bounded_by_their_number(monkeypatch, caplog):
    monkeypatch.setattr(bounded, "ANSWER_TIMEOUT_S", 0.5)
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.gsm8k.rewards"):
        rewards, seconds = _score_on("thread", [R + SLOW[0]] * 3, ["42"] * 3)
    assert rewards == [0.0, 0.0, 0.0] and seconds < 3 * (0.5 + 3.0)
    assert "gave up on 3 of 3 answers" in caplog.text


@pytest.mark.parametrize("where", ["main", "thread"])
def test_the_public_checks_are_bounded_too(where, monkeypatch):
    monkeypatch.setattr(bounded, "ANSWER_TIMEOUT_S", 1.0)
    results = {}

    def work():
        results["correct"] = answer_is_correct(r"\binom{10000000}{5000000}", "42")
        results["same"] = same_answer(r"\binom{10000000}{5000000}", "42")
        results["extracted"] = extract_final_answer(R + r"\boxed{42}")
        results["right"] = answer_is_correct("42", "42")

    start = time.perf_counter()
    if where == "main":
        work()
    else:
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        thread.join(timeout=30)
    assert results == {"correct": False, "same": False, "extracted": "42", "right": True}
    assert time.perf_counter() - start < 10.0


def test_a_fast_batch_off_the_main_thread_agrees_with_the_main_thread():
    completions = [R + rf"\boxed{{{a}}}" for a in (*NOT_THE_NUMBER[:10], *THE_NUMBER)] + ["She pays $42.00."]
    gold = ["42"] * len(completions)
    on_main, _ = _score_on("main", completions, gold)
    on_thread, _ = _score_on("thread", completions, gold)
    assert on_thread == on_main == [0.0] * 10 + [1.0] * (len(THE_NUMBER) + 1)

r"""Reward table for `trl_grpo_ext.gsm8k.rewards`: literal completions with the expected (lenient accuracy, strict
accuracy, format) rewards, each run as a plain string and as a conversational completion."""

import json
import threading
import time

import pytest

from trl_grpo_ext.gsm8k.data import gold_answer_from_solution
from trl_grpo_ext.gsm8k.rewards import (
    REWARD_FUNCS,
    answer_is_correct,
    extract_final_answer,
    gsm8k_accuracy,
    gsm8k_format,
    gsm8k_strict_accuracy,
    same_answer,
)

# 30 non-whitespace characters of reasoning: enough for gsm8k_format's 20-character minimum.
R = "First 48 / 2 = 24, then 48 + 24 = 72 in all.\n"

# (id, completion, gold, lenient accuracy, strict accuracy, format)
TABLE = [
    ("right_boxed", R + r"The answer is $\boxed{72}$.", "72", 1, 1, 1),
    ("wrong_boxed", R + r"\boxed{71}", "72", 0, 0, 1),
    ("thousands_comma", R + r"\boxed{1,234}", "1234", 1, 1, 1),
    ("thousands_comma_millions", R + r"\boxed{12,345,678}", "12345678", 1, 1, 1),
    ("thousands_thin_space", R + r"\boxed{1\,234}", "1234", 1, 1, 1),  # math-verify alone reads 235
    ("thousands_space", R + r"\boxed{1 234}", "1234", 1, 1, 1),  # math-verify alone reads 235
    ("dollar_in_box", R + r"$\boxed{\$18.00}$", "18", 1, 1, 1),
    ("dollar_plain_text", "She pays $18.00 in total.", "18", 1, 0, 0),
    ("dollars_word_plain_text", "So she earns 18 dollars.", "18", 1, 0, 0),
    ("dollars_word_in_box", R + r"\boxed{18 dollars}", "18", 1, 1, 1),  # LaTeX alone: 18*d*o*l*l*a*r*s
    ("text_unit_in_box", R + r"\boxed{18 \text{ dollars}}", "18", 1, 1, 1),
    ("percent_in_box", R + r"\boxed{50\%}", "50", 1, 1, 1),  # verify accepts 50% as 50 or as 0.5
    ("trailing_dot_in_box", R + r"\boxed{72.}", "72", 1, 1, 1),
    ("negative_boxed", R + r"\boxed{-3}", "-3", 1, 1, 1),
    ("negative_plain_text", "The temperature ends at -3", "-3", 1, 0, 0),
    ("wrong_sign", R + r"\boxed{3}", "-3", 0, 0, 1),
    ("slash_fraction_vs_decimal", R + r"\boxed{1/2}", "0.5", 1, 1, 1),
    ("latex_fraction_vs_decimal", R + r"\boxed{\frac{1}{2}}", "0.5", 1, 1, 1),
    ("trailing_zero_decimal", R + r"\boxed{0.50}", "0.5", 1, 1, 1),
    ("two_boxed_last_right", R + r"\boxed{5} Wait, 3 more: \boxed{8}", "8", 1, 1, 0),
    ("two_boxed_first_right", R + r"\boxed{5} Wait, 3 more: \boxed{8}", "5", 0, 0, 0),
    ("nested_boxed", R + r"\boxed{\boxed{72}}", "72", 1, 1, 0),
    ("display_math_box", R + r"\[\boxed{72}\]", "72", 1, 1, 1),
    ("no_reasoning", r"\boxed{72}", "72", 1, 1, 0),
    ("reasoning_after_box", R + r"\boxed{72} and now let me explain it all again, step by step.", "72", 1, 1, 0),
    ("final_answer_phrase_beats_last_number", "The final answer is 72. Note 3 apples are left.", "72", 1, 0, 0),
    ("last_number_wrong", "3 + 4 = 7, so 8 remain", "7", 0, 0, 0),
    ("no_answer", "I do not know how to solve this.", "7", 0, 0, 0),
    ("boxed_without_brace", R + r"\boxed 72", "72", 1, 0, 0),
    ("empty_box", R + r"\boxed{}", "0", 0, 0, 0),  # an empty box is a (wrong) answer: no fallback to 72
    ("whitespace_box", R + r"\boxed{   }", "72", 0, 0, 0),
    ("unclosed_box", R + r"\boxed{18", "18", 0, 0, 0),  # no complete box; last number "72" is wrong
    ("unclosed_inner_brace", R + r"\boxed{\frac{1}{2}", "0.5", 0, 0, 0),
    ("stray_braces", "}}}{{{ \\boxed}{ {", "1", 0, 0, 0),
    ("word_in_box", R + r"\boxed{\text{seventy-two}}", "72", 0, 0, 1),
    ("empty", "", "1", 0, 0, 0),
    ("whitespace", "  \n\t ", "1", 0, 0, 0),
    ("garbage_text", "asdf qwer zxcv", "1", 0, 0, 0),
    ("garbage_control_chars", "\x00\xff\xfe\ud7ff\x1b[31m", "1", 0, 0, 0),
    ("none", None, "1", 0, 0, 0),
    ("bytes", b"\x00\xff\\boxed{1}", "1", 0, 0, 0),
    ("unparseable_gold", R + r"\boxed{72}", "seventy-two", 0, 0, 1),
]


def _conversational(completion):
    return [{"role": "assistant", "content": completion}]


@pytest.mark.parametrize("form", ["string", "conversational"])
@pytest.mark.parametrize(
    ("completion", "gold", "lenient", "strict", "fmt"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_reward_table(completion, gold, lenient, strict, fmt, form):
    completions = [completion if form == "string" else _conversational(completion)]
    assert gsm8k_accuracy(completions, [gold]) == [float(lenient)]
    assert gsm8k_strict_accuracy(completions, [gold]) == [float(strict)]
    assert gsm8k_format(completions) == [float(fmt)]


def test_batch_keeps_order_and_length():
    rows = TABLE[:6]
    completions = [row[1] for row in rows]
    answers = [row[2] for row in rows]
    assert gsm8k_accuracy(completions, answers) == [float(row[3]) for row in rows]
    assert gsm8k_format(completions, answer=answers, prompts=["p"] * len(rows)) == [float(row[5]) for row in rows]


@pytest.mark.parametrize(
    "completion",
    [
        [],  # no message
        [{"role": "assistant"}],  # no "content"
        [{"role": "assistant", "content": None}],
        [{"role": "assistant", "content": 72}],
        ["72"],  # a list of strings is not a message list
        [None],
    ],
)
def test_malformed_conversational_scores_zero(completion):
    assert gsm8k_accuracy([completion], ["72"]) == [0.0]
    assert gsm8k_strict_accuracy([completion], ["72"]) == [0.0]
    assert gsm8k_format([completion]) == [0.0]


def test_conversational_reads_last_message_and_text_parts():
    last = [{"role": "assistant", "content": "\\boxed{1}"}, {"role": "assistant", "content": R + "\\boxed{72}"}]
    parts = [{"role": "assistant", "content": [{"type": "text", "text": R}, {"type": "text", "text": "\\boxed{72}"}]}]
    assert gsm8k_accuracy([last, parts], ["72", "72"]) == [1.0, 1.0]
    assert gsm8k_format([last, parts]) == [1.0, 1.0]


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match=r"completions \(2\) and answer \(1\)"):
        gsm8k_accuracy(["1", "2"], ["1"])


@pytest.mark.parametrize(
    "completion",
    [
        R * 23_000 + "\\boxed{72}",  # ~1 MB of reasoning, answer at the end
        "{" * 1_000_000,
        "\\boxed{" + "{" * 1_000_000,
        "\\boxed{72}" * 100_000,  # 1 MB of boxes
        "1 + " * 250_000,
    ],
    ids=["long_reasoning", "open_braces", "unclosed_box", "many_boxes", "long_expression"],
)
def test_one_megabyte_completion_is_fast(completion):
    # Loose bound: a regression to parsing the whole text takes seconds to minutes, not tens of milliseconds.
    start = time.perf_counter()
    lenient = gsm8k_accuracy([completion], ["72"])
    strict = gsm8k_strict_accuracy([completion], ["72"])
    fmt = gsm8k_format([completion])
    assert time.perf_counter() - start < 5.0
    is_long_reasoning = completion.startswith(R)
    assert fmt == [float(is_long_reasoning)]
    assert strict == [float(is_long_reasoning or completion.startswith("\\boxed{72}"))]
    assert lenient == strict


def test_non_main_thread():
    # math-verify's signal.alarm timeouts raise outside the main thread unless disabled; a failure would show as 0.0.
    results = {}

    def work():
        completions = [R + r"\boxed{1,234}", R + r"\boxed{1/2}", "She pays $18.00.", R + r"\boxed{5}"]
        results["accuracy"] = gsm8k_accuracy(completions, ["1234", "0.5", "18", "6"])
        results["format"] = gsm8k_format(completions)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert results == {"accuracy": [1.0, 1.0, 1.0, 0.0], "format": [1.0, 1.0, 0.0, 1.0]}


def test_unbounded_answers_return_quickly_outside_the_main_thread():
    """Without math-verify's timeouts (non-main thread) sympy could spend forever on "9!!!" or a power tower."""
    results = {}

    def work():
        completions = [R + r"\boxed{9!!!}", "it is 9^9^9^9", R + r"\boxed{9^{9^{9}}}", "The answer is 72!"]
        results["accuracy"] = gsm8k_accuracy(completions, ["1", "1", "1", "72"])

    start = time.perf_counter()
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert results == {"accuracy": [0.0, 0.0, 0.0, 1.0]} and time.perf_counter() - start < 10


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        (R + "\\boxed{７２}", "72"),  # fullwidth digits
        (R + "\\boxed{٧٢}", "72"),  # Arabic-Indic digits
        (R + "\\boxed{1\u00a0234}", "1234"),  # no-break space as thousands separator
        (R + "\\boxed{1\u202f234}", "1234"),  # narrow no-break space
        (R + "\\boxed {72}", "72"),  # a space before the brace, as LaTeX allows
    ],
)
def test_unicode_digits_separators_and_spacing(completion, gold):
    assert gsm8k_accuracy([completion], [gold]) == [1.0]
    assert gsm8k_strict_accuracy([completion], [gold]) == [1.0]
    assert gsm8k_format([completion]) == [1.0]


def test_same_answer():
    assert same_answer("\\frac{1}{2}", "0.5") and same_answer("\\$18", "18.00") and same_answer("1\\,234", "1234")
    assert not same_answer("3", "4") and not same_answer(None, "1") and not same_answer("x", "x")


def test_missing_answer_column_is_a_clear_error():
    with pytest.raises(ValueError, match="needs an 'answer' column"):
        gsm8k_accuracy(["\\boxed{1}"], None)


@pytest.mark.parametrize(
    ("text", "strict", "expected"),
    [
        (R + r"\boxed{1,234}", True, "1,234"),
        (R + r"\boxed{5} then \boxed{ 8 }", True, "8"),
        (R + r"\boxed{5} then \boxed{8", True, "5"),  # an unclosed box is skipped
        ("She pays $18.00.", True, None),
        ("She pays $18.00.", False, "18.00"),
        ("She has 1,234 apples.", False, "1234"),
        (R + r"\boxed{}", False, ""),
        ("no numbers here", False, None),
        (None, False, None),
    ],
)
def test_extract_final_answer(text, strict, expected):
    assert extract_final_answer(text, strict=strict) == expected


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [("1/2", "0.5", True), ("0.5", "1/2", True), ("18.00", "$18", True), ("1,234", "1,234", True), ("7", "8", False)]
    + [(None, "1", False), ("1", None, False), ("1", "", False)],
)
def test_answer_is_correct(prediction, gold, expected):
    assert answer_is_correct(prediction, gold) is expected


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("3 * 4 = <<3*4=12>>12\n#### 12", "12"),
        ("It costs 1,000 + 234.\n#### 1,234", "1234"),
        ("#### $18", "18"),
        ("He owes 10 - 13.\n####  -3 ", "-3"),
        ("#### 0.5", "0.5"),
        ("#### 1\n#### 2", "2"),  # the last #### line
        ("The answer is 12.", None),
        ("#### ", None),
        ("", None),
        (None, None),
    ],
)
def test_gold_answer_from_solution(solution, expected):
    assert gold_answer_from_solution(solution) == expected


def test_registry():
    assert REWARD_FUNCS == {
        "gsm8k_accuracy": gsm8k_accuracy,
        "gsm8k_strict_accuracy": gsm8k_strict_accuracy,
        "gsm8k_format": gsm8k_format,
    }
    assert all(func.__name__ == name for name, func in REWARD_FUNCS.items())  # TRL logs rewards/<__name__>/mean


def test_real_gsm8k_gold_answers_score_one(gsm8k_dir):
    with (gsm8k_dir / "train.jsonl").open() as f:
        rows = [json.loads(line) for line, _ in zip(f, range(200), strict=False)]
    golds = [gold_answer_from_solution(row["answer"]) for row in rows]
    assert len(golds) == 200 and None not in golds
    [float(gold) for gold in golds]  # every gold is a plain number
    assert any(int(gold) >= 1000 for gold in golds)  # the slice covers thousands (written "1,080" in the data)
    boxed = [f"... \\boxed{{{gold}}}" for gold in golds]
    assert gsm8k_accuracy(boxed, golds) == [1.0] * 200
    assert gsm8k_strict_accuracy(boxed, golds) == [1.0] * 200
    with_commas = [f"... \\boxed{{{int(gold):,}}}" for gold in golds]
    assert gsm8k_accuracy(with_commas, golds) == [1.0] * 200
    off_by_one = [f"... \\boxed{{{int(gold) + 1}}}" for gold in golds]
    assert gsm8k_accuracy(off_by_one, golds) == [0.0] * 200


# Lenient extraction from running text (issue #13): a number touching LaTeX or Markdown, or written with LaTeX
# thousands separators, is read whole. Every text starts with the distractor "5", the number taken before the fix in
# most rows, so each row checks both the right answer (1.0) and that the distractor is not taken (0.0 for gold "5").
# (id, answer text after "We have 5 apples, so the total is ", gold, extracted answer)
LENIENT = "We have 5 apples, so the total is "
RUNNING_TEXT = [
    # math delimiters touching the number
    ("display_dollars", "$$42$$", "42", "42"),  # was "5"
    ("display_dollars_spaced", "$$ 42 $$", "42", "42"),
    ("inline_paren", r"\(42\)", "42", "42"),  # was "5"
    ("display_bracket", r"\[42\]", "42", "42"),  # was "5"
    ("inline_dollars", "$42$", "42", "42"),
    # formatting commands and braces
    ("fbox", r"\fbox{42}", "42", "42"),  # was "5" (None without the distractor)
    ("textbf", r"\textbf{42}", "42", "42"),  # was "5"
    ("mathbf", r"\mathbf{42}", "42", "42"),  # was "5"
    ("text", r"\text{42}", "42", "42"),  # was "5"
    ("mathrm", r"\mathrm{42}", "42", "42"),  # was "5"
    ("bare_braces", "{42}", "42", "42"),  # was "5"
    ("mathbf_in_inline_paren", r"\(\mathbf{42}\)", "42", "42"),  # was "5"
    ("escaped_dollar_in_textbf", r"\textbf{\$42}", "42", "42"),  # was "5"
    # Markdown emphasis and code
    ("md_bold", "**42**", "42", "42"),  # was "42**"
    ("md_italic_star", "*42*", "42", "42"),  # was "5"
    ("md_bold_underscore", "__42__", "42", "42"),  # was "5"
    ("md_italic_underscore", "_42_", "42", "42"),  # was "5"
    ("md_code", "`42`", "42", "42"),  # was "5"
    ("md_bold_escaped_dollar", r"**\$42**", "42", "42"),  # was "5"
    ("md_bold_dollar", "**$42**", "42", "42"),
    # HTML emphasis and invisible characters
    ("html_bold", "<b>42</b>", "42", "42"),  # was "5"
    ("html_strong", "<strong>42</strong>", "42", "42"),  # was "5"
    ("html_line_break", "42<br/>", "42", "42"),
    ("zero_width_space", "\u200b42", "42", "42"),  # was "5"
    ("byte_order_mark", "\ufeff42", "42", "42"),  # was "5"
    ("left_to_right_mark_inside", "4\u200e2", "42", "42"),  # was "4"
    ("bidi_embedding", "\u202a42\u202c", "42", "42"),  # was "5"
    ("span_with_attribute", '<span class="x">42</span>', "42", "42"),  # was "5"
    ("inequalities_are_not_tags", "x<y and y = 42 > x", "42", "42"),
    # escaped currency, percent and LaTeX spacing
    ("escaped_dollar", r"\$42", "42", "42"),  # was "5"
    ("escaped_dollar_full_stop", r"\$42.", "42", "42"),  # was "5"
    ("escaped_percent", r"42\%", "42", "42"),
    ("thin_space_before", r"\,42", "42", "42"),  # was "5"
    ("negative_thin_space_around", r"\!42\!", "42", "42"),
    ("full_stop", "42.", "42", "42"),
    # punctuation touching the number's start
    ("parentheses", "(42)", "42", "42"),  # was "5"
    ("brackets", "[42]", "42", "42"),  # was "5"
    ("colon", "total:42", "42", "42"),  # was "5"
    ("answer_colon", "answer:42", "42", "42"),  # was "5"
    ("curly_quotes", "\u201c42\u201d", "42", "42"),  # was "5"
    ("hash", "#42", "42", "42"),  # was "5"
    # numeric fractions, read as a/b
    ("dfrac", r"\dfrac{1}{2}", "0.5", "1/2"),  # was "5"
    ("dfrac_inline_dollars", r"$\dfrac{1}{2}$", "0.5", "1/2"),  # was "5"
    ("frac", r"\frac{1}{2}", "0.5", "1/2"),  # was "5"
    ("frac_short", r"$\frac12$", "0.5", "1/2"),  # was "5"
    ("tfrac", r"\tfrac{1}{2}", "0.5", "1/2"),  # was "5"
    ("negative_frac", r"$-\frac{1}{2}$", "-0.5", "-1/2"),  # was "5"
    ("negative_denominator", r"\frac{1}{-2}", "-0.5", "-1/2"),  # was "1  -2"
    ("mixed_number", r"2\frac{1}{2}", "2.5", "5/2"),  # was "21/2"
    ("mixed_number_spaced", r"2 \frac{1}{2}", "2.5", "5/2"),  # was "2 1/2"
    ("mixed_number_short_inline", r"$2\tfrac12$", "2.5", "5/2"),  # was "21/2"
    ("negative_mixed_number", r"$-1\frac{3}{4}$", "-1.75", "-7/4"),  # was "-13/4"
    ("mixed_number_tie", r"$2~\frac{1}{2}$", "2.5", "5/2"),  # was "2 1/2"
    ("mixed_number_thin_space", r"$2\,\frac{1}{2}$", "2.5", "5/2"),  # was "2 1/2"
    ("negative_mixed_number_spaced_sign", r"$- 2\frac{1}{2}$", "-2.5", "-5/2"),  # was "21/2"
    # signs
    ("negative", "-42", "-42", "-42"),
    ("negative_inline_dollars", "$-42$", "-42", "-42"),
    ("negative_inline_paren", r"\(-42\)", "-42", "-42"),  # was "5"
    ("unicode_minus", "\u221242", "-42", "-42"),  # was "5"
    ("sign_in_own_math", "$-$42", "-42", "-42"),  # was "42"
    ("sign_before_math", "-$42$", "-42", "-42"),  # was "42"
    ("unicode_minus_before_math", "\u2212$42$", "-42", "-42"),  # was "42"
    ("sign_in_text_command", r"\text{-}42", "-42", "-42"),  # was "42"
    ("sign_in_mathrm", r"\mathrm{-}42", "-42", "-42"),  # was "42"
    ("binary_minus_stays", "46 -$4$", "42", "46 - 4"),
    ("sign_before_escaped_dollar", r"-\$5", "-5", "-5"),  # was "5"
    ("sign_before_md_bold", "-**42**", "-42", "-42"),  # was "42"
    ("sign_in_html_bold", "<b>-</b>42", "-42", "-42"),  # was "5"
    ("sign_opening_math_spaced", "$- 42$", "-42", "-42"),  # was "42"
    ("sign_before_left_paren", r"-\left(42\right)", "-42", "-42"),  # was "42"
    ("en_dash_sign", "\u201342", "-42", "-42"),  # was "5"
    ("fullwidth_minus", "\uff0d42", "-42", "-42"),  # was "5"
    ("html_entity_minus", "&minus;42", "-42", "-42"),  # was "42"
    # LaTeX operators
    ("times", r"3 \times 14", "42", "3 * 14"),  # was "14"
    ("cdot", r"$3 \cdot 14$", "42", "3 * 14"),  # was "14"
    # a boxed answer inside math delimiters still wins
    ("boxed_in_inline_dollars", r"$\boxed{42}$", "42", "42"),
    # thousands separators in running text (part 2)
    ("latex_comma_group", "$9{,}500$.", "9500", "9500"),  # was "9"
    ("latex_comma_group_no_math", "9{,}500.", "9500", "9500"),  # was "9"
    ("thin_space_group", r"$9\,500$.", "9500", "9500"),  # was "9"
    ("control_space_group", r"$9\ 500$.", "9500", "9500"),  # was "500"
    ("spaced_thin_space_group", r"$9 \, 500$.", "9500", "9500"),  # was "500"
    ("thin_space_group_space_before", r"$9 \,500$.", "9500", "9500"),  # was "500"
    ("html_no_break_space_group", "9&nbsp;500.", "9500", "9500"),  # was "500"
    ("thin_space_decimals", r"$3.141\,59$", "3.14159", "3.14159"),  # was "59"
    ("tie_group", "9~500.", "9500", "9500"),  # was "9"
    ("narrow_no_break_space_group", "9\u202f500.", "9500", "9500"),  # was "500"
    ("latex_comma_millions", "$9{,}500{,}000$.", "9500000", "9500000"),  # was "9"
    ("latex_comma_with_decimals", "$1{,}234.5$.", "1234.5", "1234.5"),  # was "1"
    ("escaped_dollar_latex_comma", r"\$9{,}500.", "9500", "9500"),  # was "5" (None without the distractor)
    ("negative_latex_comma", "$-9{,}500$.", "-9500", "-9500"),  # was "-9"
    ("comma_group", "9,500.", "9500", "9500"),
    ("comma_millions", "9,500,000.", "9500000", "9500000"),
    ("comma_with_decimals", "1,234.5.", "1234.5", "1234.5"),
    ("space_group", "9 500.", "9500", "9500"),  # math-verify's own plain-text rule
    # lists ("3, 4, 6", "3,4,6", "3{,}4{,}6", "9{,}500 and 6") are candidates, not one answer (issue #58): no reading
    # of them scores, merged or not, see test_reward_hedges.test_no_candidate_of_a_hedge_scores
    # no regressions on plain expressions and subscripts
    ("expression_with_parentheses", "3*(4+10)", "42", "3*(4+10)"),
    ("subscript", "x_1 = 42", "42", "42"),
]


@pytest.mark.parametrize(
    ("text", "gold", "extracted"), [row[1:] for row in RUNNING_TEXT], ids=[r[0] for r in RUNNING_TEXT]
)
def test_running_text_answer(text, gold, extracted):
    completion = LENIENT + text
    assert extract_final_answer(completion, strict=False) == extracted
    assert gsm8k_accuracy([completion, _conversational(completion)], [gold, gold]) == [1.0, 1.0]
    assert gsm8k_accuracy([completion], ["5"]) == [0.0]  # the distractor is not the answer
    assert gsm8k_strict_accuracy([completion], [gold]) == [float("boxed" in text)]


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        ("The total is \\fbox{42}", "42"),  # the issue's examples
        ("We have 5 apples, so the total is $$42$$", "42"),
        ("The answer is $9{,}500$.", "9500"),
    ],
)
def test_issue_13_examples(completion, gold):
    assert gsm8k_accuracy([completion], [gold]) == [1.0]


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        (R + r"\boxed{42", "42"),  # a truncated box is not an answer, whatever LaTeX surrounds it
        (R + r"$\boxed{\textbf{42}$", "42"),
        (R + r"\boxed{9{,}500", "9500"),
    ],
)
def test_unclosed_box_in_running_text_is_not_an_answer(completion, gold):
    assert extract_final_answer(completion) == "72"  # the last number before the unclosed box
    assert gsm8k_accuracy([completion], [gold]) == [0.0]

r"""Rule-based rewards for GSM8K math word problems, with TRL's reward-function signature.

Each reward function takes ``completions`` (a list of B*G completions, conversational or plain strings) plus dataset
columns as keyword arguments, and returns a list of B*G floats in ``{0.0, 1.0}``. None of them raises for any
completion content (``None``, empty, 1 MB, binary garbage, unbalanced braces, a message with no ``"content"``):
such a completion scores 0.0.

Answers are compared with math-verify (``parse`` + ``verify``), as TRL's ``trl/rewards/accuracy_rewards.py`` does;
this module only locates the final answer (the last ``\boxed{...}``, else the last number of the running text once
LaTeX and Markdown around it are removed, see `_running_text`) and normalises thousands separators.
A relation, set, sign choice, negation or hedge is not a number (`not_a_number`: ``\boxed{x \neq 42}`` is not 42).

A final answer is ONE value (issue #58, after Math-Verify #14 and PR #82). Candidates joined as alternatives score 0.0
in every accuracy reward, whatever the gold: in a box (``\boxed{41, 42}``, ``\boxed{41 \text{ to } 42}``,
``\boxed{x=41, y=42}``, ``\boxed{41\text{--}42}``, ``\boxed{\text{between } 41 \text{ and } 43}``), as boxes
(``\boxed{41} \text{ or } \boxed{42}``, ``\boxed{41}, \boxed{42}``, ``\boxed{41} or 42``) or in running text ("41 or
42", "either 41 or 42", "41, 42, or 43", "1, 2, 3", "between 41 and 43", "41 to 43"). Alternatives are recognised by
their form: a comma, semicolon, en or em dash, "or", "and", "to", "through", "vs" between two numbers, or "maybe",
"perhaps", "possibly", "between" in a box (where "42 or 42" is a hedge too: the form is read). Next to a box only a
word of choice joins a bare number of another value (``\boxed{42}? Or 41``), and two boxes of different values are
candidates unless a correction or a next step stands between them ("\boxed{41} Wait, no: \boxed{42}" and
"\boxed{5} then \boxed{8}" take the last box; ``\boxed{41}\boxed{42}`` is a hedge). Not alternatives: "from 30 to 42"
(a change), working next to a box ("20 + 22 = 42, \boxed{42}"). "41-42" is arithmetic (-1), as in TRL. A formula
is not the number inside it: a box must parse to one value with no symbol, constant or function left
(``\boxed{42 + \mathrm{e}}``, ``\boxed{42/\mathrm{e}}``, ``\boxed{42\pi}``, ``\boxed{\log 42}`` are not 42; the
rest of a box is never searched for a number), and in running text a number touching a symbol through an operator,
a power, a LaTeX or plain-text function or constant, or a single letter ("42/e", "$\frac{42}{x}$", "$42\pi$",
"$\log 42$", "42^2", "sqrt(42)", "42 squared", "42x", "42e3") is no answer (issue #71). In running text a guess is
no answer either ("Could be 42", "maybe 42", "42 (maybe)", "42?"), nor are numbers on lines of their own ("41\n42",
"A) 41\nB) 42"); signs are read as written ("+42" is 42, "is - 42" and "x = - 42" are -42, "50 - 8" is 42); and a
number math-verify cannot read after the answer it found (a later "x42", "No.42") leaves the completion with no
answer rather than an earlier number, unless the answer follows an "answer" anchor. Units are dropped
before parsing, as TRL's ``accuracy_reward`` drops them: ``42^\circ``, ``42°``, ``42\%``, ``\$42``,
``42 \text{ dollars}``, ``42\,\mathrm{cm}``, ``42 \text{ cm}^2``, ``42 apples`` are 42; a bare single letter is a
variable, not a unit (``42 x``, ``42\mathrm{e}``: e is Euler's number).
Each answer's check runs within `bounded.ANSWER_TIMEOUT_S` seconds on any thread (math-verify's own timeout works
only in the main thread); an answer given up on scores 0.0 and the call logs how many it gave up on.

Sources:
    - GSM8K: Cobbe et al., "Training Verifiers to Solve Math Word Problems", arXiv:2110.14168.
    - GRPO: Shao et al., "DeepSeekMath", arXiv:2402.03300 (Sec. 4.1); rule-based accuracy and format rewards as in
      DeepSeek-R1, arXiv:2501.12948 (Sec. 2.2.2).
"""

import html
import logging
import re
import unicodedata
from collections.abc import Callable
from fractions import Fraction

import sympy

from ..dataset_preparation import message_text
from ..error_reports import needs_extra
from . import bounded
from .bounded import run_bounded

with needs_extra("the GSM8K reward functions (trl_grpo_ext.gsm8k)"):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from math_verify.errors import TimeoutException

logger = logging.getLogger(__name__)

# Only the last `_MAX_PARSE_CHARS` characters of a completion are searched for an answer, and a `\boxed{` group
# must close within that many characters: keeps a reward call on a 1 MB completion in the milliseconds.
_MAX_PARSE_CHARS = 4096
# `gsm8k_format`: non-whitespace characters of reasoning required before the boxed answer, and characters (after
# stripping whitespace) allowed after it, e.g. "$." or " dollars.".
_MIN_REASONING_CHARS = 20
_MAX_TRAILING_CHARS = 40

_BOXED = "\\boxed"
# A thousands separator between digit groups: "," "{,}" "\," "\;" "\:" "\!" "\ " "~", a space, a no-break space
# or a thin space, as in "1\,234". In a boxed answer any of them counts; in running text (see `_running_text`) a plain
# space does not (math-verify's own plain-text rule reads "9 500" as 9500) and the digit groups must be well formed.
_SEP = r"(?:,|\{,\}|\\[,;:! ]|~|\u00a0|\u202f|\u2009)"
_THOUSANDS_SEP = re.compile(rf"(?<=\d)(?:{_SEP}| )(?=\d{{3}}(?!\d))")
_SEP_RE = re.compile(_SEP)
# A well-formed grouped number in running text: 1-3 leading digits, then groups of exactly 3 ("9{,}500{,}000").
# In running text a LaTeX spacing command may have spaces around it ("$9 \\, 500$": math mode ignores them).
_RUNNING_SEP = rf"(?:[ \t]*\\[,;:!][ \t]*|{_SEP})"
_RUNNING_SEP_RE = re.compile(_RUNNING_SEP)
_GROUPED_NUMBER = re.compile(rf"(?<![\d.])\d{{1,3}}(?:{_RUNNING_SEP}\d{{3}})+(?!\d)")
# A comma between digits that is not a thousands separator separates list items ("3,4,5"), never a decimal comma.
_LIST_COMMA = re.compile(r"(?<=\d),(?=\d)")
# `_running_text`'s rewrites of LaTeX, Markdown and HTML, in order: an unclosed box (truncated generation) and all
# after it, and invisible characters; grouped numbers joined; numeric fractions as "a/b" (mixed numbers as one
# fraction); a minus sign parted from its number by markup joined to it; operators; "\%" kept as "%"; HTML tags,
# every other command, control symbol ("\(", "\$", "\,") and delimiter or brace; Markdown bold/italic/code marks;
# parentheses around a lone number; punctuation touching a number's start (math-verify's plain-text rule wants a
# space, "=" or "**" before a number).
_UNCLOSED_BOX = re.compile(r"\\boxed\s*\{.*", re.DOTALL)
# A whole number right before a fraction makes a mixed number ("2\frac{1}{2}" is 5/2, as LaTeX typesets it).
_FRAC = re.compile(
    r"(?:(?<![\w.])(-?\d+)(?:[ \t~]|\\[,;:! ])*)?\\[dt]?frac\s*(?:\{\s*(-?\d+(?:\.\d+)?)\s*\}|(\d))\s*"
    r"(?:\{\s*(-?\d+(?:\.\d+)?)\s*\}|(\d))"
)
_OPERATORS = {"\\times": "*", "\\cdot": "*", "\\div": "/"}
_OPERATOR = re.compile(r"\\(?:times|cdot|div)(?![a-zA-Z])")
_PERCENT = re.compile(r"\\%")
_MARKUP = re.compile(r"\\[a-zA-Z]+\*?|\\.|[{}$~&`]|\*\*+|__+", re.DOTALL)
# An HTML tag: a known name, attributes only as name=value ("<b>", "</strong>", "<br/>", '<span class="x">'), so
# that an inequality ("x<y and y = 12 > x") is left alone.
_HTML_TAG = re.compile(
    r"</?(?:b|strong|i|em|u|s|sup|sub|span|p|div|br|hr|code|mark|small|big|font|tt|del|ins|li|ul|ol)"
    r"""(?:\s+[a-zA-Z-]+\s*=\s*(?:"[^"<>]*"|'[^'<>]*'|[^\s<>]+))*\s*/?>""",
    re.IGNORECASE,
)
# A minus sign parted from its number by markup only, touching the markup ("$-$42", "-$42$", "\text{-}42",
# "-\$5", "-**42**", "<b>-</b>42"): the markup is dropped, unless the sign follows a digit or closing bracket (then
# it is a binary minus, "46 -$4$"). A minus with spaces on both sides ("46 apples - $4$") is left to be a minus.
_SIGN_TOKEN = (
    r"(?:\$+|\\\$|\\[()\[\]]|\\left[ \t]*[(\[]|\\[a-zA-Z]+[ \t]*\{?|\{|\}|\*+|`|</?(?:b|strong|i|em|code|span)>)"
)
_SIGN_MARKUP = re.compile(rf"-({_SIGN_TOKEN}(?:[ \t]*{_SIGN_TOKEN})*)[ \t]*(?=\d)")
# A minus opening math mode, then spaces: "$- 42$" is -42.
_MATH_SIGN = re.compile(r"(\$|\\\(|\\\[)[ \t]*-[ \t]+(?=\d)")
# The decimal part of a number grouped by LaTeX or Unicode thin spaces: "0.123\,456" is 0.123456.
# No comma here: "0.123,456" is two numbers.
_DECIMAL_SEP = r"(?:[ \t]*\\[,;:!][ \t]*|\\ |~|\u2009|\u202f)"
_DECIMAL_SEP_RE = re.compile(_DECIMAL_SEP)
_GROUPED_DECIMALS = re.compile(rf"(?<=\d\.)\d{{3}}(?:{_DECIMAL_SEP}\d{{1,3}})+")
# Other minus signs: U+2212 MINUS SIGN, fullwidth and small hyphen-minus; an en dash right before a number that does
# not follow a digit ("–42", not the range "5–7").
_MINUS_SIGNS = {"\u2212": "-", "\uff0d": "-", "\ufe63": "-"}
_EN_DASH_SIGN = re.compile(r"(?<!\d)\u2013(?=\d)")
# zero-width characters, soft hyphen, direction marks and embeddings, invisible operators, Mongolian vowel separator
_INVISIBLE = ("\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\ufeff\u00ad\u180e"
              "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")  # fmt: skip
# one pass over the characters: the minus signs as "-", the invisible ones dropped
_CHARACTERS = str.maketrans({**_MINUS_SIGNS, **dict.fromkeys(_INVISIBLE)})
_EMPHASIS = re.compile(r"(?<![\w*])([*_])(?=\S)([^*_\n]*?\S)\1(?![\w*])")
_PAREN_NUMBER = re.compile(r"[(\[]\s*(-?\d+(?:\.\d+)?)\s*[)\]]")
_TOUCHING_PUNCT = re.compile(r"(?<=[:;#\"'\u201c\u2018<|])(?=-?\d)")
# Factorials and powers are never a GSM8K answer, and sympy can take unbounded time on "9!!!" or "9^9^9" (math-verify
# has no timeout outside the main thread): such an answer is not evaluated.
_UNBOUNDED = re.compile(r"!|\^")
# Not a numeric answer (Math-Verify #14): a relation other than "=" ("x \\neq 42", "42 < x", "x \\approx 42"), a
# negation, a set, a sign choice, or candidates and hedges in words ("\\text{not } 42", "at least 42", "42 or more",
# "42 or 43"). "x = 42" and "n = 42" are numeric answers.
_RELATION_COMMAND = re.compile(
    r"\\(?:neq?|lt|gt|leq?|geq?|leqq|geqq|leqslant|geqslant|lesssim|gtrsim|nless|ngtr|approx|approxeq|sim|simeq|"
    r"cong|equiv|propto|ll|gg|not|neg|lnot|in|notin|ni|subset|subseteq|supset|supseteq|pm|mp|lor|land|vee|wedge|"
    r"lbrace|mid)(?![a-zA-Z])"
)
# < > and their Unicode relatives: not equal, (not) less or greater, approximately, similar, congruent, identical,
# proportional, element of, plus-minus, not
_RELATION_CHARS = (
    "<>\u2260\u2264\u2265\u2266\u2267\u2248\u2243\u2245\u2261\u223c\u2272\u2273\u221d\u2208\u2209\u00b1\u2213\u00ac"
)
_RELATION_SYMBOL = re.compile(rf"[{_RELATION_CHARS}]|!=|\\\{{")
_HEDGES = r"about|around|approximately|roughly|nearly|almost|over|under|above|below|least|most|than"
_HEDGE_WORD = re.compile(
    rf"\b(?:not|no|never|except|or|nor|either|neither)\b|\b(?:{_HEDGES})\b(?=[^0-9a-z]*-?\d)", re.IGNORECASE
)
# In running text, what stands right before or after the last number when that number is not the answer ("x is not
# 42", "so 42 < x", "42 or more"); `_running_text` writes every relation command as "\u2260", which survives it.
_HEDGE_BEFORE = re.compile(rf"(?:[{_RELATION_CHARS}]|!=|\b(?:not|never|except|{_HEDGES}))[\s$*]*$", re.IGNORECASE)
_HEDGE_AFTER = re.compile(
    rf"[\s$*]*(?:[{_RELATION_CHARS}]|!=|or\s+(?:more|less|fewer|so)\b|\?)"  # "42 or more", "42?" (a question)
    r"|[\s$*,(]*-?\s*(?:maybe|perhaps|possibly|probably|likely|i\s+think|i\s+guess|i\s+believe|not\s+sure|ish"
    r"|approx(?:imately|\.)?|roughly|give\s+or\s+take)\b",  # "42 (maybe)", "42, I think", "42-ish"
    re.IGNORECASE,
)
# A word of doubt at most three words before the answer ("Could be 42", "maybe 42", "probably the answer is 42"), so
# "She could be 3 years older, so the total is 42" is an answer.
_DOUBT_BEFORE = re.compile(
    r"\b(?:(?:could|might|may)\s+be|maybe|perhaps|possibly|probably|likely|i\s+guess|not\s+sure|unsure|uncertain)"
    r"(?:[\s,:$*]+[A-Za-z']+){0,3}[\s,:$*]*$",
    re.IGNORECASE,
)
# A line holding only a number, perhaps labelled as a list item or an option ("42", "B) 42", "(b) 42", "2. 42",
# "- 42"): two such lines of different values are candidates ("41\n42", "A) 41\nB) 42").
_BARE_LINE = re.compile(
    r"[ \t]*(?:(?:[A-Za-z]|\d{1,2})[).:]|\([A-Za-z\d]{1,2}\)|[-*\u2022])?[ \t]*(-?\d+(?:\.\d+)?)[ \t]*[.?!]?[ \t]*"
)
# math-verify's plain-text anchor ("final answer is", "answer: ... = 42"); a number after the answer is another
# candidate unless the answer follows the anchor with no number between them (or right after its "=").
_ANCHOR = re.compile(r"answer", re.IGNORECASE)
# a digit of any script, superscripts, subscripts, vulgar fractions and circled numbers included ("\u2074\u00b2")
_DIGIT = re.compile(r"[\d\u00b2\u00b3\u00b9\u00bc-\u00be\u2070-\u209f\u2150-\u218b\u2460-\u24ff\u2776-\u2793]")
# One value (issue #58). In running text (after `_running_text`) and around a box: a number, then words or marks that
# join alternatives, then the answer ("41 or 42", "41, 42, or 43", "between 41 and 43", "x = 41, y = 42"); or the
# answer, then such a joint and another number. Searched within `_JOIN_WINDOW` characters, so in constant time.
_JOIN_WINDOW = 200
_JOINT = (r"(?:,|;|--+(?!-)|[\u2013\u2014]|\b(?:or|and|nor|to|through|thru|maybe|perhaps|possibly|vs|versus)\b"
          r"|\b[A-Ea-e]\))")  # fmt: skip  # an option's label: "A) 41 B) 42"
_JOINED_BEFORE = re.compile(rf"\d[\s$*%]*(?:{_JOINT}[\s$*]*)+(?:[A-Za-z]\w*[\s$*]*=[\s$*]*)?$", re.IGNORECASE)
_JOINED_AFTER = re.compile(rf"[\s$*(\[]*(?:{_JOINT}[\s$*(\[]*)+-?\d", re.IGNORECASE)
_CHANGE = re.compile(r"\bfrom[\s$*]+-?[\d.]+[\s$*%]*to[\s$*]*$", re.IGNORECASE)  # "from 30 to 42": not a range
# In a box: a list or range separator between values, or a hedge word anywhere ("\text{maybe } 42").
_LIST = re.compile(
    r"[,;](?=[^,;]{0,40}?\d)|(?<=\d)\s*(?:--+|[\u2013\u2014])|\\text\s*\{\s*--+\s*\}"
    r"|\b(?:and|to|through|thru|vs|versus)\b(?=[^0-9]{0,40}?\d)|\b(?:maybe|perhaps|possibly|between)\b",
    re.IGNORECASE,
)
# A LaTeX function, constant or non-numeric fraction in running text (numeric fractions are already "a/b"): written
# as `_FORMULA_TOKEN`, so that a number next to it ("$\log 42$", "$42\pi$", "$\frac{42}{x}$") is not an answer.
_FORMULA_TOKEN = "\u00a7"
_FORMULA = re.compile(
    r"\\(?:pi|infty|exp|log|ln|lg|sin|cos|tan|cot|sec|csc|arcsin|arccos|arctan|sinh|cosh|tanh|sqrt|[dtc]?frac|binom|"
    r"sum|prod|int|lim|operatorname|alpha|beta|gamma|delta|epsilon|varepsilon|theta|vartheta|lambda|mu|nu|xi|rho|"
    r"sigma|tau|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Pi|Sigma|Phi|Psi|Omega)(?![a-zA-Z])"
)
# a formula around the answer in running text: the token, or a single letter (a variable, "e") through an operator
_FORMULA_BEFORE = re.compile(
    rf"(?:{_FORMULA_TOKEN}|(?<![A-Za-z])[A-Za-z][ \t]*[*/+^])[ \t(]*$"
    r"|\b(?:(?:square|cube|\w+th)\s+root|square|cube|log(?:arithm)?|factorial|exponential)\s+of[\s$*]*$",  # in words
    re.IGNORECASE,
)
_FORMULA_AFTER = re.compile(
    rf"[ \t)]*(?:{_FORMULA_TOKEN}|[*/+^][ \t(]*(?:{_FORMULA_TOKEN}|[A-Za-z](?![A-Za-z])))"
    r"|[A-Za-z](?![A-Za-z])"  # touching a single letter: a variable or a power of ten ("42x", "42e3")
    r"|[\s$*]*(?:squared|cubed|to\s+the\s+(?:\w+\s+)?power|raised\s+to|factorial)\b",  # "42 squared"
    re.IGNORECASE,
)
# Functions and roots in plain text ("sqrt(42)", "log 42", "\u221a42", "42\u03c0"): written as `_FORMULA_TOKEN` too.
_PLAIN_FORMULA = re.compile(
    r"(?<![A-Za-z])(?:(?:sqrt|cbrt|log\d*|ln|lg|exp|sin|cos|tan|cot|sec|csc|arc(?:sin|cos|tan)|sinh|cosh|tanh)"
    r"(?=[ \t]*[(\d])|(?:abs|floor|ceil|round|min|max|gcd|lcm|mod)(?=[ \t]*\())|[\u221a\u221b\u221c\u03c0\u221e]",
    re.IGNORECASE,
)
# A sign before a number, with spaces or none ("+42", "- 42"): read as the number's sign when nothing it could
# subtract from stands before it (`_signed`).
_SIGN = re.compile(r"([+-])[ \t]*(?=\d)")
# Units in a box, dropped before parsing (TRL's ``accuracy_reward`` drops them too): a degree sign anywhere; a whole
# answer written as text; then, at the end, a text command or a word of 2+ letters (optionally squared, cubed) after a
# number, a brace or "%" (``42 \text{ dollars}``, ``42\,\mathrm{cm}``, ``42 apples``, ``42 \text{ cm}^2``). A single
# bare letter is a variable ("42 x"), and ``\mathrm{e}`` is Euler's number, not a unit.
_DEGREE = re.compile(r"\^\s*(?:\{\s*\\circ\s*\}|\\circ(?![a-zA-Z]))|\u00b0|\\degree(?![a-zA-Z])")
_WHOLE_TEXT = re.compile(r"\\(?:text|textrm|textnormal|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_EULER = re.compile(r"\\math(?:rm|it)\s*\{\s*e\s*\}")
_UNIT = re.compile(
    r"(?<=[\d}%.])(?:\s|\\[,;:! ]|~)*(?:\\(?:text|textrm|textnormal|textit|mathrm|mathit|mbox)\s*\{[^{}]*\}"
    r"|[A-Za-z]{2,}(?:[ ./-]+[A-Za-z]+)*)(?:\s*\^\s*\{?\s*[23]\s*\}?)?\s*[.,;:]?\s*$"
)
_TRAILING_PUNCT = re.compile(r"(?<=\d)\s*[.,;:]\s*$")
_ARITHMETIC = re.compile(r"[\d\s.+\-*/()]+")

_LATEX_CONFIG = LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)
_EXPR_CONFIG = ExprExtractionConfig()


def _quiet_math_verify() -> None:
    """Silence math-verify's "timeout is disabled" warnings: its own timeouts are off here, `bounded` bounds each
    answer's check instead (as TRL's ``accuracy_reward`` silences them in a worker thread)."""
    logging.getLogger("math_verify.parser").setLevel(logging.ERROR)
    logging.getLogger("math_verify.grader").setLevel(logging.ERROR)


def _closing_brace(text: str, open_index: int) -> int | None:
    """Index of the "}" matching the "{" at ``open_index``, or None if it does not close within _MAX_PARSE_CHARS."""
    depth = 0
    for i in range(open_index, min(len(text), open_index + _MAX_PARSE_CHARS)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _boxed_span(text: str, start: int) -> tuple[int, int] | None:
    r"""(start, end) of the content of the ``\boxed{...}`` beginning at ``start`` (spaces may stand before the
    brace, as LaTeX allows); None if not followed by a closed brace group."""
    open_index = start + len(_BOXED)
    while open_index < len(text) and text[open_index] in " \t":
        open_index += 1
    if not text.startswith("{", open_index):
        return None
    close_index = _closing_brace(text, open_index)
    return None if close_index is None else (open_index + 1, close_index)


def _last_box(text: str) -> tuple[int, int, int] | None:
    r"""(start of ``\boxed``, content start, content end) of the last complete ``\boxed{...}`` in ``text``, or None.

    Several boxed answers: the LAST complete one is the final answer (a model that corrects itself boxes its
    correction last). A trailing ``\boxed{`` that never closes (truncated generation) is skipped.
    """
    start = text.rfind(_BOXED)
    while start != -1:
        span = _boxed_span(text, start)
        if span is not None:
            return start, span[0], span[1]
        start = text.rfind(_BOXED, 0, start)
    return None


def _plain(text: str) -> str:
    r"""`_running_text` of a stretch of text that may hold complete boxes (``\boxed{41} or`` -> " 41 or")."""
    return _running_text(text.replace(_BOXED, " "))


def _joined(before: str, after: str) -> bool:
    """Whether an answer with ``before`` and ``after`` it (plain text, see `_running_text`) is one of several
    alternatives: "41 or " before it, ", 43" after it (see `_JOINED_BEFORE`)."""
    before = before[-_JOIN_WINDOW:]
    hedged = _JOINED_BEFORE.search(before) and not _CHANGE.search(before)
    return bool(hedged or _JOINED_AFTER.match(after[:_JOIN_WINDOW]))


# Around a box only words offer an alternative to a bare number ("41 or \boxed{42}", "\boxed{42}? Or 41"): a comma,
# "and" or "to" there is working ("20 + 22 = 42, \boxed{42}", "rose by 12 to \boxed{42}", "\boxed{42} and 0 remain").
_OR = r"(?:\b(?:or|nor|either|maybe|perhaps|possibly|otherwise|else|vs|versus)\b|/)"
_OR_BEFORE = re.compile(rf"(-?\d+(?:\.\d+)?)[\s$*.?!]*{_OR}[\s$*]*$", re.IGNORECASE)
_OR_AFTER = re.compile(rf"[\s$*.?!,)]*{_OR}[\s$*(]*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
# Between two boxes of different values: a correction or a next step keeps the last one ("\boxed{41} Wait, no:
# \boxed{42}", "\boxed{5} then \boxed{8}"); a word of choice, or nothing but marks, makes them candidates
# ("\boxed{41}\boxed{42}", "\boxed{41}, else \boxed{42}", "If x then \boxed{41}, otherwise \boxed{42}").
_BRACED_NUMBER = re.compile(r"[\s\d.,$%+\-]+")
_CORRECTION = re.compile(
    r"\b(?:wait|no|not|actually|correct(?:ion|ed|ing)?|mistake|wrong|error|oops|sorry|instead|re-?check(?:ed|ing)?|"
    r"re-?calculat\w*|fix(?:ed)?|revis\w*|hold on|let me|then|so|thus|therefore|hence|finally|next|total)\b",
    re.IGNORECASE,
)
_ALTERNATIVE = re.compile(_OR, re.IGNORECASE)


def _same_value(first: str, second: str) -> bool:
    """Whether two answer texts are the same number as written ("42" and "42.0"), without math-verify."""
    try:
        return float(first.replace(",", "")) == float(second.replace(",", ""))
    except ValueError:
        return first.strip() == second.strip()


def _boxed_alternatives(text: str, start: int, begin: int, end: int) -> bool:
    r"""Whether the box at ``text[start:end + 1]`` (content ``text[begin:end]``) is one of several candidates: another
    box of another value before it with no correction between them (``oxed{41} 	ext{ or } oxed{42}``,
    ``oxed{41}oxed{42}``, `_CORRECTION`), or a bare number of another value joined to it by a word of choice
    (``41 or oxed{42}``, ``oxed{42}? Or 41``, `_OR`). Not ``oxed{41} Wait, no: oxed{42}`` (a correction)
    nor ``20 + 22 = 42, oxed{42}`` (working)."""
    value = text[begin:end].strip()
    window = max(0, start - _JOIN_WINDOW)
    previous = text.rfind(_BOXED, window, start)
    span = _boxed_span(text, previous) if previous != -1 else None
    if span is not None and span[1] < start:
        other, between = text[span[0] : span[1]].strip(), text[span[1] + 1 : start]
        if not _same_value(other, value) and (_ALTERNATIVE.search(between) or not _CORRECTION.search(between)):
            return True
    before = _OR_BEFORE.search(_plain(text[window:start]))
    after = _OR_AFTER.match(_plain(text[end + 1 : end + 1 + _JOIN_WINDOW]))
    return any(m is not None and not _same_value(m.group(1), value) for m in (before, after))


def extract_final_answer(text: str, strict: bool = False) -> str | None:
    r"""The final-answer text of a completion.

    Only the last _MAX_PARSE_CHARS (4096) characters are searched.

    Args:
        text: the completion text.
        strict: if True only a ``\boxed{...}`` answer counts. If False (lenient) the last complete boxed answer is
            preferred and, when there is none, math-verify's plain-text extraction is used on the text rewritten by
            `_running_text` (LaTeX delimiters, commands, braces and Markdown marks become spaces, LaTeX thousands
            separators are removed, numeric ``\frac{a}{b}`` becomes ``a/b``): a number after "final answer is" /
            "answer" if present, else the last number (or simple expression such as ``1/2``) in the text, e.g.
            "It costs $18.00" -> "18.00", "the total is $$9{,}500$$" -> "9500", "\textbf{42}" -> "42".

    Returns:
        The answer text (e.g. "1,234", "\frac{1}{2}", "18 dollars"; "" for an empty box; stripped), or None when
        no answer is found (an unclosed ``\boxed{`` and what follows it are not searched), when the answer is one of
        several candidates joined as alternatives (``\boxed{41} \text{ or } \boxed{42}``, "41 or 42", "1, 2, 3"),
        when a running-text number is part of a formula ("42/e", "$\log 42$"), or when ``text`` is not a string.
        A boxed list (``\boxed{41, 42}``) is returned and refused when parsed (`not_a_number`). Never raises.
    """
    if not isinstance(text, str):
        return None
    return bounded_one(_extract_final_answer, (text, strict), None, "extract_final_answer")


def _extract_final_answer(text: str, strict: bool) -> str | None:
    """`extract_final_answer` without its time bound."""
    tail = ascii_digits(text[-_MAX_PARSE_CHARS:])
    box = _last_box(tail)
    if box is not None:
        start, begin, end = box
        content = tail[begin:end].strip()
        while (
            content.startswith("{")
            and _closing_brace(content, 0) == len(content) - 1
            and _BRACED_NUMBER.fullmatch(content[1:-1])
        ):
            content = content[1:-1].strip()  # \boxed{{42}}: a number in extra braces ({n \choose k} keeps them)
        return None if _boxed_alternatives(tail, start, begin, end) else content
    if strict:
        return None
    try:
        plain = _running_text(tail).replace("!", " ")  # "It is 72!" -> "It is 72 ": a factorial is no GSM8K answer
        parsed = parse(plain, extraction_config=[_EXPR_CONFIG], parsing_timeout=None)
    except (Exception, TimeoutException):
        return None
    answer = next((p.strip() for p in parsed if isinstance(p, str)), None)
    at = plain.rfind(answer) if answer else -1
    if at >= 0:
        before = plain[:at]
        named = before.rstrip(" \t$*").endswith("=")  # "y = 42 > x": y is 42
        after = plain[at + len(answer) : at + len(answer) + _JOIN_WINDOW]
        if _DIGIT.search(plain, at + len(answer)) and not _anchored(before):
            return None  # a later number math-verify could not read ("+42" after "Step 1"): never an earlier one
        if _HEDGE_BEFORE.search(before) or (not named and _HEDGE_AFTER.match(after)):
            return None  # "x is not 42", "so 42 < x", "42 or more", "42?": a relation or a hedge, not the answer
        if _DOUBT_BEFORE.search(before[-_JOIN_WINDOW:]):
            return None  # "Could be 42", "maybe 42": a guess, not the answer
        if _joined(before, after) or _listed(plain, at, at + len(answer)):
            return None  # "41 or 42", "41, 42, or 43", "between 41 and 43", "41\n42": candidates, not one value
        if _FORMULA_BEFORE.search(before[-_JOIN_WINDOW:]) or _FORMULA_AFTER.match(after):
            return None  # "42/e", "$\log 42$", "42^2", "42x", "sqrt(42)": a formula, not the number inside it
    return answer


def _anchored(before: str) -> bool:
    """Whether the text `before` an answer ends with math-verify's anchor for it: "answer" and no number after
    it, or an "=" right before the answer ("The answer is 42", "Answer: 6 * 7 = 42")."""
    window = before[-_JOIN_WINDOW:]
    anchors = [match.end() for match in _ANCHOR.finditer(window)]
    if not anchors:
        return False
    between = window[anchors[-1] :]
    return not _DIGIT.search(between) or before.rstrip(" \t$*").endswith("=")


def _listed(plain: str, start: int, end: int) -> bool:
    """Whether the answer at `plain[start:end]` stands alone on its line (perhaps labelled: "B) 42") and the line
    before it holds only another number too ("41\n42", "A) 41\nB) 42"): a list of candidates."""
    line_start = plain.rfind("\n", 0, start) + 1
    line_end = plain.find("\n", end)
    line = _BARE_LINE.fullmatch(plain[line_start : len(plain) if line_end == -1 else line_end])
    if line is None:
        return False
    earlier = [text for text in plain[max(0, line_start - _JOIN_WINDOW) : line_start].split("\n") if text.strip()]
    previous = _BARE_LINE.fullmatch(earlier[-1]) if earlier else None
    return previous is not None and not _same_value(previous.group(1), line.group(1))


def _running_text(text: str) -> str:
    r"""``text`` (a completion without a complete boxed answer) rewritten so that math-verify's plain-text rule sees
    every number whole and on its own: LaTeX and Markdown around or inside a number become spaces.

    Examples: ``\fbox{42}``, ``$$42$$``, ``\(42\)``, ``\textbf{42}``, ``**42**``, ``(42)``, ``answer:42`` -> 42;
    ``<b>42</b>``, ``\u200b42`` (a zero-width space) -> 42; ``$-$42``, ``-$42$``, ``\text{-}42`` -> -42;
    ``$9{,}500$``, ``9\,500``, ``$9 \, 500$`` -> 9500; ``\dfrac{1}{2}`` -> ``1/2``; ``2\frac{1}{2}`` (a mixed number)
    -> ``5/2``; ``3,4,5`` -> 3, 4 and 5 (a list: no answer, not 3.4 or 345); ``\boxed{18`` (unclosed, a truncated
    generation) is dropped with all that follows. The one normalization behind the lenient reward, the evaluation's
    lenient accuracy and its maj@k vote (all via `extract_final_answer`). Never raises.
    """
    text = html.unescape(text) if "&" in text else text  # "&minus;42", "1&nbsp;000"
    text = _DEGREE.sub(" ", _UNCLOSED_BOX.sub("", text).translate(_CHARACTERS))  # "42^\circ", "42°": 42
    text = _EN_DASH_SIGN.sub("-", text)
    text = _GROUPED_NUMBER.sub(lambda m: _RUNNING_SEP_RE.sub("", m.group()), text)
    text = _GROUPED_DECIMALS.sub(lambda m: _DECIMAL_SEP_RE.sub("", m.group()), text)
    text = _LIST_COMMA.sub(", ", text)
    text = _FRAC.sub(_fraction, text)
    text = _PLAIN_FORMULA.sub(f" {_FORMULA_TOKEN} ", _FORMULA.sub(f" {_FORMULA_TOKEN} ", text)).replace("^", " ^ ")
    text = _SIGN_MARKUP.sub(_joined_sign, _MATH_SIGN.sub(r"\1-", text))
    text = _OPERATOR.sub(lambda m: _OPERATORS[m.group()], _RELATION_COMMAND.sub(" \u2260 ", text))
    text = _MARKUP.sub(" ", _PERCENT.sub("%", _HTML_TAG.sub(" ", text)))
    text = _EMPHASIS.sub(r" \2 ", text)
    text = _PAREN_NUMBER.sub(r" \1 ", text)
    return _SIGN.sub(_signed, _TOUCHING_PUNCT.sub(" ", text))


def _signed(match: re.Match) -> str:
    """A `_SIGN` match: "-" joined to its number and "+" dropped when nothing it could take from or add to stands
    before it ("is - 42", "x = - 42", ": +42", "+42" first); otherwise (after a number, a closing bracket or a single
    letter: "46 - 4", "x - 4") left as it is. "- 42" opening a line is a Markdown list's mark, left too."""
    before = match.string[max(0, match.start() - 40) : match.start()].rstrip(" \t$*")
    word = re.search(r"[A-Za-z]+$", before)
    operand = before and (before[-1].isdigit() or before[-1] in ")]}%" or (word is not None and len(word[0]) == 1))
    if operand:
        return match.group()
    if match.group(1) == "+":
        return ""
    bullet = match.start() == 0 or before.endswith("\n") or not before
    return match.group() if bullet and match.group() != "-" else "-"


def _fraction(match: re.Match) -> str:
    r"""A `_FRAC` match as "a/b " (``\frac{1}{-2}`` -> "-1/2"); a mixed number as one improper fraction
    (``2\frac{1}{2}`` -> "5/2", ``-1\frac{3}{4}`` -> "-7/4")."""
    whole, numerator, denominator = match.group(1), match.group(2) or match.group(3), match.group(4) or match.group(5)
    sign = "-" if numerator.startswith("-") != denominator.startswith("-") else ""
    numerator, denominator = numerator.lstrip("-"), denominator.lstrip("-")
    if whole is None:
        return f"{sign}{numerator}/{denominator} "
    try:
        value = abs(int(whole)) + Fraction(numerator) / Fraction(denominator)
    except (ValueError, ZeroDivisionError):
        return f"{whole} {sign}{numerator}/{denominator} "
    sign = "-" if whole.startswith("-") != (sign == "-") else ""
    return f"{sign}{value.numerator}/{value.denominator} "


def _joined_sign(match: re.Match) -> str:
    """A `_SIGN_MARKUP` match: the sign joined to its number, unless a digit or closing bracket stands before it
    (a binary minus, "$10 - $4", keeps its markup, which `_MARKUP` turns into spaces)."""
    before = match.string[: match.start()].rstrip()
    return match.group() if before and (before[-1].isdigit() or before[-1] in ")]}") else "-"


def ascii_digits(text: str) -> str:
    """`text` with every Unicode decimal digit written as its ASCII digit ("７２" and "٧٢" -> "72")."""
    if text.isascii():
        return text
    return "".join(str(unicodedata.decimal(c)) if unicodedata.decimal(c, None) is not None else c for c in text)


def _value(expr: object) -> sympy.Expr | None:
    """The one number a parsed answer states, or None: a sympy expression with no symbol, constant (pi, e), function
    (log, sqrt of a non-square stays a power and counts), infinity or imaginary unit in it; an equation with a name on
    one side (``x = 42``, ``42 = x``) states its other side. A set, tuple, interval, ``Eq(x, {40, 41})``,
    ``x = 41 = 42`` (an And) or a string is not one number."""
    if isinstance(expr, sympy.Eq):
        lhs, rhs = expr.args
        expr = rhs if isinstance(lhs, sympy.Symbol) else lhs if isinstance(rhs, sympy.Symbol) else None
    if not isinstance(expr, sympy.Expr) or expr.free_symbols or expr.atoms(sympy.NumberSymbol, sympy.Function):
        return None
    return None if expr.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan, sympy.I) else expr


def _without_units(answer: str) -> str:
    r"""``answer`` without the units around its number (see `_UNIT`): ``42^\circ \mathrm{C}`` -> "42",
    ``\text{42 apples}`` -> "42", ``18 dollars.`` -> "18"; ``42 + \mathrm{e}`` is left as it is (no number before the
    text). Only the last 80 characters are searched for a unit, so in constant time."""
    answer = _DEGREE.sub(" ", answer).strip()
    whole = _WHOLE_TEXT.fullmatch(answer)
    answer = whole.group(1).strip() if whole else answer
    answer = _EULER.sub(" e ", answer)
    for _ in range(2):  # "42 \text{ km} \text{ each}"
        head, window = answer[:-80], answer[-80:]
        unit = _UNIT.search(window)
        if unit is None or not unit.start():
            break
        answer = (head + window[: unit.start()]).rstrip()
    return _TRAILING_PUNCT.sub("", answer)


def _parse_prediction(answer: str) -> list:
    r"""The value an answer text states, as a one-element list for math-verify's ``verify``; [] when it states none.

    Thousands separators are removed first (math-verify reads "1\,234" and "1 234" as 235), then relations, hedges
    and lists are refused (`not_a_number`), units dropped (`_without_units`), and the rest is parsed as the LaTeX of
    ``\boxed{answer}`` (plain arithmetic such as "3 * (4 + 10)" as plain text if LaTeX fails). It must be one number
    (`_value`): the rest of an unparsable formula is never searched for a number (``42 + \mathrm{e}`` is not 42,
    Math-Verify PR #82). Answers with a factorial or a power are not evaluated (see `_UNBOUNDED`)."""
    answer = _THOUSANDS_SEP.sub("", ascii_digits(answer))
    if not_a_number(answer):
        return []
    answer = _without_units(answer)
    if _UNBOUNDED.search(answer):
        return []
    parsed = parse(f"{_BOXED}{{{answer}}}", extraction_config=[_LATEX_CONFIG], parsing_timeout=None)
    if not any(isinstance(p, sympy.Basic) for p in parsed) and _ARITHMETIC.fullmatch(answer):
        parsed = parse(answer, extraction_config=[_EXPR_CONFIG], parsing_timeout=None)
    value = next((_value(p) for p in parsed if isinstance(p, sympy.Basic)), None)
    return [] if value is None else [value]


def not_a_number(answer: str) -> bool:
    r"""Whether an answer text is a relation, a set, a sign choice, a negation, a hedge or a list of candidates rather
    than one number, so that it never scores as a number it holds (Math-Verify #14, issue #58): ``x \neq 42``,
    ``42 < x``, ``x \approx 42``, ``\{42\}``, ``\pm 42``, ``\text{not } 42``, ``\text{at least } 42``,
    ``42 \text{ or more}``, ``42 or 43``, ``41, 42``, ``x=41, y=42``, ``41 \text{ to } 42``, ``41\text{--}42``,
    ``\text{maybe } 42``, ``\text{between } 41 \text{ and } 43``. An equation naming the value (``x = 42``,
    ``\text{Total} = 42``) and units (``42 \text{ dollars}``, ``42 more than Tom``) are numbers."""
    return bool(
        _RELATION_COMMAND.search(answer)
        or _RELATION_SYMBOL.search(answer)
        or _HEDGE_WORD.search(answer)
        or _LIST.search(answer)
    )


def answer_is_correct(prediction: str | None, gold: str) -> bool:
    """Whether an extracted answer equals the gold number, by math-verify (so "0.5" == "1/2", "18.00" == "18").

    Args:
        prediction: answer text from `extract_final_answer`; None counts as wrong.
        gold: gold answer as a plain number string, e.g. "1234", "-3", "0.5" (commas and "$" are tolerated).

    Returns:
        True if equal; False otherwise, including for an unparseable gold. Never raises.
    """
    if not isinstance(prediction, str) or gold is None:
        return False
    return bounded_one(_answer_is_correct, (prediction, str(gold)), False, "answer_is_correct")


def _answer_is_correct(prediction: str, gold: str) -> bool:
    """`answer_is_correct` without its time bound."""
    try:
        gold_text = gold.replace(",", "").replace("$", "")
        gold_parsed = parse(gold_text, extraction_config=[_EXPR_CONFIG], parsing_timeout=None)
        gold_value = next((_value(g) for g in gold_parsed if isinstance(g, sympy.Basic)), None)
        if gold_value is None:
            return False
        return bool(verify([gold_value], _parse_prediction(prediction), timeout_seconds=None))
    except (Exception, TimeoutException):
        return False


def same_answer(first: str | None, second: str | None) -> bool:
    r"""Whether two extracted answers are the same number ("18" and "\$18.00", "\frac{1}{2}" and "0.5"); False
    when either is None or does not parse. Never raises."""
    if not isinstance(first, str) or not isinstance(second, str):
        return False
    return bounded_one(_same_answer, (first, second), False, "same_answer")


def _same_answer(first: str, second: str) -> bool:
    """`same_answer` without its time bound."""
    try:
        parsed = [_parse_prediction(answer) for answer in (first, second)]
        if not all(parsed):
            return False
        return bool(verify(parsed[0], parsed[1], timeout_seconds=None))
    except (Exception, TimeoutException):
        return False


def _accuracy(completions: list, answer: list[str], strict: bool) -> list[float]:
    if answer is None:
        raise ValueError("answer is None: the dataset needs an 'answer' column with the gold numbers")
    if len(completions) != len(answer):
        raise ValueError(f"completions ({len(completions)}) and answer ({len(answer)}) must have the same length")
    _quiet_math_verify()
    calls = [
        (message_text(c), None if gold is None else str(gold), strict)
        for c, gold in zip(completions, answer, strict=True)
    ]
    scores, gave_up = run_bounded(_score, calls, 0.0)
    _say_gave_up("gsm8k_strict_accuracy" if strict else "gsm8k_accuracy", gave_up, len(calls))
    return scores


def _score(text: str | None, gold: str | None, strict: bool) -> float:
    """One completion's accuracy reward, without a time bound (`run_bounded` gives it one)."""
    if not isinstance(text, str) or gold is None:
        return 0.0
    prediction = _extract_final_answer(text, strict)
    return float(prediction is not None and _answer_is_correct(prediction, gold))


def _say_gave_up(name: str, gave_up: int, total: int) -> None:
    if gave_up:
        logger.warning(f"{name}: gave up on {gave_up} of {total} answers (checking each took over "
                       f"{bounded.ANSWER_TIMEOUT_S:g} s); they count as wrong")  # fmt: skip


def bounded_one(function: Callable, args: tuple, default, name: str):
    """`function`(*args) within `bounded.ANSWER_TIMEOUT_S` seconds, `default` (and a warning) if it ran out of time."""
    _quiet_math_verify()
    (result,), gave_up = run_bounded(function, [args], default)
    _say_gave_up(name, gave_up, 1)
    return result


# what the answer worker may run, by name (`bounded`)
BOUNDED: dict[str, Callable] = {f.__name__: f for f in (_score, _extract_final_answer, _answer_is_correct,
                                                           _same_answer)}  # fmt: skip


def gsm8k_accuracy(completions: list, answer: list[str], **kwargs) -> list[float]:
    r"""Lenient accuracy reward: 1.0 if the completion's final answer equals the gold number, else 0.0.

    The final answer is the last complete ``\boxed{...}``; without one, the last number in the text (see
    `extract_final_answer` with ``strict=False``). Lenient so that early in training, before the model has learned
    to box, a right answer still gets signal; `gsm8k_format` rewards the boxing.

    Args:
        completions: B*G completions, each a string or a list of messages (the last one's ``"content"`` is read).
        answer: B*G gold answers as plain number strings ("1234", "-3", "0.5"), e.g. from
            `gold_answer_from_solution`.
        **kwargs: other dataset columns and trainer arguments, ignored.

    Returns:
        B*G rewards in {0.0, 1.0}; 0.0 for any malformed completion or unparseable gold.

    Raises:
        ValueError: only if ``completions`` and ``answer`` differ in length (a caller bug); never for content.
    """
    return _accuracy(completions, answer, strict=False)


def gsm8k_strict_accuracy(completions: list, answer: list[str], **kwargs) -> list[float]:
    r"""Strict accuracy reward: as `gsm8k_accuracy`, but only a complete ``\boxed{...}`` answer counts.

    Args, Returns, Raises: as `gsm8k_accuracy`.
    """
    return _accuracy(completions, answer, strict=True)


def _has_format(text: str) -> bool:
    """The `gsm8k_format` rule on one completion text (see there)."""
    if text.count(_BOXED) != 1:
        return False
    start = text.find(_BOXED)
    span = _boxed_span(text, start)
    if span is None or not text[span[0] : span[1]].strip():
        return False
    reasoning = "".join(text[max(0, start - _MAX_PARSE_CHARS) : start].split())
    return len(reasoning) >= _MIN_REASONING_CHARS and len(text[span[1] + 1 :].strip()) <= _MAX_TRAILING_CHARS


def gsm8k_format(completions: list, **kwargs) -> list[float]:
    r"""Format reward: 1.0 if the completion is step-by-step reasoning followed by one final boxed answer, else 0.0.

    Precisely, all of:
        1. the text contains ``\boxed`` exactly once;
        2. it is immediately followed by ``{`` whose matching ``}`` comes within 4096 characters (balanced braces,
           so ``\boxed{\frac{1}{2}}`` is fine and ``\boxed{18`` is not);
        3. the content between them is not empty or whitespace;
        4. before ``\boxed`` there are at least 20 non-whitespace characters of reasoning;
        5. after the closing ``}`` there are at most 40 characters once whitespace is stripped (room for "$.",
           "\]" or " dollars.", not for more reasoning): the boxed answer is the final one.

    Args:
        completions: B*G completions, each a string or a list of messages (the last one's ``"content"`` is read).
        **kwargs: dataset columns and trainer arguments, ignored.

    Returns:
        B*G rewards in {0.0, 1.0}; 0.0 for any malformed completion. Never raises.
    """
    return [float(_has_format(message_text(c))) for c in completions]


REWARD_FUNCS: dict[str, Callable[..., list[float]]] = {
    "gsm8k_accuracy": gsm8k_accuracy,
    "gsm8k_strict_accuracy": gsm8k_strict_accuracy,
    "gsm8k_format": gsm8k_format,
}

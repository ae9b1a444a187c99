"""Policy groups (sets of prompts, not GRPO's generation groups): assignment, clustering, merges and splits."""

import json
import re
import warnings
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
from datasets import Dataset
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.exceptions import ConvergenceWarning

from trl_grpo_ext.dataset_preparation import check_dataset_columns
from trl_grpo_ext.gsm8k.data import gsm8k_difficulty
from trl_grpo_ext.policy_groups.assignment import (
    assign_from_callable,
    assign_from_column,
    canonical_labels,
    kmeans_assign,
    kmeans_groups,
    prompt_texts,
    tfidf_features,
)
from trl_grpo_ext.policy_groups.regrouping import apply_merge, apply_split, plan_merge, plan_split


@pytest.fixture
def tasks() -> Dataset:
    return Dataset.from_dict(
        {"prompt": ["p0", "p1", "p2", "p3"], "task": ["math", "code", "math", "chat"], "level": [2, 10, 2, 3]}
    )


def test_assign_from_column_sorts_names(tasks):
    names, assignment = assign_from_column(tasks, "task")
    # sorted names: chat=0, code=1, math=2; rows math, code, math, chat
    assert names == ["chat", "code", "math"]
    assert_array_equal(assignment, [2, 1, 2, 0])
    assert assignment.dtype == np.int64
    # values are stringified before sorting: "10" < "2" < "3" as strings
    names, assignment = assign_from_column(tasks, "level")
    assert names == ["10", "2", "3"]
    assert_array_equal(assignment, [1, 0, 1, 2])


def test_missing_column_lists_the_columns(tasks):
    """The trainer checks the column before `assign_from_column` runs (`check_dataset_columns`, before the model
    loads), naming the dataset's columns."""
    message = (
        "policy_group_column='source' is not a column of the training dataset; "
        "its columns are ['prompt', 'task', 'level']"
    )
    args = SimpleNamespace(policy_group_column="source", remove_unused_columns=False)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_dataset_columns(tasks, None, args)


def test_assign_from_callable(tasks):
    names, assignment = assign_from_callable(tasks, lambda ex: "hard" if ex["level"] > 2 else "easy")
    # levels 2, 10, 2, 3 -> easy, hard, easy, hard; easy=0, hard=1
    assert names == ["easy", "hard"]
    assert_array_equal(assignment, [0, 1, 0, 1])


def test_assign_from_callable_rejects_non_string(tasks):
    def fn(ex):
        return ex["task"] if ex["task"] != "chat" else 7

    with pytest.raises(ValueError, match=r"returned 7 \(int\) for row 3; a policy group name must be a str"):
        assign_from_callable(tasks, fn)


def test_prompt_texts_plain_and_conversational():
    assert prompt_texts(Dataset.from_dict({"prompt": ["a b", "c"]})) == ["a b", "c"]
    conversational = [
        [{"role": "system", "content": "You are a tutor."}, {"role": "user", "content": "How many apples?"}],
        [
            {"role": "user", "content": "First question"},
            {"role": "assistant", "content": "An answer"},
            {"role": "user", "content": "Second question"},
        ],
    ]
    texts = prompt_texts(Dataset.from_list([{"prompt": p} for p in conversational]))
    # system and assistant turns are left out; user turns joined by "\n"
    assert texts == ["How many apples?", "First question\nSecond question"]


def test_tfidf_ignores_numbers_and_stop_words():
    features = tfidf_features(["Ava has 3 apples", "Ava has 12 apples", "the 42", "train speed"])
    assert sp.issparse(features) and features.shape[0] == 4
    # same words, different numbers: same row; "the 42" has no kept word: a zero row; others have unit L2 norm
    assert_allclose(features[0].toarray(), features[1].toarray())
    assert_allclose(np.sqrt(features.multiply(features).sum(axis=1)).A1, [1.0, 1.0, 0.0, 1.0])
    # vocabulary: ava, apples, speed, train ("has" and "the" are English stop words)
    assert features.shape[1] == 4


def test_canonical_labels_order_by_first_row():
    # first rows: label 7 at row 0, label 3 at row 2, label 5 at row 3 -> 7->0, 3->1, 5->2
    assert_array_equal(canonical_labels(np.array([7, 7, 3, 5, 3])), [0, 0, 1, 2, 1])


TOPICS = {
    "speed": [
        "A train travels miles per hour at constant speed",
        "The car drove miles in hours at what speed",
        "A cyclist rides miles each hour at steady speed",
        "How many hours does the train need at this speed for those miles",
    ],
    "money": [
        "She bought apples and paid dollars at the store",
        "He paid dollars for books at the store",
        "The store sells pencils; she paid dollars for them",
        "They bought shirts at the store and paid dollars",
    ],
    "age": [
        "His age in years is twice his sister age",
        "In years her age will be twice her brother age",
        "The sum of their ages in years, age of the father",
        "Her age now is years younger than her cousin age",
    ],
}


def _topic_texts():
    """Twelve texts in an interleaved order, and each text's topic index (speed 0, money 1, age 2)."""
    texts, truth = [], []
    for k in range(4):
        for topic, rows in enumerate(TOPICS.values()):
            texts.append(rows[k])
            truth.append(topic)
    return texts, np.array(truth)


def test_kmeans_recovers_three_topics_with_canonical_ids():
    texts, truth = _topic_texts()
    names, assignment = kmeans_groups(tfidf_features(texts), 3, seed=0)
    assert names == ["cluster0", "cluster1", "cluster2"]
    # rows 0, 1, 2 are speed, money, age: canonical ids make the labels equal the truth exactly
    assert_array_equal(assignment, truth)


def test_kmeans_is_deterministic_and_canonical_under_shuffling():
    texts, _ = _topic_texts()
    features = tfidf_features(texts)
    first = kmeans_assign(features, 3, seed=5)
    assert_array_equal(kmeans_assign(features, 3, seed=5), first)
    perm = np.random.default_rng(0).permutation(len(texts))
    shuffled = kmeans_assign(features[perm], 3, seed=5)
    back = np.empty_like(shuffled)
    back[perm] = shuffled  # back[i]: label of original row i
    # same partition; relabeled canonically in the original row order, the same ids
    assert_array_equal(canonical_labels(back), first)


def test_kmeans_number_of_groups_is_checked():
    features = np.zeros((6, 2))
    for bad in (0, 7):
        with pytest.raises(ValueError, match=rf"num_policy_groups \({bad}\) must be between 1 and .* prompts \(6\)"):
            kmeans_assign(features, bad, seed=0)
    names, assignment = kmeans_groups(features, 1, seed=0, prefix="topic")
    assert names == ["topic0"] and assignment.tolist() == [0] * 6


def test_kmeans_on_duplicate_rows_returns_fewer_groups():
    features = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # sklearn: 2 distinct clusters < n_clusters=3
        names, assignment = kmeans_groups(features, 3, seed=0)
    assert names == ["cluster0", "cluster1"]
    assert_array_equal(assignment, [0, 0, 0, 1])


def test_plan_merge_picks_closest_pair():
    names = ["a", "b", "c", "d"]
    reward = np.array([0.10, 0.50, 0.53, 0.11])
    std = np.array([0.30, 0.30, 0.30, 0.34])
    # (0, 3): |dr| 0.01, |ds| 0.04 -> 0.04; (1, 2): 0.03, 0.00 -> 0.03; any other pair has |dr| >= 0.39
    i, j, reason = plan_merge(names, reward, std, tol=0.05, min_groups=2)
    assert (i, j) == (1, 2)
    assert reason == "merge 'b' and 'c': reward 0.500 vs 0.530, reward std 0.300 vs 0.300, both within tol=0.05"
    # tol 0.035 still admits (1, 2) only; tol 0.02 admits neither
    assert plan_merge(names, reward, std, tol=0.035, min_groups=2)[:2] == (1, 2)
    assert plan_merge(names, reward, std, tol=0.02, min_groups=2) is None
    # already at min_groups
    assert plan_merge(names, reward, std, tol=0.05, min_groups=4) is None
    # a group not seen yet (NaN) never matches: (0, 3) is left
    assert plan_merge(names, np.array([0.10, np.nan, 0.53, 0.11]), std, tol=0.05, min_groups=2)[:2] == (0, 3)


def test_plan_split_bimodal():
    ids = np.arange(10, 20)
    success = np.array([0.0, 0.0, 0.125, 0.0, 0.125, 0.875, 1.0, 1.0, 0.875, 1.0])
    # low: 0.25 / 5 = 0.05; high: 4.75 / 5 = 0.95; gap 0.90
    low, high, reason = plan_split("math", ids, success, min_size=5, min_gap=0.5)
    assert_array_equal(low, [10, 11, 12, 13, 14])
    assert_array_equal(high, [15, 16, 17, 18, 19])
    assert reason == (
        "split 'math' into 'math/lo' (5 prompts, mean success 0.05) and 'math/hi' (5 prompts, mean success 0.95): "
        "gap 0.90 >= min_gap=0.5"
    )
    assert plan_split("math", ids, success, min_size=6, min_gap=0.5) is None
    assert plan_split("math", ids, success, min_size=5, min_gap=0.95) is None


def test_plan_split_is_the_exact_two_means():
    # sorted rates 0, 0.1, 0.2, 1.0; sums of squares of the three cuts:
    #   {0} | {0.1, 0.2, 1.0}: 0 + (0.0044 + 0.0544 + 0.3211 ... = 0.4867)
    #   {0, 0.1} | {0.2, 1.0}: 0.005 + 0.32 = 0.325
    #   {0, 0.1, 0.2} | {1.0}: 0.02 + 0 = 0.02  <- least; means 0.1 and 1.0
    ids = np.array([3, 1, 2, 0])
    low, high, _ = plan_split("g", ids, np.array([1.0, 0.1, 0.0, 0.2]), min_size=1, min_gap=0.5)
    assert_array_equal(low, [1, 2, 0])  # in the order of prompt_ids
    assert_array_equal(high, [3])


def test_plan_split_unimodal_and_bad_input():
    ids = np.arange(6)
    # spread 0.4..0.6: best cut {0.4, 0.45} | {0.5, 0.5, 0.5, 0.6}, means 0.425 and 0.525, gap 0.1 < 0.5
    assert plan_split("g", ids, np.array([0.4, 0.5, 0.5, 0.6, 0.5, 0.45]), min_size=1, min_gap=0.5) is None
    assert plan_split("g", ids, np.full(6, 0.5), min_size=1, min_gap=0.0) is None  # nothing to cut
    with pytest.raises(ValueError, match="same length"):
        plan_split("g", ids, np.zeros(5), min_size=1, min_gap=0.5)
    with pytest.raises(ValueError, match="NaN"):
        plan_split("g", ids, np.array([0.0, 1, 1, 1, 1, np.nan]), min_size=1, min_gap=0.5)


def test_apply_merge_renumbers():
    names, assignment = ["a", "b", "c", "d"], np.array([0, 1, 2, 3, 2, 1])
    new_names, new_assignment = apply_merge(names, assignment, 1, 3)
    # d (3) folds into b (1); c keeps 2
    assert new_names == ["a", "b+d", "c"]
    assert_array_equal(new_assignment, [0, 1, 2, 1, 2, 1])
    assert names == ["a", "b", "c", "d"] and assignment.tolist() == [0, 1, 2, 3, 2, 1]
    assert_array_equal(apply_merge(names, np.arange(4), 0, 2)[1], [0, 1, 0, 2])  # old id -> new id
    with pytest.raises(ValueError, match=r"0 <= i < j < 4 \(got i=2, j=2\)"):
        apply_merge(names, assignment, 2, 2)


def test_apply_split_appends_the_high_group():
    names, assignment = ["a", "b"], np.array([0, 1, 1, 0, 1])
    new_names, new_assignment = apply_split(names, assignment, 1, np.array([4, 1]))
    assert new_names == ["a", "b/lo", "b/hi"]
    assert_array_equal(new_assignment, [0, 2, 1, 0, 2])
    assert assignment.tolist() == [0, 1, 1, 0, 1]
    for bad in ([0], [], [1, 2, 4]):  # a row of another group; none; all of them
        with pytest.raises(ValueError, match=r"splitting 'b' needs 1..2 of its own rows in high_ids"):
            apply_split(names, assignment, 1, np.array(bad, dtype=np.int64))


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("#### 5", "1-2 steps"),
        ("2 + 3 = <<2+3=5>>5\n#### 5", "1-2 steps"),
        ("a = 1\n\nb = 2\n#### 3", "1-2 steps"),  # the blank line is not a step
        ("a\nb\nc\n#### 1", "3 steps"),
        ("a\nb\nc\nd\n#### 1", "4 steps"),
        ("a\nb\nc\nd\ne\n#### 1", "5+ steps"),
        ("\n".join("s" * 9) + "\n#### 1", "5+ steps"),
    ],
)
def test_gsm8k_difficulty_bins(solution, expected):
    assert gsm8k_difficulty(solution) == expected


def test_gsm8k_difficulty_needs_an_answer_line():
    with pytest.raises(ValueError, match="no '#### answer' line"):
        gsm8k_difficulty("a = 1\nso 1")


def test_gsm8k_difficulty_on_real_train_split(gsm8k_dir):
    lines = (gsm8k_dir / "train.jsonl").read_text().splitlines()
    counts = Counter(gsm8k_difficulty(json.loads(line)["answer"]) for line in lines)
    # per-step counts 2: 1961, 3: 2149, 4: 1659, 5..9: 955 + 419 + 227 + 90 + 13 = 1704
    assert counts == {"1-2 steps": 1961, "3 steps": 2149, "4 steps": 1659, "5+ steps": 1704}

"""Assigning prompts to policy groups at the start of a run: by a dataset column, a function of the row, or k-means
over the prompts' TF-IDF features; and each row's key (column value or function name),
by which evaluation rows find the group that now holds their key. Pure functions.

Representation everywhere: `names: list[str]` (index = group id) and `assignment: np.ndarray` of int64, shape (N,),
the group id (0..K-1) of each dataset row. Functions return a new `(names, assignment)` and never mutate inputs.
scikit-learn is imported only by the k-means and TF-IDF functions, when such a grouping runs.
"""

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from datasets import Dataset

from ..dataset_preparation import message_text

if TYPE_CHECKING:
    import scipy.sparse as sp

KMEANS_N_INIT = 10  # k-means++ restarts; the best inertia wins (Arthur & Vassilvitskii, 2007)


def _names_and_assignment(keys: list[str]) -> tuple[list[str], np.ndarray]:
    """Sorted distinct `keys` as group names, and each key's group id: shape (N,) int64."""
    names, ids = np.unique(np.array(keys, dtype=object), return_inverse=True)  # sorted as Python sorts strings
    return list(names), ids.astype(np.int64).reshape(-1)


def assign_from_column(dataset: Dataset, column: str) -> tuple[list[str], np.ndarray]:
    """One policy group per distinct (stringified) value of `column`; names sorted, so the result is deterministic.

    `column` must be a column of `dataset`: the trainer checks that before it loads the model, naming the dataset's
    columns (`dataset_preparation.check_dataset_columns`).

    Raises:
        ValueError: a row has no value (None) in `column` (the message names the row).
    """
    values = dataset[column]
    missing = next((i for i, value in enumerate(values) if value is None), None)
    if missing is not None:
        raise ValueError(f"policy_group_column={column!r} is None in row {missing}: every prompt needs a group")
    return _names_and_assignment([str(value) for value in values])


def assign_from_callable(dataset: Dataset, fn: Callable[[dict], str]) -> tuple[list[str], np.ndarray]:
    """One policy group per distinct `fn(example)` over the rows of `dataset`; names sorted.

    Raises:
        ValueError: `fn` returned something other than a `str`; the message gives the row index and the value.
    """
    keys = []
    for index, example in enumerate(dataset):
        key = fn(example)
        if not isinstance(key, str):
            raise ValueError(f"the policy group function returned {key!r} ({type(key).__name__}) for row {index}; "
                             "a policy group name must be a str")  # fmt: skip
        keys.append(key)
    return _names_and_assignment(keys)


def prompt_texts(dataset: Dataset) -> list[str]:
    """The text of each row's `prompt`, for clustering.

    A plain-string prompt is used as is. A conversational prompt (list of `{"role", "content"}` messages) gives the
    contents of its `"user"` messages joined by "\\n" (a content may be a list of `{"type": "text"}` parts); system
    and assistant turns are left out, as they are usually the same on every row (a shared system prompt, few-shot
    answers) and would only blur the clusters.
    """
    return [
        prompt if isinstance(prompt, str) else "\n".join(message_text(m) for m in prompt if m.get("role") == "user")
        for prompt in dataset["prompt"]
    ]


def tfidf_features(texts: list[str]) -> "sp.csr_matrix":
    """TF-IDF features of `texts`: sparse (N, V) float64, each row L2-normalized (k-means on it ~ cosine distance).

    Settings: lowercase; tokens are words of 2+ letters (`[^\\W\\d_]{2,}`: numbers are left out, so problems cluster
    by topic, not by the numbers in them); English stop words removed; sublinear tf (1 + log tf); smooth idf.
    Deterministic: the vocabulary is sorted. Raises ValueError (sklearn's "empty vocabulary") if no text has a word.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(
        lowercase=True, token_pattern=r"(?u)\b[^\W\d_]{2,}\b", stop_words="english", sublinear_tf=True
    )
    return vectorizer.fit_transform(texts).tocsr()


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Relabel a partition so that ids are 0, 1, ... in order of each cluster's smallest row index: (N,) int64.

    The same partition of the rows always gets the same ids, whatever ids the clustering gave it.
    """
    _, first, inverse = np.unique(np.asarray(labels), return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse.reshape(-1)]  # each cluster's rank by its first row


def kmeans_assign(features, num_groups: int, seed: int) -> np.ndarray:
    """k-means labels of the rows of `features` (dense (N, D) or scipy sparse), canonical ids: (N,) int64.

    sklearn `KMeans(n_clusters=num_groups, random_state=seed, n_init=KMEANS_N_INIT)`, Lloyd's algorithm, relabeled
    with `canonical_labels`: the same features and seed give the same ids. If the rows have fewer than `num_groups`
    distinct vectors, fewer labels come back (0..k-1, k < num_groups).

    Raises:
        ValueError: `num_groups` is below 1 or above the number of rows.
    """
    n = features.shape[0]
    if not 1 <= num_groups <= n:
        raise ValueError(f"num_policy_groups ({num_groups}) must be between 1 and the number of prompts ({n})")
    from sklearn.cluster import KMeans

    kmeans = KMeans(n_clusters=num_groups, random_state=seed, n_init=KMEANS_N_INIT, algorithm="lloyd")
    return canonical_labels(kmeans.fit_predict(features))


def kmeans_groups(features, num_groups: int, seed: int, prefix: str = "cluster") -> tuple[list[str], np.ndarray]:
    """`kmeans_assign` as policy groups named `f"{prefix}{id}"` ("cluster0", "cluster1", ...)."""
    assignment = kmeans_assign(features, num_groups, seed)
    return [f"{prefix}{i}" for i in range(int(assignment.max(initial=-1)) + 1)], assignment


def assign_groups(dataset: Dataset, args, fn: Callable[[dict], str] | None) -> tuple[list[str], np.ndarray]:
    """The policy groups a run starts with: by `fn` (the trainer's `policy_group_fn`) when given, else by
    `args.policy_group_column`, else k-means (`num_policy_groups`, seeded by `args.seed`) over the TF-IDF features of
    the prompts. Raises the ValueError of the assignment it runs."""
    if fn is not None:
        return assign_from_callable(dataset, fn)
    if args.policy_group_column is not None:
        return assign_from_column(dataset, args.policy_group_column)
    return kmeans_groups(tfidf_features(prompt_texts(dataset)), args.num_policy_groups, args.seed)


def row_key(row: dict, fn, column: str | None) -> str | None:
    """The key that placed a dataset row in its group at the start: `fn(row)` (`policy_group_fn`) or the row's
    `column` value, as a string; None for k-means groups or a row the function cannot name."""
    if fn is not None:
        try:
            return str(fn(row))
        except Exception:  # an evaluation row may lack what the function reads: it is reported as unassigned
            return None
    return str(row[column]) if column is not None and row.get(column) is not None else None


def group_of_key(keys: list[str | None], assignment: list[int], names: list[str]) -> dict[str, str]:
    """Key -> name of the current group holding most training rows with that key, from each training row's key
    (`row_key`) and group id (groups get split, merged and renamed during training; keys stay). {} without keys."""
    votes: dict[str, Counter] = {}  # key -> {group id: rows}
    for key, group in zip(keys, assignment, strict=True) if keys else ():
        if key is not None:
            votes.setdefault(key, Counter())[group] += 1
    return {key: names[max(count, key=count.get)] for key, count in votes.items()}

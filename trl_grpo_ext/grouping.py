"""Policy groups: assigning prompts to groups, and planning merges and splits of groups. Pure functions.

A *policy group* is a set of prompts sharing a task, data source, difficulty or cluster. It is not GRPO's
*generation group* (the `num_generations` completions of one prompt); nothing here looks at completions.

Representation everywhere: `names: list[str]` (index = group id) and `assignment: np.ndarray` of int64, shape (N,),
the group id (0..K-1) of each dataset row. Functions return a new `(names, assignment)` and never mutate inputs.

Carrying per-group statistic arrays (shape (K,)) across a regroup is the caller's job. The trainer's
`PolicyGroupState.regroup` derives each new group's parents from the old and new assignments, which covers merges,
splits and refinements alike; `remap_after_merge` and `parents_after_split` give the same maps for one merge or one
split, for callers that keep their own arrays.
"""

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
import torch
from datasets import Dataset
from sklearn.cluster import KMeans
from sklearn.feature_extraction.text import TfidfVectorizer

from .rewards import completion_text

KMEANS_N_INIT = 10  # k-means++ restarts; the best inertia wins (Arthur & Vassilvitskii, 2007)
ROW_COLUMN = "policy_group_row"  # added to the training dataset when policy grouping is on: each row's index


def _names_and_assignment(keys: list[str]) -> tuple[list[str], np.ndarray]:
    """Sorted distinct `keys` as group names, and each key's group id: shape (N,) int64."""
    names = sorted(set(keys))
    index = {name: i for i, name in enumerate(names)}
    return names, np.array([index[key] for key in keys], dtype=np.int64)


def assign_from_column(dataset: Dataset, column: str) -> tuple[list[str], np.ndarray]:
    """One policy group per distinct (stringified) value of `column`; names sorted, so the result is deterministic.

    Raises:
        ValueError: `column` is not a column of `dataset` (the message lists the dataset's columns), or a row has no
            value (None) in it (the message names the row).
    """
    if column not in dataset.column_names:
        raise ValueError(
            f"policy_group_column={column!r} is not a column of the training dataset; "
            f"its columns are {[c for c in dataset.column_names if c != ROW_COLUMN]}"
        )
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
            raise ValueError(
                f"the policy group function returned {key!r} ({type(key).__name__}) for row {index}; "
                "a policy group name must be a str"
            )
        keys.append(key)
    return _names_and_assignment(keys)


def prompt_texts(dataset: Dataset) -> list[str]:
    """The text of each row's `prompt`, for clustering.

    A plain-string prompt is used as is. A conversational prompt (list of `{"role", "content"}` messages) gives the
    contents of its `"user"` messages joined by "\\n" (a content may be a list of `{"type": "text"}` parts); system
    and assistant turns are left out, as they are usually the same on every row (a shared system prompt, few-shot
    answers) and would only blur the clusters.
    """
    texts = []
    for prompt in dataset["prompt"]:
        if isinstance(prompt, str):
            texts.append(prompt)
        else:
            texts.append("\n".join(completion_text(m) for m in prompt if m.get("role") == "user"))
    return texts


def tfidf_features(texts: list[str]) -> sp.csr_matrix:
    """TF-IDF features of `texts`: sparse (N, V) float64, each row L2-normalized (k-means on it ~ cosine distance).

    Settings: lowercase; tokens are words of 2+ letters (`[^\\W\\d_]{2,}`: numbers are left out, so problems cluster
    by topic, not by the numbers in them); English stop words removed; sublinear tf (1 + log tf); smooth idf.
    Deterministic: the vocabulary is sorted. Raises ValueError (sklearn's "empty vocabulary") if no text has a word.
    """
    vectorizer = TfidfVectorizer(
        lowercase=True, token_pattern=r"(?u)\b[^\W\d_]{2,}\b", stop_words="english", sublinear_tf=True
    )
    return vectorizer.fit_transform(texts).tocsr()


def embedding_features(
    model: torch.nn.Module, tokenizer, texts: list[str], batch_size: int = 32, max_length: int = 256
) -> np.ndarray:
    """Mean of the model's *input embeddings* over each text's tokens: shape (N, H) float32, H the hidden size.

    Only the embedding table (`model.get_input_embeddings()`) is used, no forward pass through the transformer:
    cheap (a lookup, no attention), deterministic (no dropout, no dependence on batch or padding), and it works on
    any model whose input embeddings are plain (as under LoRA or 4-bit QLoRA). Texts are tokenized without special
    tokens (a BOS shared by every row would only pull rows together) and truncated to `max_length` tokens; padding
    is done here, so the tokenizer needs no pad token. An empty text gives a zero vector. Runs under
    `torch.no_grad()` on the embedding table's device, in float32.
    """
    embed = model.get_input_embeddings()
    device = embed.weight.device
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = texts[start : start + batch_size]
            ids = tokenizer(batch, add_special_tokens=False, truncation=True, max_length=max_length)["input_ids"]
            longest = max(1, max(len(x) for x in ids))
            padded = torch.zeros(len(ids), longest, dtype=torch.long)  # (b, T)
            mask = torch.zeros(len(ids), longest)  # (b, T)
            for row, x in enumerate(ids):
                padded[row, : len(x)] = torch.tensor(x, dtype=torch.long)
                mask[row, : len(x)] = 1.0
            padded, mask = padded.to(device), mask.to(device)
            vectors = embed(padded).float()  # (b, T, H)
            summed = (vectors * mask.unsqueeze(-1)).sum(dim=1)  # (b, H)
            out.append((summed / mask.sum(dim=1, keepdim=True).clamp(min=1.0)).cpu())
    hidden = embed.weight.shape[1]
    return torch.cat(out).numpy().astype(np.float32) if out else np.zeros((0, hidden), dtype=np.float32)


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Relabel a partition so that ids are 0, 1, ... in order of each cluster's smallest row index: (N,) int64.

    The same partition of the rows always gets the same ids, whatever ids the clustering gave it.
    """
    uniques, first, inverse = np.unique(np.asarray(labels), return_index=True, return_inverse=True)
    rank = np.empty(len(uniques), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(uniques))
    return rank[inverse.reshape(-1)]


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
    if num_groups == 1:
        return np.zeros(n, dtype=np.int64)
    kmeans = KMeans(n_clusters=num_groups, random_state=seed, n_init=KMEANS_N_INIT, algorithm="lloyd")
    return canonical_labels(kmeans.fit_predict(features))


def kmeans_groups(features, num_groups: int, seed: int, prefix: str = "cluster") -> tuple[list[str], np.ndarray]:
    """`kmeans_assign` as policy groups named `f"{prefix}{id}"` ("cluster0", "cluster1", ...)."""
    assignment = kmeans_assign(features, num_groups, seed)
    return [f"{prefix}{i}" for i in range(int(assignment.max(initial=-1)) + 1)], assignment


def _check(names: list[str], assignment: np.ndarray, features=None) -> np.ndarray:
    """`assignment` as (N,) int64; ValueError unless its ids are in 0..len(names)-1 and `features` has N rows."""
    assignment = np.asarray(assignment, dtype=np.int64)
    if assignment.ndim != 1 or (assignment.size and not 0 <= assignment.min() <= assignment.max() < len(names)):
        raise ValueError(f"assignment must be 1-D with group ids in 0..{len(names) - 1} (one per policy group name)")
    if features is not None and features.shape[0] != assignment.shape[0]:
        raise ValueError(f"features have {features.shape[0]} rows but assignment has {assignment.shape[0]}")
    return assignment


def _rows(features, rows: np.ndarray):
    """The given rows of dense or sparse `features`."""
    return features.tocsr()[rows] if sp.issparse(features) else np.asarray(features)[rows]


def _centroid(features, rows: np.ndarray) -> np.ndarray:
    """Mean of the given rows of dense or sparse `features`: shape (D,)."""
    return np.asarray(_rows(features, rows).mean(axis=0)).ravel()


def refine_groups(
    names: list[str], assignment: np.ndarray, features, parts: int, seed: int, max_groups: int
) -> tuple[list[str], np.ndarray]:
    """Coarse to fine: split policy groups into up to `parts` k-means sub-clusters of their rows' `features`.

    Groups are split largest first (ties: lower id) while the total stays within `max_groups`: a group of n rows is
    split into k = min(parts, n // 2, 1 + groups still allowed) clusters (so children average 2+ rows) and is left
    whole when k < 2, or when its rows are all identical. Children are named "<parent>/0", "<parent>/1", ... and take
    the parent's place in the order. Deterministic: k-means per group with `seed`, canonical ids.

    Raises:
        ValueError: `parts` < 2, or `assignment`/`features` do not fit `names`.
    """
    assignment = _check(names, assignment, features)
    if parts < 2:
        raise ValueError(f"policy group refinement needs parts >= 2 (got {parts})")
    sizes = np.bincount(assignment, minlength=len(names))
    budget = max_groups - len(names)
    children: dict[int, np.ndarray] = {}
    for group in sorted(range(len(names)), key=lambda g: (-sizes[g], g)):
        rows = np.flatnonzero(assignment == group)
        k = min(parts, len(rows) // 2, budget + 1)
        if k < 2:
            continue
        labels = kmeans_assign(_rows(features, rows), k, seed)
        if labels.max() > 0:
            children[group] = labels
            budget -= int(labels.max())
    new_names, new_assignment = [], np.empty_like(assignment)
    for group, name in enumerate(names):
        rows = assignment == group
        if group in children:
            new_assignment[rows] = len(new_names) + children[group]
            new_names += [f"{name}/{k}" for k in range(int(children[group].max()) + 1)]
        else:
            new_assignment[rows] = len(new_names)
            new_names.append(name)
    return new_names, new_assignment


def remap_after_merge(num_groups: int, i: int, j: int) -> np.ndarray:
    """Old group id -> new group id after `apply_merge(..., i, j)`: shape (K,) int64; j goes to i, ids above j shift
    down by one. Example: K=4, i=0, j=2 -> [0, 1, 0, 2]."""
    if not 0 <= i < j < num_groups:
        raise ValueError(f"a merge needs 0 <= i < j < {num_groups} (got i={i}, j={j})")
    old = np.arange(num_groups, dtype=np.int64)
    return np.where(old == j, i, old - (old > j))


def parents_after_split(num_groups: int, group: int) -> np.ndarray:
    """New group id -> old group id after `apply_split(..., group, ...)`: shape (K+1,) int64; both children map to
    `group`. Per-group statistics carry over as `stat[parents_after_split(K, group)]`."""
    return np.append(np.arange(num_groups, dtype=np.int64), group)


def _merge(names: list[str], assignment: np.ndarray, i: int, j: int, name: str) -> tuple[list[str], np.ndarray]:
    """Groups i and j (i < j) as one group named `name` at id i; ids renumbered contiguous."""
    new_names = [n for k, n in enumerate(names) if k != j]
    new_names[i] = name
    return new_names, remap_after_merge(len(names), i, j)[assignment]


def apply_merge(names: list[str], assignment: np.ndarray, i: int, j: int) -> tuple[list[str], np.ndarray]:
    """Fold policy group j into group i (i < j): the merged group keeps id i and is named "<i>+<j>" (e.g. "a+b");
    ids above j shift down by one (see `remap_after_merge`).

    Raises:
        ValueError: not 0 <= i < j < K.
    """
    assignment = _check(names, assignment)
    remap_after_merge(len(names), i, j)  # validates i, j
    return _merge(names, assignment, i, j, f"{names[i]}+{names[j]}")


def apply_split(
    names: list[str], assignment: np.ndarray, group: int, high_ids: np.ndarray
) -> tuple[list[str], np.ndarray]:
    """Split policy group `group`: rows `high_ids` move to a new group "<name>/hi" appended at the end (id K); the
    rest stay at id `group`, renamed "<name>/lo".

    Raises:
        ValueError: a row of `high_ids` is not in `group`, or the split would leave either side empty.
    """
    assignment = _check(names, assignment)
    high_ids = np.asarray(high_ids, dtype=np.int64)
    in_group = np.flatnonzero(assignment == group)
    if not np.isin(high_ids, in_group).all():
        raise ValueError(f"high_ids must be rows of policy group {names[group]!r}")
    if len(np.unique(high_ids)) in (0, len(in_group)):
        raise ValueError(f"splitting {names[group]!r} needs 1..{len(in_group) - 1} rows in high_ids")
    new_assignment = assignment.copy()
    new_assignment[high_ids] = len(names)
    new_names = list(names)
    new_names[group] = f"{names[group]}/lo"
    return [*new_names, f"{names[group]}/hi"], new_assignment


def merge_small_groups(
    names: list[str], assignment: np.ndarray, min_size: int, features=None, min_groups: int = 1
) -> tuple[list[str], np.ndarray, list[str]]:
    """Merge every policy group with fewer than `min_size` rows into its nearest group, smallest first.

    Nearest: with `features` (dense or sparse, N rows), the group whose feature centroid (mean row) is closest in
    Euclidean distance to the small group's centroid; without, the smallest other group (ties: lower id). After
    each merge sizes and centroids are recomputed; the merged group is named "<target>+<small>" and takes the lower
    of the two ids. Stops when no group is small or `min_groups` groups are left (small ones may then remain).

    Returns:
        (names, assignment, merges): merges are reasons, e.g. "merged 'x' (3 prompts) into 'y': fewer than
        min_size=8 prompts".
    """
    assignment = _check(names, assignment, features)
    merges = []
    while len(names) > max(min_groups, 1):
        sizes = np.bincount(assignment, minlength=len(names))
        small = [g for g in np.argsort(sizes, kind="stable").tolist() if sizes[g] < min_size]
        if not small:
            break
        g = small[0]
        others = [k for k in range(len(names)) if k != g]
        if features is None:
            target = min(others, key=lambda k: (sizes[k], k))
        else:
            centroids = [_centroid(features, np.flatnonzero(assignment == k)) for k in range(len(names))]
            target = min(others, key=lambda k: (float(np.linalg.norm(centroids[k] - centroids[g])), k))
        merges.append(
            f"merged {names[g]!r} ({sizes[g]} prompts) into {names[target]!r}: fewer than min_size={min_size} prompts"
        )
        names, assignment = _merge(names, assignment, min(g, target), max(g, target), f"{names[target]}+{names[g]}")
    return names, assignment, merges


def plan_merge(
    names: list[str], ema_reward: np.ndarray, ema_reward_std: np.ndarray, tol: float, min_groups: int
) -> tuple[int, int, str] | None:
    """The pair of policy groups (i, j), i < j, that behave alike: |Δ ema_reward| < tol and |Δ ema_reward_std| < tol.

    Of all such pairs the closest, by the larger of the two differences (ties: lowest (i, j)). A NaN statistic (a
    group not yet seen) never matches. `ema_reward`, `ema_reward_std`: shape (K,), in reward units.

    Returns:
        (i, j, reason), or None when no pair qualifies or there are already `min_groups` groups or fewer.
    """
    r, s = np.asarray(ema_reward, dtype=float), np.asarray(ema_reward_std, dtype=float)
    if len(names) <= min_groups:
        return None
    best = None
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            dr, ds = abs(r[i] - r[j]), abs(s[i] - s[j])
            if dr < tol and ds < tol and (best is None or max(dr, ds) < best[0]):
                best = (max(dr, ds), i, j)
    if best is None:
        return None
    _, i, j = best
    reason = (
        f"merge {names[i]!r} and {names[j]!r}: ema_reward {r[i]:.3f} vs {r[j]:.3f}, "
        f"ema_reward_std {s[i]:.3f} vs {s[j]:.3f}, both within tol={tol}"
    )
    return i, j, reason


def plan_split(
    name: str, prompt_ids: np.ndarray, prompt_success: np.ndarray, min_size: int, min_gap: float
) -> tuple[np.ndarray, np.ndarray, str] | None:
    """Split a policy group whose per-prompt success rates are bimodal: exact 1-D 2-means.

    The rates are sorted and every split point between two distinct values is scanned; the one with the least
    within-cluster sum of squares wins (ties: the lowest point) -- the optimal 2-means of 1-D data, O(n log n),
    deterministic. The split is proposed only if both sides have >= `min_size` prompts and their mean rates differ
    by >= `min_gap`. Note: evenly spread rates on [0, 1] give a gap of 0.5, so `min_gap` > 0.5 splits only clearly
    bimodal groups.

    Args:
        prompt_ids: (n,) dataset row ids of the group's prompts.
        prompt_success: (n,) success rate of each prompt, in [0, 1] (e.g. mean accuracy over its completions).

    Returns:
        (low_ids, high_ids, reason), ids in the order of `prompt_ids`; or None.

    Raises:
        ValueError: the two arrays differ in shape, or a rate is NaN.
    """
    ids, x = np.asarray(prompt_ids), np.asarray(prompt_success, dtype=float)
    if ids.shape != x.shape or x.ndim != 1:
        raise ValueError(f"prompt_ids {ids.shape} and prompt_success {x.shape} must be 1-D of the same length")
    if np.isnan(x).any():
        raise ValueError(f"prompt_success of policy group {name!r} has NaN; pass only prompts that were scored")
    v = np.sort(x)
    n = len(v)
    splits = np.flatnonzero(v[1:] > v[:-1]) + 1  # left = v[:s], right = v[s:]
    if len(splits) == 0:
        return None
    c1, c2 = np.concatenate([[0.0], np.cumsum(v)]), np.concatenate([[0.0], np.cumsum(v * v)])
    left_sse = c2[splits] - c1[splits] ** 2 / splits
    right_sse = (c2[n] - c2[splits]) - (c1[n] - c1[splits]) ** 2 / (n - splits)
    s = int(splits[np.argmin(left_sse + right_sse)])
    low_mean, high_mean = c1[s] / s, (c1[n] - c1[s]) / (n - s)
    if min(s, n - s) < min_size or high_mean - low_mean < min_gap:
        return None
    high = x >= v[s]
    reason = (
        f"split {name!r} into '{name}/lo' ({s} prompts, mean success {low_mean:.2f}) and '{name}/hi' "
        f"({n - s} prompts, mean success {high_mean:.2f}): gap {high_mean - low_mean:.2f} >= min_gap={min_gap}"
    )
    return ids[~high], ids[high], reason


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

"""Regrouping during training: refining policy groups into k-means sub-clusters (coarse to fine), merging groups that
behave alike (at the start of fusion, among the groups that did well), splitting a group whose prompts' success rates
are bimodal. Pure functions: the `plan_*` functions decide, the `apply_*` ones build the new `(names, assignment)` (the
representation of `assignment`).

Carrying per-group statistic arrays (shape (K,)) across a regroup is the caller's job. `state.PolicyGroupState.regroup`
derives each new group's parents from the old and new assignments, which covers merges, splits and refinements
alike; `remap_after_merge` and `parents_after_split` give the same maps for one merge or one split, for callers that
keep their own arrays.
"""

import numpy as np

from .assignment import centroid, checked_assignment, feature_rows, kmeans_assign


def refine_groups(
    names: list[str], assignment: np.ndarray, features, *, parts: int, seed: int, max_groups: int
) -> tuple[list[str], np.ndarray]:
    """Coarse to fine: split policy groups into up to `parts` k-means sub-clusters of their rows' `features`.

    Groups are split largest first (ties: lower id) while the total stays within `max_groups`: a group of n rows is
    split into k = min(parts, n // 2, 1 + groups still allowed) clusters (so children average 2+ rows) and is left
    whole when k < 2, or when its rows are all identical. Children are named "<parent>/0", "<parent>/1", ... and take
    the parent's place in the order. Deterministic: k-means per group with `seed`, canonical ids.

    Raises:
        ValueError: `parts` < 2, or `assignment`/`features` do not fit `names`.
    """
    assignment = checked_assignment(names, assignment, features)
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
        labels = kmeans_assign(feature_rows(features, rows), k, seed)
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
    assignment = checked_assignment(names, assignment)
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
    assignment = checked_assignment(names, assignment)
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
    assignment = checked_assignment(names, assignment, features)
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
            centroids = [centroid(features, np.flatnonzero(assignment == k)) for k in range(len(names))]
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


def plan_fusion_merge(
    names: list[str], ema_reward: np.ndarray, ema_reward_std: np.ndarray, tol: float, min_groups: int
) -> tuple[int, int, str] | None:
    """At the start of fusion (`stages`): `plan_merge` among the groups that did well, those whose EMA reward is at
    least the mean over the groups seen (NaN: not seen). Shapes (K,), reward units. Returns (i, j, reason) or None."""
    r = np.asarray(ema_reward, dtype=float)
    if np.isnan(r).all():
        return None
    well = ~np.isnan(r) & (r >= np.nanmean(r))
    return plan_merge(names, np.where(well, r, np.nan), np.where(well, ema_reward_std, np.nan), tol, min_groups)


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

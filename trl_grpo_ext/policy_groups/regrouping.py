"""Regrouping during training: merging groups that behave alike (at the start of fusion, among the groups that did
well), splitting a group whose prompts' success rates are bimodal. Pure functions: the `plan_*` functions decide, the
`apply_*` ones build the new `(names, assignment)`. Carrying per-group statistics across a regroup is the caller's
job (`state.PolicyGroupState.regroup` derives each new group's share of the old ones from the two assignments).
"""

import numpy as np


def apply_merge(names: list[str], assignment: np.ndarray, i: int, j: int) -> tuple[list[str], np.ndarray]:
    """Fold policy group j into group i (i < j): the merged group keeps id i and is named "<i>+<j>" (e.g. "a+b");
    ids above j shift down by one. `assignment` (N,) holds each row's group id.

    Raises:
        ValueError: not 0 <= i < j < K.
    """
    if not 0 <= i < j < len(names):
        raise ValueError(f"a merge needs 0 <= i < j < {len(names)} (got i={i}, j={j})")
    assignment = np.asarray(assignment, dtype=np.int64)
    new_names = [name for k, name in enumerate(names) if k != j]
    new_names[i] = f"{names[i]}+{names[j]}"
    return new_names, np.where(assignment == j, i, assignment - (assignment > j))


def apply_split(names: list[str], assignment: np.ndarray, group: int, high_ids) -> tuple[list[str], np.ndarray]:
    """Split policy group `group`: rows `high_ids` move to a new group "<name>/hi" appended at the end (id K); the
    rest stay at id `group`, renamed "<name>/lo".

    Raises:
        ValueError: a row of `high_ids` is not in `group`, or the split would leave either side empty.
    """
    assignment, high_ids = np.array(assignment, dtype=np.int64), np.unique(np.asarray(high_ids, dtype=np.int64))
    in_group = np.flatnonzero(assignment == group)
    if not np.isin(high_ids, in_group).all() or len(high_ids) in (0, len(in_group)):
        raise ValueError(f"splitting {names[group]!r} needs 1..{len(in_group) - 1} of its own rows in high_ids")
    assignment[high_ids] = len(names)  # `np.array` copied it: the caller's array is left as it was
    return [*(f"{name}/lo" if k == group else name for k, name in enumerate(names)), f"{names[group]}/hi"], assignment


def plan_merge(names: list[str], reward, reward_std, tol: float, min_groups: int) -> tuple[int, int, str] | None:
    """The pair of policy groups (i, j), i < j, that behave alike: |Δ reward| < tol and |Δ reward_std| < tol, of all
    such pairs the closest by the larger of the two differences (ties: lowest (i, j)). `reward`, `reward_std` (K,):
    each group's recent reward and within-prompt reward std, in reward units; NaN (a group not seen) never matches.

    Returns:
        (i, j, reason), or None when no pair qualifies or there are already `min_groups` groups or fewer.
    """
    r, s = np.asarray(reward, dtype=float), np.asarray(reward_std, dtype=float)
    gaps = np.maximum(abs(r[:, None] - r[None, :]), abs(s[:, None] - s[None, :]))  # (K, K), NaN for a group unseen
    gaps[np.tril_indices(len(r))] = np.nan
    if len(names) <= min_groups or not (gaps < tol).any():
        return None
    i, j = np.unravel_index(np.nanargmin(np.where(gaps < tol, gaps, np.nan)), gaps.shape)
    reason = (f"merge {names[i]!r} and {names[j]!r}: reward {r[i]:.3f} vs {r[j]:.3f}, reward std {s[i]:.3f} vs "
              f"{s[j]:.3f}, both within tol={tol}")  # fmt: skip
    return int(i), int(j), reason


def plan_fusion_merge(names: list[str], reward, reward_std, tol: float, min_groups: int):
    """At the start of fusion (`stages`): `plan_merge` among the groups that did well, those whose reward is at least
    the mean over the groups seen (NaN: not seen). Shapes (K,), reward units. Returns (i, j, reason) or None."""
    r = np.asarray(reward, dtype=float)
    well = ~np.isnan(r) & (r >= np.nanmean(r)) if not np.isnan(r).all() else np.zeros(len(r), dtype=bool)
    return plan_merge(names, np.where(well, r, np.nan), np.where(well, reward_std, np.nan), tol, min_groups)


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
    v, n = np.sort(x), len(x)
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

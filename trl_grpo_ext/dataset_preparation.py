"""The training and evaluation datasets checked against what a run reads from them, in `GRPOTrainer.__init__`
before the model is loaded: a missing column otherwise surfaces only after the model is loaded and the first
completions are generated (TRL calls each reward function with the dataset's columns as keyword arguments, and a
missing one is a `TypeError` from inside the reward function)."""

import inspect

# Added to the training dataset when policy grouping or prompt skipping is on: each row's index (named for policy
# grouping, which added it first; checkpoints and reward functions see this name).
ROW_COLUMN = "policy_group_row"

# What TRL 1.16's `_calculate_rewards` passes every reward function besides the dataset's columns, and the columns it
# does not pass on ("prompt" goes in as `prompts`).
TRL_REWARD_ARGUMENTS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)
NOT_PASSED_ON = frozenset({"prompt", "completion", "completion_ids"})


def reward_columns(reward_func) -> list[str]:
    """The dataset columns a reward function cannot run without: its parameters without a default that TRL does not
    fill itself. [] for a reward model or a model id (TRL scores those from the text alone) and for a callable whose
    signature cannot be read."""
    if not callable(reward_func) or hasattr(reward_func, "forward"):
        return []
    try:
        parameters = inspect.signature(reward_func).parameters.values()
    except (TypeError, ValueError):
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        p.name
        for p in parameters
        if p.kind in named and p.default is inspect.Parameter.empty and p.name not in TRL_REWARD_ARGUMENTS
    ]


def check_dataset_columns(dataset, reward_funcs, args, eval_dataset=None, row_column: bool = False) -> None:
    """Check that `dataset` has each column the reward functions and `args.policy_group_column` read, and that
    `eval_dataset` has each column the reward functions read (TRL scores evaluation completions with them too).

    Args:
        dataset: the training dataset (a `datasets.Dataset` or `IterableDataset`; None or one without known
            columns is not checked).
        reward_funcs: a reward function, a model id, a model, or a list of these, as `GRPOTrainer` takes them.
        args: the `GRPOConfig`.
        eval_dataset: the evaluation dataset, or a dict of them by name, as `GRPOTrainer` takes it (or None).
        row_column: whether the trainer adds `ROW_COLUMN` to the training dataset (policy grouping or prompt
            skipping is on), so that a reward function may read it there.

    Raises:
        ValueError: a training dataset with no row; or naming the column, the reward function (or
            `policy_group_column`) that reads it, the dataset (training, evaluation, or evaluation dataset 'name')
            and its columns; or, with `remove_unused_columns=True`, saying that TRL drops the column.
    """
    if dataset is not None and hasattr(dataset, "__len__") and len(dataset) == 0:  # stock TRL trains 0 steps, exit 0
        raise ValueError(
            "train_dataset has 0 rows: there is nothing to train on (check the file, a filter or a limit that "
            "removed every row)"
        )
    evaluation = eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]
    _check_reward_columns(dataset, reward_funcs, args, "training dataset", row_column)
    for name, data in evaluation:
        _check_reward_columns(data, reward_funcs, args, "evaluation dataset" + (f" {name!r}" if name else ""), False)
    columns = getattr(dataset, "column_names", None)
    column = getattr(args, "policy_group_column", None)
    if columns is not None and column is not None and column not in columns:
        raise ValueError(
            f"policy_group_column={column!r} is not a column of the training dataset; its columns are {columns}"
        )


def _check_reward_columns(dataset, reward_funcs, args, which: str, row_column: bool) -> None:
    """`check_dataset_columns` for the reward functions' columns of one dataset, called `which` in the error;
    `row_column`: the trainer adds `ROW_COLUMN` to it."""
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None:
        return
    funcs = reward_funcs if isinstance(reward_funcs, list) else [] if reward_funcs is None else [reward_funcs]
    for func in funcs:
        name = getattr(func, "__name__", type(func).__name__)
        for column in reward_columns(func):
            if column == ROW_COLUMN and column not in columns:
                if row_column:
                    continue  # added by the trainer, after this check
                where = (
                    "is added only while policy grouping or prompt_skip is on"
                    if which == "training dataset"
                    else "is added to the training dataset only (evaluation rows have no statistics): give the "
                    f"parameter a default ({ROW_COLUMN}=None) to score evaluation completions"
                )
                raise ValueError(f"reward function {name!r} needs the dataset column {column!r}, which {where}")
            if column not in columns or column in NOT_PASSED_ON:
                raise ValueError(
                    f"reward function {name!r} needs the dataset column {column!r}, which the {which} does "
                    f"not have (TRL passes each column by name): its columns are {columns}"
                )
            if args.remove_unused_columns:
                raise ValueError(
                    f"reward function {name!r} reads the dataset column {column!r}, which remove_unused_columns=True "
                    f"drops before the reward functions see it: set remove_unused_columns=False"
                )


def with_row_column(dataset, needed_by: str):
    """`dataset` with its row index in `ROW_COLUMN`, so that rows keep their identity through TRL's loader (policy
    grouping and prompt skipping keep statistics per row; `needed_by` names them in errors).

    Raises:
        ValueError: no dataset, an iterable dataset (rows must be indexed), or one that already has the column.
    """
    # an IterableDataset has `add_column` too, but no length and no row to index
    if dataset is None or not hasattr(dataset, "add_column") or not hasattr(dataset, "__len__"):
        got = "no train_dataset" if dataset is None else type(dataset).__name__
        raise ValueError(
            f"{needed_by} keeps statistics per dataset row, so it needs a map-style datasets.Dataset as "
            f"train_dataset, got {got}: build one with Dataset.from_generator(...) or Dataset.from_list(...), or "
            f"switch {needed_by} off"
        )
    if ROW_COLUMN in dataset.column_names:
        raise ValueError(f"the training dataset already has a column named {ROW_COLUMN!r}, which {needed_by} uses")
    return dataset.add_column(ROW_COLUMN, list(range(len(dataset))))


def message_text(completion: object) -> str:
    """The text of one completion, or "" when there is none.

    Args:
        completion: a plain string, or a conversational completion: a list of messages (dicts) of which the last
            one's ``"content"`` is used (a string, or a list of ``{"type": "text", "text": ...}`` parts), or a
            single message dict. Anything else (None, bytes, a message without ``"content"``) gives "".

    Returns:
        The completion text; never raises.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        completion = completion[-1]
    content = completion.get("content") if isinstance(completion, dict) else None
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, dict)]
        content = "".join(part for part in parts if isinstance(part, str))
    return content if isinstance(content, str) else ""

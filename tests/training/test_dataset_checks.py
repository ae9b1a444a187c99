"""Missing dataset columns and impossible step counts are refused before any model is loaded (issue #13, parts 5-6):
the model path in these tests does not exist, so an error other than ours would mean the model was loaded first."""

import pytest
from datasets import Dataset

from tests.conftest import small_grpo_kwargs
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.dataset_preparation import reward_columns
from trl_grpo_ext.gsm8k.rewards import gsm8k_accuracy, gsm8k_format

NO_MODEL = "/nonexistent/model-that-is-never-loaded"


def _dataset(**columns) -> Dataset:
    return Dataset.from_dict({"prompt": ["1+1?", "2+2?"], **columns})


def _config(tmp_path, **overrides) -> GRPOConfig:
    return GRPOConfig(**small_grpo_kwargs(str(tmp_path), **overrides))


def needs_difficulty(completions, difficulty, **kwargs):
    return [0.0] * len(completions)


def difficulty_optional(completions, difficulty=None, **kwargs):
    return [0.0] * len(completions)


def reads_prompt(completions, prompt, **kwargs):  # TRL passes `prompts`, never `prompt`
    return [0.0] * len(completions)


def uses_what_trl_passes(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **kwargs):
    return [0.0] * len(completions)


@pytest.mark.parametrize(
    "func, columns",
    [
        (gsm8k_accuracy, ["answer"]),
        (gsm8k_format, []),
        (needs_difficulty, ["difficulty"]),
        (difficulty_optional, []),
        (reads_prompt, ["prompt"]),
        (uses_what_trl_passes, []),
        ("some/reward-model-id", []),
    ],
)
def test_reward_columns_are_the_parameters_trl_does_not_fill(func, columns):
    assert reward_columns(func) == columns


@pytest.mark.parametrize(
    "func, dataset_columns, column",
    [
        (gsm8k_accuracy, {"question": ["a", "b"]}, "answer"),
        (needs_difficulty, {"answer": ["2", "4"]}, "difficulty"),
        (reads_prompt, {"answer": ["2", "4"]}, "prompt"),
    ],
)
def test_a_reward_functions_missing_column_is_named_before_the_model_loads(tmp_path, func, dataset_columns, column):
    dataset = _dataset(**dataset_columns)
    with pytest.raises(ValueError) as error:
        GRPOTrainer(NO_MODEL, [gsm8k_format, func], _config(tmp_path), dataset)
    message = str(error.value)
    assert f"reward function {func.__name__!r} needs the dataset column {column!r}, which the training " in message
    assert f"its columns are {dataset.column_names}" in message


@pytest.mark.parametrize("passed_as", ["keyword", "positional", "dict"])
def test_an_evaluation_datasets_missing_column_is_named_before_the_model_loads(tmp_path, passed_as):
    """TRL scores evaluation completions with the same reward functions: a missing `answer` there would fail only at
    the first evaluation, after training steps were spent."""
    train, evaluation = _dataset(answer=["2", "4"]), _dataset(question=["a", "b"])
    config = _config(tmp_path, eval_strategy="steps", eval_steps=1)
    with pytest.raises(ValueError) as error:
        if passed_as == "keyword":
            GRPOTrainer(NO_MODEL, gsm8k_accuracy, config, train, eval_dataset=evaluation)
        elif passed_as == "positional":
            GRPOTrainer(NO_MODEL, gsm8k_accuracy, config, train, evaluation)
        else:
            GRPOTrainer(NO_MODEL, gsm8k_accuracy, config, train, eval_dataset={"gsm8k": evaluation})
    which = "evaluation dataset 'gsm8k'" if passed_as == "dict" else "evaluation dataset"
    message = str(error.value)
    assert f"reward function 'gsm8k_accuracy' needs the dataset column 'answer', which the {which} does not" in message
    assert f"its columns are {evaluation.column_names}" in message


def test_remove_unused_columns_would_drop_what_a_reward_reads(tmp_path):
    dataset = _dataset(answer=["2", "4"])
    with pytest.raises(ValueError, match=r"'answer', which remove_unused_columns=True drops"):
        GRPOTrainer(NO_MODEL, gsm8k_accuracy, _config(tmp_path, remove_unused_columns=True), dataset)


def test_a_wrong_policy_group_column_is_named_before_the_model_loads(tmp_path):
    dataset = _dataset(answer=["2", "4"], task=["a", "b"])
    config = _config(tmp_path, policy_group_column="tsk", remove_unused_columns=False)
    with pytest.raises(ValueError) as error:
        GRPOTrainer(NO_MODEL, gsm8k_accuracy, config, dataset)
    message = str(error.value)
    assert "policy_group_column='tsk' is not a column" in message
    assert "['prompt', 'answer', 'task']" in message and "policy_group_row" not in message


def test_complete_dataset_gets_past_the_check_to_the_model(tmp_path):
    """With every column there, the next error is the model path's: the check let it through."""
    dataset = _dataset(answer=["2", "4"], difficulty=[1, 2])
    with pytest.raises(OSError):
        GRPOTrainer(
            NO_MODEL,
            [gsm8k_accuracy, needs_difficulty, difficulty_optional],
            _config(tmp_path),
            dataset,
            eval_dataset=dataset,
        )


@pytest.mark.parametrize("max_steps", [-5, -2, 2.5, "10", True])
def test_max_steps_other_than_a_count_or_minus_one_is_refused(tmp_path, max_steps):
    with pytest.raises(ValueError, match=rf"max_steps must be .* got {max_steps!r}"):
        _config(tmp_path, max_steps=max_steps)


@pytest.mark.parametrize("max_steps", [-1, 0, 1, 384])
def test_max_steps_counts_and_minus_one_are_accepted(tmp_path, max_steps):
    assert _config(tmp_path, max_steps=max_steps).max_steps == max_steps


def test_an_empty_training_dataset_is_an_error_before_the_model_loads(tmp_path):
    """Issue #30: stock TRL trains 0 steps on an empty dataset and exits 0; here it is one clear error."""
    empty = _dataset(answer=["2", "4"]).select([])
    with pytest.raises(ValueError, match=r"^train_dataset has 0 rows: there is nothing to train on"):
        GRPOTrainer(NO_MODEL, gsm8k_accuracy, _config(tmp_path), empty)

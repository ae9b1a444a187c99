"""The values of TRL's and transformers' own fields checked when a `GRPOConfig` is built, before any model loads.

TRL's `GRPOConfig` and transformers' `TrainingArguments` take most numbers unchecked: a learning rate of NaN or
`adam_beta1=1.5` fail only once the model is loaded and the optimizer built, `top_k=-1` or `min_p=2` at the first
generation, and `beta=-0.1`, `epsilon=-0.2`, `top_p=1.5` or `max_grad_norm=True` train without a word. Every int or
float field of TRL's `GRPOConfig` has an entry here: a `Range` in `TRL_FIELD_RANGES` (checked by
`field_checks.check_field`: the right kind, not a bool, finite, in the range), or a reason in `UNCHECKED_FIELDS`
(`tests/unit/test_config_fields.py` keeps the two complete against TRL's fields).

Numbers in a YAML mapping: PyYAML reads YAML 1.1, where `9e-1` (no dot) is the string `'9e-1'`. TrlParser converts
a top-level field through its argparse type, but not a value inside a mapping (`generation_kwargs: {top_p: 9e-1}`)
or a list (`reward_weights`): `yaml_numbers` reads such strings as the numbers YAML 1.2 makes of them. The sampling
settings in `generation_kwargs` are then checked with the ranges of TRL's fields of the same name.

`misleading_values` lists values stock TRL accepts that do not do what they seem to (a learning rate of 0 trains
nothing); `GRPOConfig` warns about each.
"""

import math
import numbers
import re

from .field_checks import Range, check_field

# What each number field of TRL's GRPOConfig (transformers' TrainingArguments included) accepts, and what it is (for
# the message). Counts checked by `config.TRL_COUNTS` and fields transformers checks itself are in UNCHECKED_FIELDS.
TRL_FIELD_RANGES: dict[str, tuple[Range, str]] = {
    # the optimizer and its schedule
    "learning_rate": (Range(0), "the optimizer's step size"),
    "weight_decay": (Range(0), "AdamW's decoupled weight decay"),
    "adam_beta1": (Range(0, 1, high_open=True), "Adam's first-moment decay"),
    "adam_beta2": (Range(0, 1, high_open=True), "Adam's second-moment decay"),
    "adam_epsilon": (Range(0), "Adam's denominator term"),
    "max_grad_norm": (Range(0), "the gradient-norm clip; 0 turns clipping off"),
    "warmup_steps": (Range(0, whole_from=1), "warm-up steps, or a fraction of the run below 1"),
    "num_train_epochs": (Range(0), "epochs, when max_steps is not set"),
    "label_smoothing_factor": (Range(0, 1, high_open=True), "label smoothing"),
    "neftune_noise_alpha": (Range(0), "NEFTune's embedding noise"),
    "router_aux_loss_coef": (Range(0), "the MoE load-balancing loss weight"),
    # intervals: a step count, or a fraction of the run below 1
    "logging_steps": (Range(0, low_open=True, whole_from=1), "steps between logs"),
    "save_steps": (Range(0, low_open=True, whole_from=1), "steps between checkpoints"),
    "eval_steps": (Range(0, low_open=True, whole_from=1), "steps between evaluations"),
    "eval_delay": (Range(0), "steps or epochs before the first evaluation"),
    "per_device_eval_batch_size": (Range(1), "completions per evaluation micro-batch"),
    "eval_accumulation_steps": (Range(1), "evaluation steps gathered before moving to the CPU"),
    "seed": (Range(0, 2**32 - 1), "the random seed (numpy takes 0 to 2**32 - 1)"),
    "data_seed": (Range(0, 2**32 - 1), "the data sampler's seed (numpy takes 0 to 2**32 - 1)"),
    "dataloader_num_workers": (Range(0), "data loader worker processes"),
    "dataloader_prefetch_factor": (Range(1), "batches each data loader worker loads ahead"),
    "ddp_bucket_cap_mb": (Range(1), "DDP's gradient bucket size in MB"),
    "ddp_timeout": (Range(1), "seconds the process group waits"),
    # sampling the completions
    "temperature": (Range(0, low_open=True), "the sampling temperature"),
    "top_p": (Range(0, 1, low_open=True), "nucleus sampling's probability mass; 1 keeps every token"),
    "top_k": (Range(0), "tokens top-k sampling keeps; 0 keeps every token"),
    "min_p": (Range(0, 1), "min-p sampling's threshold, relative to the likeliest token"),
    "repetition_penalty": (Range(0, low_open=True), "the repetition penalty; 1 is none"),
    "num_generations_eval": (Range(1), "completions per prompt in evaluation"),
    "max_tool_calling_iterations": (Range(0), "tool-calling turns"),
    "num_completions_to_print": (Range(0), "completions printed"),
    # the GRPO loss
    "beta": (Range(0), "the KL coefficient; 0 loads no reference model"),
    "epsilon": (Range(0), "the lower clip range of the importance ratio"),
    "epsilon_high": (Range(0), "the upper clip range of the importance ratio"),
    "delta": (Range(1, low_open=True), "two-sided GRPO's upper bound of the importance ratio"),
    "sapo_temperature_neg": (Range(0, low_open=True), "SAPO's temperature for non-positive advantages"),
    "sapo_temperature_pos": (Range(0, low_open=True), "SAPO's temperature for positive advantages"),
    "vespo_k_pos": (Range(0), "VESPO's power exponent for positive advantages"),
    "vespo_lambda_pos": (Range(0), "VESPO's decay for positive advantages"),
    "vespo_k_neg": (Range(0), "VESPO's power exponent for negative advantages"),
    "vespo_lambda_neg": (Range(0), "VESPO's decay for negative advantages"),
    "top_entropy_quantile": (Range(0, 1), "the share of tokens by entropy kept in the loss"),
    "entropy_coef": (Range(), "the entropy bonus's coefficient (negative: an entropy penalty)"),
    "entropy_coef_min": (Range(0), "adaptive entropy's lowest coefficient"),
    "entropy_coef_max": (Range(0), "adaptive entropy's highest coefficient"),
    "entropy_coef_delta": (Range(0), "adaptive entropy's coefficient step"),
    "entropy_target": (Range(0), "the entropy target in nats"),
    "ref_model_mixup_alpha": (Range(0, 1), "TR-DPO's mix of the policy into the reference"),
    "ref_model_sync_steps": (Range(1), "steps between reference syncs"),
    "off_policy_mask_threshold": (Range(0, low_open=True), "the off-policy masking threshold"),
    # vLLM
    "vllm_importance_sampling_clip_max": (Range(0, low_open=True), "the importance-sampling ratio's upper bound"),
    "vllm_importance_sampling_clip_min": (Range(0), "the importance-sampling ratio's lower bound"),
    "vllm_importance_sampling_cap": (Range(0, low_open=True), "the importance-sampling ratio's cap"),
    "vllm_gpu_memory_utilization": (Range(0, 1, low_open=True), "the share of GPU memory vLLM takes"),
    "vllm_max_model_length": (Range(1), "vLLM's context length in tokens"),
    "vllm_tensor_parallel_size": (Range(1), "GPUs per vLLM engine"),
    "vllm_server_timeout": (Range(0, low_open=True), "seconds to wait for the vLLM server"),
    "vllm_server_port": (Range(1, 65535), "the vLLM server's port"),
    "vllm_group_port": (Range(1, 65535), "the weight-sync group's port"),
}

# Number fields of TRL's GRPOConfig left out of TRL_FIELD_RANGES, and why.
UNCHECKED_FIELDS = {
    "per_device_train_batch_size": "a count of `config.TRL_COUNTS`",
    "gradient_accumulation_steps": "a count of `config.TRL_COUNTS`",
    "num_generations": "a count of `config.TRL_COUNTS`",
    "max_completion_length": "a count of `config.TRL_COUNTS`",
    "generation_batch_size": "a count of `config.TRL_COUNTS`",
    "steps_per_generation": "a count of `config.TRL_COUNTS`",
    "num_iterations": "a count of `config.TRL_COUNTS`",
    "max_steps": "checked by `GRPOConfig._check_trl_fields` (-1: train for num_train_epochs)",
    "torch_empty_cache_steps": "checked by transformers' TrainingArguments",
    "save_total_limit": "any integer: 0 or less keeps every checkpoint, as None does (a warning)",
    "local_rank": "set by the launcher (-1 outside one)",
    "pad_to_multiple_of": "an int or 'auto': TRL checks it",
    "reward_weights": "a list: `check_reward_weights`",
}

# Sampling settings in `generation_kwargs` that have a TRL field of the same name: checked with its range.
GENERATION_KWARG_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")

# Dict fields whose YAML values reach a library as they are (generation, model loading, the scheduler).
DICT_FIELDS = ("generation_kwargs", "model_init_kwargs", "lr_scheduler_kwargs", "gradient_checkpointing_kwargs",
               "activation_checkpointing_kwargs", "transformers_continuous_batching_config")  # fmt: skip

# A number as YAML 1.2 reads it and YAML 1.1 (PyYAML) leaves a string: an exponent without a dot, "9e-1", "1E5".
_YAML12_FLOAT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")


# the integer fields among TRL_FIELD_RANGES (checked as integers: 2.5 is refused, not rounded)
_INT_FIELDS = {
    "per_device_eval_batch_size", "eval_accumulation_steps", "seed", "data_seed", "dataloader_num_workers",
    "dataloader_prefetch_factor", "ddp_bucket_cap_mb", "ddp_timeout", "top_k", "num_generations_eval",
    "max_tool_calling_iterations", "num_completions_to_print", "ref_model_sync_steps", "vllm_max_model_length",
    "vllm_tensor_parallel_size", "vllm_server_port", "vllm_group_port",
}  # fmt: skip


def check_value(name: str, value, where: str | None = None):
    """`value` converted to field `name`'s kind (`field_checks.check_field`: "0.9" -> 0.9), or a ValueError.

    Args:
        name: a field of `TRL_FIELD_RANGES`.
        where: how the message names the value (default: the field's name; "generation_kwargs top_p").

    Raises:
        ValueError: "<where> (<what it is>) must be <allowed>, got <value>": a bool for a number, NaN, infinity, a
            string that is no number, or a value out of the range.
    """
    spec, what = TRL_FIELD_RANGES[name]
    return check_field(f"{where or name} ({what})", value, int if name in _INT_FIELDS else float, spec)


def yaml_numbers(value):
    """`value` with every string that YAML 1.2 reads as a number ("9e-1", "1E5") made that float, in mappings and
    lists at any depth; anything else unchanged (a new container where one changed)."""
    if isinstance(value, str) and _YAML12_FLOAT.fullmatch(value.strip()):
        return float(value)
    if isinstance(value, dict):
        return {key: yaml_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [yaml_numbers(item) for item in value]
    return value


def check_trl_fields(args) -> None:
    """Check TRL's and transformers' number fields of `args` (`TRL_FIELD_RANGES`), `reward_weights`, and the sampling
    settings in `generation_kwargs` (`GENERATION_KWARG_FIELDS`); first read YAML 1.2 numbers in `reward_weights` and
    the dict fields (`DICT_FIELDS`), in place. Valid values are left as they are, but for those sampling settings,
    which are converted to numbers ("0.9" -> 0.9, as TrlParser converts `top_p` itself).

    Raises:
        ValueError: naming the field and the value (`check_value`).
    """
    for name in TRL_FIELD_RANGES:
        value = getattr(args, name, None)
        if value is not None:
            check_value(name, value)
    for name in DICT_FIELDS:
        value = getattr(args, name, None)
        if isinstance(value, dict):
            setattr(args, name, yaml_numbers(value))
    check_reward_weights(args)
    kwargs = getattr(args, "generation_kwargs", None)
    for key in GENERATION_KWARG_FIELDS if isinstance(kwargs, dict) else ():
        if kwargs.get(key) is not None:
            kwargs[key] = check_value(key, kwargs[key], f"generation_kwargs {key}")


def check_reward_weights(args) -> None:
    """`reward_weights` is None or a list of finite numbers (YAML 1.2 numbers read, in place).

    Raises:
        ValueError: naming the entry.
    """
    weights = getattr(args, "reward_weights", None)
    if weights is None:
        return
    if not isinstance(weights, list | tuple):
        raise ValueError(f"reward_weights must be a list of numbers (one per reward function), got {weights!r}")
    weights = yaml_numbers(list(weights))
    for i, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise ValueError(f"reward_weights[{i}] must be a finite number (the weight of reward function {i}), got "
                             f"{weight!r}")  # fmt: skip
    args.reward_weights = weights


def misleading_values(args) -> list[str]:
    """Values stock TRL takes that do not do what they seem to, one sentence each with the setting to change."""
    found = []
    if args.learning_rate == 0:
        found.append("learning_rate=0 trains nothing: every update is zero; set a learning rate above 0")
    epsilon_high = getattr(args, "epsilon_high", None)
    if epsilon_high is not None and epsilon_high < args.epsilon:
        found.append(f"epsilon_high={epsilon_high:g} is below epsilon={args.epsilon:g}: the importance ratio is "
                     "clipped closer above 1 than below it; epsilon_high is the upper range, usually at least "
                     "epsilon")  # fmt: skip
    delta = getattr(args, "delta", None)
    if delta is not None and delta <= 1 + args.epsilon:
        found.append(f"delta={delta:g} is at most 1 + epsilon ({1 + args.epsilon:g}): the two-sided bound cuts "
                     f"ratios the usual clip keeps; TRL recommends delta > 1 + epsilon")  # fmt: skip
    limit = getattr(args, "save_total_limit", None)
    if isinstance(limit, int) and limit <= 0:
        found.append(f"save_total_limit={limit} keeps every checkpoint (as None does), not none of them; to save "
                     "none, set save_strategy no")  # fmt: skip
    return found

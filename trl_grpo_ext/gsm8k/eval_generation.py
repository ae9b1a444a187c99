"""The GSM8K evaluation's generation: decoding set in full, problems shared over processes, a progress line per batch.

**Decoding.** transformers fills every generation setting a `generate` call leaves unset (None) from the model's
`generation_config.json`, and only then from its own defaults (`GenerationMixin._prepare_generation_config`), even
when a `generation_config` is passed. Qwen2.5 Instruct checkpoints ship `repetition_penalty` 1.05-1.1 with their own
`temperature`, `top_k` and `top_p`, so an evaluation that sets only `do_sample` is neither argmax nor the sampling it
asked for (issue #58, after TRL #5783 and verl #7270). Here every setting transformers has a default for is given
explicitly (`decoding_settings`: transformers' defaults, then the evaluation's own), and for the length of the
evaluation the model's generation config is replaced by one that holds only its token ids
(`checkpoint_settings_hidden`), so the settings whose "off" is None (`min_p`, `suppress_tokens`, `bad_words_ids`,
`forced_eos_token_id`, `sequence_bias`, `stop_strings`, ...) cannot come from the checkpoint either. Greedy is then
argmax; sampling is softmax(logits / temperature) over the whole vocabulary (`top_k` 0, `top_p` 1).

**Processes.** `shard_batches` cuts the problems into fixed batches of `batch_size` (the same batches whatever the
number of processes) and deals them out in turn; each process generates its batches and the completions are
gathered on every process (`accelerate.utils.gather_object`). Every process runs the same number of `generate`
calls (one repeated batch where the count does not divide), which sharded weights (FSDP, ZeRO-3) need. A sampled
batch is seeded with `seed` + the index of its first problem, so one process and several give the same completions.

**Progress.** With a `label`, the main process prints one line as it starts and one a batch: problems done of its
share, time elapsed and an estimate of the time left (`progress_line`).
"""

import time
from contextlib import contextmanager

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..reporting.progress import duration
from ..trl_contact import generation_defaults

# Settings that are transformers' defaults but not decoding choices: the length (set by max_new_tokens instead)
NOT_DECODING = ("max_length",)


def decoding_settings(max_new_tokens: int, temperature: float, num_samples: int = 1) -> dict:
    """Every generation setting transformers has a default for (`trl_contact.generation_defaults`:
    beams, penalties, n-gram blocking, top-k/top-p/typical/epsilon/eta truncation, ...) at that default, then the
    evaluation's: greedy (`temperature == 0`: `do_sample=False`, argmax; transformers applies `temperature`, `top_k`
    and `top_p` only when sampling) or sampling at `temperature` with no truncation (`top_k=0`, `top_p=1.0`),
    `num_samples` sequences a prompt, at most `max_new_tokens` new tokens.

    Raises:
        ValueError: `temperature == 0` with `num_samples > 1` (every greedy sample would be the same).
    """
    if temperature == 0 and num_samples > 1:
        raise ValueError(f"num_samples={num_samples} needs temperature > 0; greedy decoding gives identical samples")
    settings = generation_defaults()
    for name in NOT_DECODING:
        settings.pop(name, None)
    settings.update(max_new_tokens=max_new_tokens, num_return_sequences=num_samples, do_sample=temperature > 0)
    if temperature > 0:  # greedy keeps transformers' temperature, top_k and top_p, which only sampling reads
        settings.update(temperature=temperature, top_k=0, top_p=1.0)
    return settings


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The end-of-sequence ids generation stops at: the model's generation config's (Qwen2.5 Instruct: <|im_end|> and
    <|endoftext|>) and the tokenizer's, each once."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def generation_config(settings: dict, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """A `GenerationConfig` of `settings` (`decoding_settings`) with the token ids: the tokenizer's padding, the stop
    ids (`stop_token_ids`) and the model's bos."""
    bos = getattr(getattr(model, "generation_config", None), "bos_token_id", None)
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=stop_token_ids(model, tokenizer), bos_token_id=bos)
    return GenerationConfig(**settings, **ids)


def decoding_config(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_new_tokens: int,
                    temperature: float, num_samples: int = 1) -> GenerationConfig:  # fmt: skip
    """The `GenerationConfig` `generate` passes to the model: `decoding_settings` with the token ids
    (`generation_config`)."""
    return generation_config(decoding_settings(max_new_tokens, temperature, num_samples), model, tokenizer)


# transformers' bookkeeping in a `GenerationConfig.to_dict()`, not a setting of the generation
NOT_SETTINGS = ("transformers_version", "_from_model_config")


def generation_record(config: GenerationConfig) -> dict:
    """Every setting of `config` (the one `generate` is called with) as JSON values, name -> value: the decoding
    settings, the token ids (bos, the eos ids it stops at, pad) and those left at None (`min_p`, `stop_strings`,
    `top_h`, ...), so that a results file says all that the generation was given; transformers' bookkeeping
    (`NOT_SETTINGS`) left out."""
    record = config.to_dict()
    for name in NOT_SETTINGS:
        record.pop(name, None)
    return record


TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


@contextmanager
def checkpoint_settings_hidden(model: torch.nn.Module):
    """For the block, the generation config of `model` and of every module in it that has one (a PEFT model's base
    model) replaced by one holding only its token ids (`TOKEN_IDS`), so that `generate` fills nothing from the
    checkpoint's `generation_config.json`; restored afterwards, also on an error."""
    saved = []
    for module in model.modules():
        config = module.__dict__.get("generation_config")
        if isinstance(config, GenerationConfig):
            saved.append((module, config))
            module.generation_config = GenerationConfig(**{name: getattr(config, name, None) for name in TOKEN_IDS})
    try:
        yield model
    finally:
        for module, config in saved:
            module.generation_config = config


def shard_batches(num_items: int, batch_size: int, process_index: int = 0, num_processes: int = 1) -> list[tuple]:
    """This process's batches of `num_items` problems: `(start, stop, keep)` for batches `process_index`,
    `process_index + num_processes`, ... of the fixed batches `[0, batch_size)`, `[batch_size, 2·batch_size)`, ...;
    padded with a repeat of its last batch (or of batch 0), `keep=False`, so that every process runs as many as
    process 0 (sharded weights need every process in every forward).

    Example: 5 problems in batches of 2 on 2 processes: process 0 gets (0, 2, True), (4, 5, True); process 1 gets
    (2, 4, True), (2, 4, False).
    """
    starts = list(range(0, num_items, batch_size))
    per_process = -(-len(starts) // num_processes)  # ceil: process 0's count
    mine = [(start, min(start + batch_size, num_items), True) for start in starts[process_index::num_processes]]
    repeat = mine[-1] if mine else (0, min(batch_size, num_items), True)
    return mine + [(repeat[0], repeat[1], False)] * (per_process - len(mine)) if starts else []


def progress_line(
    label: str, done: int, total: int, *, elapsed: float, num_processes: int = 1, all_problems=None
) -> str:
    """One progress line: `done` of `total` problems (with several processes: of process 0's share, `all_problems`
    in all), the time `elapsed` and the time left at the rate so far, e.g.
    "Evaluation, greedy: 32/200 problems, 41s elapsed, about 3m35s left"; "started" before the first batch."""
    share = f" on process 0 of {num_processes} ({all_problems} in all)" if num_processes > 1 else ""
    if not done:
        return f"{label}: 0/{total} problems{share}, started"
    left = elapsed / done * (total - done)
    return f"{label}: {done}/{total} problems{share}, {duration(elapsed)} elapsed, about {duration(left)} left"


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[dict]],
    *,
    max_new_tokens: int = 512,
    batch_size: int = 16,
    num_samples: int = 1,
    temperature: float = 0.0,
    chat_template_kwargs: dict | None = None,
    seed: int = 0,
    accelerator=None,
    label: str | None = None,
) -> list[list[str]]:
    """Complete every chat prompt `num_samples` times; return `len(prompts)` lists of `num_samples` texts.

    `temperature == 0` is argmax decoding (then `num_samples` must be 1); above 0, sampling at that temperature over
    the whole vocabulary, each batch seeded with `seed` + the index of its first prompt; nothing is taken from the
    checkpoint's generation config (module docstring). Prompts are rendered with the tokenizer's chat template and
    `chat_template_kwargs` (as TRL's trainer renders them: training's `GRPOConfig.chat_template_kwargs` make the same
    prompts) and generated `batch_size` at a time with left padding. With an `accelerator` (or accelerate
    `PartialState`) of several processes, every process calls this with the same prompts, generates its share
    (`shard_batches`) and gets every completion back. With a `label`, process 0 prints a progress line as it starts
    and after each batch (`progress_line`).

    Raises:
        ValueError: `temperature == 0` with `num_samples > 1` (every greedy sample would be the same).
    """
    config = decoding_config(model, tokenizer, max_new_tokens, temperature, num_samples)
    tokenizer.padding_side = "left"
    kwargs = chat_template_kwargs or {}
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **kwargs) for p in prompts]
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    batches = shard_batches(len(texts), batch_size, rank, world)
    share, done, started = sum(stop - start for start, stop, keep in batches if keep), 0, time.perf_counter()
    completions: dict[int, list[list[str]]] = {}  # first prompt of a batch -> its prompts' completions
    show = label is not None and rank == 0
    if show:
        print(progress_line(label, 0, share, elapsed=0.0, num_processes=world, all_problems=len(texts)), flush=True)
    with checkpoint_settings_hidden(model):
        for start, stop, keep in batches:
            batch = tokenizer(texts[start:stop], return_tensors="pt", padding=True, add_special_tokens=False)
            batch = batch.to(model.device)
            if config.do_sample:
                torch.manual_seed(seed + start)  # per batch of fixed problems: the same on any number of processes
            generated = model.generate(**batch, generation_config=config)  # (b*num_samples, prompt_len + new)
            decoded = tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
            if keep:
                completions[start] = [decoded[i : i + num_samples] for i in range(0, len(decoded), num_samples)]
                done += stop - start
                if show:
                    elapsed = time.perf_counter() - started
                    print(
                        progress_line(
                            label, done, share, elapsed=elapsed, num_processes=world, all_problems=len(texts)
                        ),
                        flush=True,
                    )
    if world > 1:
        from accelerate.utils import gather_object

        completions = {start: texts for part in gather_object([completions]) for start, texts in part.items()}
    return [texts for start in sorted(completions) for texts in completions[start]]

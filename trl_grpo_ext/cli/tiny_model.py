"""A tiny random-init Qwen2 model and a byte-level BPE tokenizer with a chat template, built with no download.

Users debug a pipeline offline with it (`trl-grpo-ext tiny-model DIR`); the tests and the CPU demo train it. The
model is a real `Qwen2ForCausalLM` (same code path as `Qwen/Qwen2.5-*`), only small: it generates random text, so
rewards on it measure plumbing, not learning.
"""

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from ..gsm8k.data import SYSTEM_PROMPT, synthetic_gsm8k

# Qwen2.5's chat template, reduced to system/user/assistant turns (no tools), so prompts render as for the real model.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on seeded GSM8K-style text, with Qwen2.5's special tokens and chat template.

    Args:
        vocab_size: size of the vocabulary, special tokens and the 256 byte symbols included.

    Returns:
        A fast tokenizer: pad `<|endoftext|>`, eos `<|im_end|>`, left padding; any string encodes (bytes fallback).
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [SYSTEM_PROMPT, "\\boxed{}"]
    corpus += [row["question"] + "\n" + row["answer"] for row in synthetic_gsm8k(400, seed=0)]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_model(vocab_size: int, seed: int = 0) -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 causal LM (hidden size 64, 4 attention heads, 2 key-value heads), random init from `seed`.

    About 0.1 M parameters: a training step on 2 CPU cores takes well under a second.
    """
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def save_tiny_model(output_dir: str | os.PathLike, seed: int = 0, vocab_size: int = 512) -> Path:
    """Write the tiny model and its tokenizer (`vocab_size` tokens) to `output_dir` as a Hugging Face folder; return
    the folder.

    The folder loads with `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained` and as
    `model_name_or_path` of any TRL config. The same `seed` gives the same weights.
    """
    output_dir = Path(output_dir)
    tokenizer = build_tiny_tokenizer(vocab_size)
    model = build_tiny_model(len(tokenizer), seed=seed)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    model.config.eos_token_id = eos_id
    model.config.pad_token_id = pad_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir

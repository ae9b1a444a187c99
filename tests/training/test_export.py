"""`trl-grpo-ext export`: a LoRA/QLoRA run dir becomes one full model folder whose logits are the adapter model's, with
the run's tokenizer and chat template; the right adapter is picked; user errors are one line."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

from trl_grpo_ext.cli.export import cli, export_merged, find_export_source
from trl_grpo_ext.resume import write_manifest

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # the presets' LoRA targets
# A Jinja comment: renders as the base's template does, but tells the run's tokenizer from the base's.
RUN_TEMPLATE_MARK = "{#- saved by the run -#}"


def _adapter_model(base, seed: int):
    """`base` with a LoRA adapter whose B is random, not zero (`init_lora_weights=False`), so merging changes W."""
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False, task_type="CAUSAL_LM")
    return get_peft_model(base, config).eval()


def _logits(model, input_ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids).logits.float()  # (1, T, V)


def _save_like_the_recipe(model, tokenizer, folder: Path, checkpoint: bool) -> None:
    """What `trainer.save_model` / a checkpoint save writes for a LoRA run: adapter files and the tokenizer; a
    checkpoint also has trainer_state.json and, written last, trl_grpo_ext's manifest (optimizer etc. left out)."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if checkpoint:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": int(folder.name.split("-")[1])}))
        write_manifest(str(folder))


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_dir) -> torch.Tensor:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt").input_ids  # (1, T)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_dir, prompt_ids):
    """A LoRA run dir as the recipe leaves it: checkpoint-2/ and checkpoint-4/ and the final adapter in the root, each
    a different adapter; returns (run_dir, {folder name: the adapter model's logits}, base logits)."""
    run_dir = tmp_path_factory.mktemp("lora-run")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template += RUN_TEMPLATE_MARK
    reference = {}
    for name, seed in [("checkpoint-2", 2), ("checkpoint-4", 4), ("final", 6)]:
        folder = run_dir / name if name != "final" else run_dir
        folder.mkdir(exist_ok=True)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        model = _adapter_model(base, seed)
        reference[name] = _logits(model, prompt_ids)
        _save_like_the_recipe(model, tokenizer, folder, checkpoint=name != "final")
    base_logits = _logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), prompt_ids)
    return run_dir, reference, base_logits


@pytest.fixture(scope="module")
def float32_export(lora_run, tmp_path_factory) -> Path:
    run_dir, _, _ = lora_run
    return export_merged(run_dir, tmp_path_factory.mktemp("export") / "merged-fp32", dtype="float32")


def test_merged_logits_equal_the_adapter_models(lora_run, float32_export, prompt_ids, tiny_model_dir):
    _, reference, base_logits = lora_run
    merged = AutoModelForCausalLM.from_pretrained(float32_export, dtype=torch.float32)

    assert type(merged).__name__ == "Qwen2ForCausalLM"  # a plain model, not a PeftModel
    assert not [name for name, _ in merged.named_modules() if "lora" in name]
    assert not (float32_export / "adapter_config.json").exists()
    with safe_open(float32_export / "model.safetensors", "pt") as weights:
        assert weights.keys() and not [key for key in weights.keys() if "lora" in key]
    assert not list(float32_export.glob("*.bin"))
    # The adapter moves the logits far more than the tolerance: an export that dropped it would fail.
    assert (reference["final"] - base_logits).abs().max() > 0.1
    # W + s·BA against W·x + s·B(A·x), both float32: equal up to float32 rounding.
    torch.testing.assert_close(_logits(merged, prompt_ids), reference["final"], rtol=1e-5, atol=1e-5)


def test_tokenizer_chat_template_and_generation_config_survive(lora_run, float32_export, tiny_model_dir):
    run_dir, _, _ = lora_run
    exported = AutoTokenizer.from_pretrained(float32_export)
    saved_by_run = AutoTokenizer.from_pretrained(run_dir)

    assert exported.chat_template == saved_by_run.chat_template  # the run's tokenizer, not the base's
    assert exported.chat_template.endswith(RUN_TEMPLATE_MARK)
    messages = [{"role": "user", "content": "What is 6 times 7?"}]
    rendered = exported.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert exported(rendered).input_ids == saved_by_run(rendered).input_ids
    assert (exported.eos_token, exported.pad_token) == ("<|im_end|>", "<|endoftext|>")
    generation = json.loads((float32_export / "generation_config.json").read_text())
    base_generation = json.loads((Path(tiny_model_dir) / "generation_config.json").read_text())
    assert generation["eos_token_id"] == base_generation["eos_token_id"] == exported.eos_token_id


def test_default_dtype_is_bfloat16_rounded_once_from_the_float32_merge(lora_run, float32_export, tmp_path):
    run_dir, _, _ = lora_run
    out = export_merged(run_dir, tmp_path / "merged")  # the tiny base is stored in float32: auto gives bfloat16

    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with (
        safe_open(out / "model.safetensors", "pt") as bf16,
        safe_open(float32_export / "model.safetensors", "pt") as f32,
    ):
        assert sorted(bf16.keys()) == sorted(f32.keys())
        for key in f32.keys():
            assert bf16.get_tensor(key).dtype == torch.bfloat16, key
            assert torch.equal(bf16.get_tensor(key), f32.get_tensor(key).to(torch.bfloat16)), key


def test_without_a_final_adapter_the_newest_complete_checkpoint_is_exported(lora_run, prompt_ids, tmp_path, capsys):
    source_run, reference, _ = lora_run
    run_dir = tmp_path / "run"
    for name in ("checkpoint-2", "checkpoint-4"):
        shutil.copytree(source_run / name, run_dir / name)
    unfinished = run_dir / "checkpoint-6"  # a save killed half-way: adapter files, no trainer_state.json, no manifest
    shutil.copytree(
        source_run / "checkpoint-2", unfinished, ignore=shutil.ignore_patterns("trainer_state.json", "trl_*")
    )

    out = export_merged(run_dir, tmp_path / "merged", dtype="float32")

    printed = capsys.readouterr().out
    assert f"{run_dir / 'checkpoint-4'}, the newest complete checkpoint" in printed
    assert "skipped checkpoint-6: no trl_grpo_ext_manifest.json" in printed
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    torch.testing.assert_close(_logits(merged, prompt_ids), reference["checkpoint-4"], rtol=1e-5, atol=1e-5)


def test_find_export_source(tmp_path):
    for step in (9, 10):  # by step, not by name: checkpoint-10 is newer though "checkpoint-10" < "checkpoint-9"
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "adapter_config.json").write_text("{}")
        (folder / "trainer_state.json").write_text("{}")
    (tmp_path / "tiny-model").mkdir()  # the recipe's tiny base lives in output_dir too: not a checkpoint
    (tmp_path / "tiny-model" / "config.json").write_text("{}")
    (tmp_path / "tiny-model" / "model.safetensors").write_text("")

    assert find_export_source(tmp_path).path == tmp_path / "checkpoint-10"
    assert find_export_source(tmp_path / "checkpoint-9").path == tmp_path / "checkpoint-9"  # a checkpoint named
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"^{empty} holds no adapter .* pass the recipe's output_dir") as error:
        find_export_source(empty)
    assert "\n" not in str(error.value)


def test_full_model_run_is_exported_as_is(tiny_model_dir, prompt_ids, tmp_path, capsys):
    run_dir = tmp_path / "full-run"
    shutil.copytree(tiny_model_dir, run_dir)  # LoRA off: trainer.save_model writes the whole model and tokenizer

    out = export_merged(run_dir, tmp_path / "out", dtype="float32")

    assert "No adapter (LoRA was off): copying the full model as is, in float32" in capsys.readouterr().out
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    expected = _logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), prompt_ids)
    torch.testing.assert_close(_logits(merged, prompt_ids), expected, rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(run_dir).chat_template


def test_qlora_adapter_is_merged_into_the_full_precision_base(tiny_model_dir, prompt_ids, tmp_path, capsys):
    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    base_4bit = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, quantization_config=nf4)
    qlora = _adapter_model(base_4bit, seed=11)
    assert any(type(m).__name__ == "Linear4bit" for m in qlora.modules())
    qlora_logits = _logits(qlora, prompt_ids)
    with qlora.disable_adapter():
        base_4bit_logits = _logits(qlora, prompt_ids)
    run_dir = tmp_path / "qlora-run"
    _save_like_the_recipe(qlora, AutoTokenizer.from_pretrained(tiny_model_dir), run_dir, checkpoint=False)

    out = export_merged(run_dir, tmp_path / "out", dtype="float32")

    assert "never 4-bit" in capsys.readouterr().out
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert not any(type(m).__name__ == "Linear4bit" for m in merged.modules())
    merged_logits = _logits(merged, prompt_ids)
    # Exactly the full-precision base + the same adapter, unmerged (equal up to float32 rounding).
    full_base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    full_base_logits = _logits(full_base, prompt_ids)
    adapter_on_full_base = PeftModel.from_pretrained(full_base, run_dir).eval()
    torch.testing.assert_close(merged_logits, _logits(adapter_on_full_base, prompt_ids), rtol=1e-5, atol=1e-5)
    # Close to the 4-bit model it was trained on, but not equal: training saw the NF4-rounded base W_q, the merge
    # uses the original W, so the two differ by the base's quantization error alone. Bound: twice the distance
    # between the 4-bit and the full-precision base without any adapter (measured 0.04 here against a bound of
    # 0.17, while the adapter itself moves the logits by 1.3: an export without it fails).
    quantization_error = (base_4bit_logits - full_base_logits).abs().max().item()
    assert 0 < quantization_error
    torch.testing.assert_close(merged_logits, qlora_logits, rtol=0, atol=2 * quantization_error)
    assert (qlora_logits - base_4bit_logits).abs().max() > 3 * 2 * quantization_error


# adapters of a base whose output layer shares its weight with the input embeddings (the tiny model, as Qwen2.5
# 0.5B-3B): (LoraConfig settings, whether the export is saved untied)
TIED_ADAPTERS = {
    "lora_embed_tokens": ({"target_modules": ["q_proj", "v_proj", "embed_tokens"]}, True),  # the issue's
    "lora_lm_head": ({"target_modules": ["q_proj", "lm_head"]}, True),
    "lora_both": ({"target_modules": ["q_proj", "embed_tokens", "lm_head"]}, True),
    "modules_to_save_embed_tokens": ({"target_modules": ["q_proj"], "modules_to_save": ["embed_tokens"]}, True),
    "trainable_tokens": ({"target_modules": ["q_proj"], "trainable_token_indices": [3, 5, 7]}, False),
    "no_embedding": ({"target_modules": ["q_proj", "v_proj"]}, False),
}


def _tied_adapter_run(tiny_model_dir, settings: dict, run_dir: Path) -> torch.Tensor:
    """A run dir with an adapter of `settings` on the tied tiny model, every trainable weight moved off its initial
    value; returns the adapter model's logits on 16 tokens."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert base.get_output_embeddings().weight is base.get_input_embeddings().weight  # tied
    config = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, task_type="CAUSAL_LM", **settings)
    model = get_peft_model(base, config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.requires_grad and "lora_" not in name:  # a modules_to_save copy, trainable tokens
                parameter.add_(torch.randn_like(parameter))
    _save_like_the_recipe(model, AutoTokenizer.from_pretrained(tiny_model_dir), run_dir, checkpoint=False)
    return _logits(model, torch.arange(3, 19)[None])


@pytest.mark.parametrize("kind", TIED_ADAPTERS)
def test_an_adapter_of_tied_embeddings_exports_the_adapter_models_logits(kind, tiny_model_dir, tmp_path, capsys):
    settings, untied = TIED_ADAPTERS[kind]
    expected = _tied_adapter_run(tiny_model_dir, settings, tmp_path / "run")

    out = export_merged(tmp_path / "run", tmp_path / "out", dtype="float32")

    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    torch.testing.assert_close(_logits(merged, torch.arange(3, 19)[None]), expected, rtol=1e-5, atol=1e-4)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is not untied
    with safe_open(out / "model.safetensors", "pt") as weights:
        assert ("lm_head.weight" in weights.keys()) is untied  # both weights written when untied
    said = capsys.readouterr().out
    assert ("the export is saved untied" in said) is (kind.startswith("lora_"))


def test_a_merge_that_would_change_the_logits_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    """Without untying, a LoRA on tied embeddings merges into both (the issue's export: logits off by up to 20.7);
    the probe check refuses it, one line, and writes nothing."""
    _tied_adapter_run(tiny_model_dir, TIED_ADAPTERS["lora_embed_tokens"][0], tmp_path / "run")
    monkeypatch.setattr("trl_grpo_ext.cli.export.untie_adapted_embeddings", lambda model: None)

    with pytest.raises(ValueError, match=r"the merged model's logits differ from the adapter model's by up to \d"):
        export_merged(tmp_path / "run", tmp_path / "out", dtype="float32")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_missing_run_dir_is_one_line(tmp_path, capsys):
    missing = tmp_path / "no-such-run"

    assert cli([str(missing), str(tmp_path / "out")]) == 1

    assert capsys.readouterr().err.strip().splitlines() == [
        f"trl-grpo-ext export: error: {missing}: no such folder; pass the recipe's output_dir or a checkpoint-N folder"
        " (run with --debug for the traceback)"
    ]
    assert not (tmp_path / "out").exists()


def test_non_empty_out_dir_needs_force(lora_run, tmp_path, capsys):
    run_dir, _, _ = lora_run
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "model-00001-of-00002.safetensors").write_text("a shard of an older, bigger export")

    assert cli([str(run_dir), str(out)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"trl-grpo-ext export: error: OUT_DIR {out} is not empty: choose an empty or new folder, or pass "
                     "--force (run with --debug for the traceback)"]  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["model-00001-of-00002.safetensors", "notes.txt"]

    assert cli([str(run_dir), str(out), "--force"]) == 0
    # the stale shard would mix with the new weights in a loader: removed; other files are left alone
    assert not (out / "model-00001-of-00002.safetensors").exists()
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()


def test_base_that_cannot_be_found_names_base_model_flag(lora_run, tiny_model_dir, tmp_path):
    source_run, _, _ = lora_run
    run_dir = tmp_path / "run"
    shutil.copytree(source_run / "checkpoint-2", run_dir)
    adapter_config = json.loads((run_dir / "adapter_config.json").read_text())

    for base, error_type, message in [
        ("no-such-org/no-such-model", ValueError, "not in the Hugging Face cache .*: pass --base-model PATH"),
        (str(tmp_path / "moved-base"), FileNotFoundError, "moved-base .* does not exist: pass --base-model PATH"),
    ]:
        (run_dir / "adapter_config.json").write_text(json.dumps({**adapter_config, "base_model_name_or_path": base}))
        with pytest.raises(error_type, match=message) as error:
            export_merged(run_dir, tmp_path / "out", verbose=False)
        assert "\n" not in str(error.value)
        assert not (tmp_path / "out").exists()

    # a --base-model that is not there is the user's own path: checked, not "pass --base-model"
    with pytest.raises(FileNotFoundError, match=r"nope \(--base-model\) does not exist: check that path$"):
        export_merged(run_dir, tmp_path / "out", base_model=str(tmp_path / "nope"), verbose=False)

    assert cli([str(run_dir), str(tmp_path / "out"), "--base-model", tiny_model_dir]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()

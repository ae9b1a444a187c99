"""Adaptive gradient regularization: ZClip, AGC and adaptive KL against hand-computed values; the trainer's clip,
non-finite guard, resume, config checks and LoRA; under DeepSpeed, the refusals before the model loads and the skip
decision (with a stand-in engine: the real engines run in tests/engines/test_engines.py)."""

import copy
import logging
import math
import re
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType
from datasets import Dataset
from peft import LoraConfig
from torch.testing import assert_close
from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback

from tests.conftest import length_reward, small_grpo_kwargs
from tests.resume_check import check_resume
from tests.two_process import full_records, two_process
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.grad_reg import config as grad_reg_config
from trl_grpo_ext.grad_reg.adaptive_kl import AdaptiveKL, per_token_kl
from trl_grpo_ext.grad_reg.clipping import ZClip, adaptive_clip_, agc_applies, unitwise_norm
from trl_grpo_ext.grad_reg.config import check_deepspeed
from trl_grpo_ext.grad_reg.feature import GradReg, NonFiniteGradientError
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows
from trl_grpo_ext.resume import checkpoint_problem

# --- pure functions -------------------------------------------------------------------------------------------------


def test_zclip_by_hand():
    zclip = ZClip(alpha=0.5, z_threshold=2.0, warmup_steps=4)
    # warm-up: norms are only collected; the 4th sets mean (1+3+1+3)/4 = 2 and population variance (1+1+1+1)/4 = 1
    assert [zclip.step(g) for g in (1.0, 3.0, 1.0)] == [(None, None)] * 3 and not zclip.warmed_up
    assert zclip.step(3.0) == (None, None) and (zclip.mean, zclip.var) == (2.0, 1.0)
    assert_close(zclip.spike_threshold(), 4.0)  # mean + z_thr * std = 2 + 2 * 1
    # g = 2.5: z = 0.5 / (1 + 1e-6) <= 2, not clipped; mean = 0.5*2 + 0.5*2.5 = 2.25,
    # var = 0.5*1 + 0.5*(2.5 - 2.25)^2 = 0.53125
    clip, z = zclip.step(2.5)
    assert clip is None
    assert_close(z, 0.5, rtol=1e-5, atol=0)
    assert_close((zclip.mean, zclip.var), (2.25, 0.53125))
    # g = 10: std = sqrt(0.53125) = 0.728869, z = 7.75 / std = 10.6330 > 2 -> clip value
    # mean + z_thr^2 * std / z = 2.25 + 4 * 0.53125 / 7.75 = 2.25 + 0.274194 = 2.524194 (the caller clips to
    # min(2.524194, max_grad_norm)); the EMA takes the clip value, not 10: mean = 0.5*2.25 + 0.5*2.524194 = 2.387097,
    # var = 0.5*0.53125 + 0.5*(2.524194 - 2.387097)^2 = 0.265625 + 0.5*0.018796 = 0.275023
    clip, z = zclip.step(10.0)
    assert_close(z, 7.75 / math.sqrt(0.53125), rtol=1e-5, atol=0)
    assert_close(clip, 2.25 + 4 * 0.53125 / 7.75, rtol=1e-5, atol=0)
    assert_close((zclip.mean, zclip.var), (2.387097, 0.275023), rtol=1e-5, atol=0)
    # the state is plain Python numbers and comes back exactly
    restored = ZClip(alpha=0.5, z_threshold=2.0, warmup_steps=4)
    restored.load_state_dict(copy.deepcopy(zclip.state_dict()))
    assert restored.step(3.0) == zclip.step(3.0)


def test_unitwise_norm_shapes():
    assert unitwise_norm(torch.tensor([3.0, 4.0])).shape == ()  # a vector is one unit: norm 5
    assert_close(unitwise_norm(torch.tensor([3.0, 4.0])), torch.tensor(5.0))
    assert unitwise_norm(torch.ones(4, 2, 3, 3)).shape == (4, 1, 1, 1)  # conv: one unit per output channel
    assert_close(unitwise_norm(torch.ones(4, 2, 3, 3)).flatten(), torch.full((4,), math.sqrt(18.0)))


def test_agc_by_hand():
    # lambda 0.05, eps 1e-3
    weight = torch.nn.Parameter(torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]]))
    weight.grad = torch.tensor([[0.3, 0.0, 0.4], [0.03, 0.04, 0.0]])
    zero_init = torch.nn.Parameter(torch.zeros(2))  # zero weights: the bound is lambda * eps = 5e-5
    zero_init.grad = torch.tensor([6e-5, 8e-5])
    no_grad = torch.nn.Parameter(torch.ones(3))
    clipped, units = adaptive_clip_([weight, zero_init, no_grad], clip=0.05, eps=1e-3)
    # row 0: |W| = 5, bound 0.25, |G| = 0.5 > 0.25 -> G * 0.25/0.5 = [0.15, 0, 0.2]
    # row 1: |W| = 2, bound 0.1, |G| = 0.05 <= 0.1 -> unchanged
    assert_close(weight.grad, torch.tensor([[0.15, 0.0, 0.2], [0.03, 0.04, 0.0]]))
    # zero-initialized vector: |G| = 1e-4 > 5e-5 -> G * 0.5
    assert_close(zero_init.grad, torch.tensor([3e-5, 4e-5]))
    assert no_grad.grad is None
    assert (clipped, units) == (2, 3)


def test_agc_exempts_zero_initialized_lora_factors():
    assert not agc_applies("base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight")
    assert not agc_applies("base_model.model.model.embed_tokens.lora_embedding_A.default")
    assert agc_applies("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight")
    assert agc_applies("model.layers.0.mlp.up_proj.weight")


def test_adaptive_kl_by_hand():
    kl = AdaptiveKL(beta=0.1, target=0.02, horizon=100)
    # KL 0.03: 0.03/0.02 - 1 = 0.5, clipped to 0.2; n = 10: beta = 0.1 * (1 + 0.2 * 10/100) = 0.102
    assert_close(kl.update(0.03, 10), 0.102)
    # KL 0.019: 0.95 - 1 = -0.05; beta = 0.102 * (1 - 0.05 * 0.1) = 0.102 * 0.995 = 0.10149
    assert_close(kl.update(0.019, 10), 0.10149)
    # a NaN KL (a skipped step) leaves beta alone
    assert_close(kl.update(math.nan, 10), 0.10149)
    # KL 0 with n = 1000: error clipped to -0.2, 1 - 0.2 * 10 = -1 -> beta held at 1e-8, still > 0
    assert_close(kl.update(0.0, 1000), 1e-8)
    # from there a high KL raises it: 1e-8 * (1 + 0.2 * 1) = 1.2e-8
    assert_close(kl.update(1.0, 100), 1.2e-8)
    assert kl.state_dict() == {"beta": kl.beta}


def test_per_token_kl_by_hand():
    # r = ref - logp: 0 -> e^0 - 0 - 1 = 0; 1 -> e - 2 = 0.718282; -1 -> e^-1 + 1 - 1 = 0.367879
    logps, ref = torch.tensor([[0.0, -1.0, -1.0]]), torch.tensor([[0.0, 0.0, -2.0]])
    assert_close(per_token_kl(logps, ref), torch.tensor([[0.0, math.e - 2, math.exp(-1)]]))


# --- config ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"grad_reg": ["zclip", "clipnorm"]}, "grad_reg entries must be among ['zclip', 'agc', 'skip_nonfinite'], got "
                                              "'clipnorm'"),
        ({"grad_reg": "zclip,zclip"}, "grad_reg lists a mode twice: ['zclip', 'zclip']"),
        ({"grad_reg": ["agc"], "max_grad_norm": 0.0}, "needs max_grad_norm > 0, got 0.0"),
        ({"zclip_alpha": 1.0}, "zclip_alpha must be a finite number in (0, 1), got 1.0"),
        ({"zclip_z_threshold": 0.0}, "zclip_z_threshold must be a finite number in (0, 1000], got 0.0"),
        ({"zclip_warmup_steps": 1}, "zclip_warmup_steps must be an integer >= 2, got 1"),
        ({"zclip_warmup_steps": 2.5}, "zclip_warmup_steps must be an integer >= 2, got 2.5"),
        ({"agc_clip": -0.01}, "agc_clip must be a finite number in (0, 1000], got -0.01"),
        ({"agc_eps": 0.0}, "agc_eps must be a finite number in (0, 1], got 0.0"),
        ({"grad_reg_max_skips": 0}, "grad_reg_max_skips must be an integer >= 1, got 0"),
        ({"kl_horizon": 0}, "kl_horizon must be an integer >= 1, got 0"),
        ({"kl_target": float("inf"), "beta": 0.04},
         "kl_target must be a finite number in (0, 1000], or None, got inf"),
        ({"grad_reg": ["zclip"], "max_grad_norm": None}, "needs max_grad_norm > 0, got None"),
        ({"kl_target": -0.1}, "kl_target must be a finite number in (0, 1000], or None, got -0.1"),
        ({"kl_target": 0.01, "beta": 0.0}, "kl_target (0.01) adapts beta multiplicatively: it needs beta > 0"),
    ],
)  # fmt: skip
def test_config_rejects_bad_grad_reg_values(tmp_path, overrides, expected):
    with pytest.raises(ValueError) as error:
        GRPOConfig(**small_grpo_kwargs(tmp_path, **overrides))
    assert expected in str(error.value)


def test_config_reads_a_comma_separated_list(tmp_path):
    assert GRPOConfig(**small_grpo_kwargs(tmp_path, grad_reg="zclip, agc")).grad_reg == ["zclip", "agc"]


# --- training runs --------------------------------------------------------------------------------------------------


class _TamperedTrainer(GRPOTrainer):
    """Multiplies every accumulated gradient by `factors[global_step]` after the step's last backward, before the
    Trainer clips: a gradient spike (1e4) or a NaN gradient (nan) on chosen optimizer steps."""

    factors: dict[int, float] = {}

    def training_step(self, model, inputs, num_items_in_batch):
        loss = super().training_step(model, inputs, num_items_in_batch)
        factor = self.factors.get(self.state.global_step)
        if factor is not None and self.accelerator.sync_gradients:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(factor)
        return loss


class _Recorder(TrainerCallback):
    """Per optimizer step: the norm of the gradients the optimizer is about to apply (after clipping); and copies of
    the parameters and optimizer state at the start and end of `watch_step`."""

    def __init__(self, watch_step: int | None = None):
        self.applied_norms, self.watch_step, self.snapshots = [], watch_step, {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        self.applied_norms.append(torch.nn.utils.get_total_norm(grads).item() if grads else None)

    def _snapshot(self, name, model, optimizer):
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.snapshots[name] = (params, copy.deepcopy(optimizer.state_dict()))

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if state.global_step == self.watch_step:
            self._snapshot("before", model, optimizer)

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.watch_step is not None and state.global_step == self.watch_step + 1:
            self._snapshot("after", model, optimizer)


def _trainer(tmp_path, model_dir, trainer_cls=GRPOTrainer, factors=None, peft_config=None, **overrides):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, **overrides))
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=[length_reward],
        args=args,
        train_dataset=Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16))),
        peft_config=peft_config,
    )
    trainer.factors = factors or {}
    trainer.remove_callback(PrinterCallback)
    return trainer


def _rows(trainer, key):
    return [row for row in trainer.state.log_history if key in row]


def test_zclip_bounds_a_gradient_spike(tiny_model_dir, tmp_path):
    """The step whose gradients are multiplied by 1e4 is applied with norm exactly ZClip's bound, far below
    max_grad_norm; every threshold is what ZClip gives for the logged pre-clip norms."""
    trainer = _trainer(
        tmp_path, tiny_model_dir, _TamperedTrainer, factors={3: 1e4}, grad_reg=["zclip"], zclip_warmup_steps=2,
        max_steps=4, max_grad_norm=5.0,
    )  # fmt: skip
    recorder = _Recorder()
    trainer.add_callback(recorder)
    trainer.train()

    rows = _rows(trainer, "grad_reg/threshold")
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    norms = [row["grad_norm"] for row in rows]
    assert norms[3] > 100 * max(norms[:3])  # the spike
    # replay ZClip on the logged pre-clip norms: thresholds min(clip value, max_grad_norm), else max_grad_norm
    replay = ZClip(0.97, 2.5, 2)
    expected, expected_z = [], []
    for norm in norms:
        clip, z = replay.step(norm)
        expected.append(5.0 if clip is None else min(clip, 5.0))
        expected_z += [] if z is None else [z]
    assert_close([row["grad_reg/threshold"] for row in rows], expected)
    assert_close([row["grad_reg/z"] for row in rows if "grad_reg/z" in row], expected_z)
    spike = rows[3]
    assert spike["grad_reg/clipped"] == 1.0 and spike["grad_reg/z"] > 2.5
    assert spike["grad_reg/threshold"] < 2 * max(norms[:3]) < 5.0  # near the usual norms, well below max_grad_norm
    # the update applied at the spike has norm == the bound (torch's clip: bound / (norm + 1e-6) * norm)
    assert_close(recorder.applied_norms[3], spike["grad_reg/threshold"], rtol=1e-4, atol=0)
    assert all(applied <= 5.0 for applied in recorder.applied_norms)


def test_nonfinite_step_is_skipped_and_training_goes_on(tiny_model_dir, tmp_path, caplog):
    trainer = _trainer(
        tmp_path, tiny_model_dir, _TamperedTrainer, factors={1: math.nan}, grad_reg=["skip_nonfinite"],
        lr_scheduler_type="constant",
    )  # fmt: skip
    recorder = _Recorder(watch_step=1)
    trainer.add_callback(recorder)
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.grad_reg.feature"):
        trainer.train()
    # numbered as logged: the second step (global_step 1 while it is taken) is the one logged with a NaN grad_norm
    assert [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()] == [
        "grad_reg: gradient norm nan at step 2: optimizer step skipped (1 in a row, 1 in all)"
    ]

    assert trainer.state.global_step == 3
    (params_before, optim_before), (params_after, optim_after) = (
        recorder.snapshots["before"],
        recorder.snapshots["after"],
    )
    assert optim_before["state"], "AdamW has state from step 1, so 'unchanged' is not vacuous"
    assert_close(params_after, params_before, rtol=0, atol=0)
    assert_close(optim_after["state"], optim_before["state"], rtol=0, atol=0)
    assert optim_after["param_groups"] == optim_before["param_groups"]
    assert recorder.applied_norms[1] is None  # no gradient reached the optimizer
    logs = {row["step"]: row for row in _rows(trainer, "grad_reg/skipped_steps")}
    assert [logs[s]["grad_reg/skipped_steps"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    assert math.isnan(logs[2]["grad_norm"]) and math.isfinite(logs[3]["grad_norm"])
    final = dict(trainer.model.named_parameters())
    assert any(not torch.equal(final[n].detach(), params_after[n]) for n in params_after)  # step 3 trained


def test_a_skipped_step_leaves_the_learning_rate_schedule_where_it_is(tiny_model_dir, tmp_path):
    """Issue #71 (carried over from #59's notes): the non-finite guard skipped the update but the schedule advanced
    a step, while under DeepSpeed (and torch's loss scaler) a skipped step leaves it where it is: transformers steps
    the scheduler unless accelerate reports the step skipped. Now the guard reports it: a linear schedule over 4
    steps gives step 3 the rate of step 2."""
    trainer = _trainer(tmp_path, tiny_model_dir, _TamperedTrainer, factors={1: math.nan}, grad_reg=["skip_nonfinite"],
                       lr_scheduler_type="linear", max_steps=4)  # fmt: skip
    trainer.train()
    rates = {row["step"]: row["learning_rate"] for row in _rows(trainer, "learning_rate")}
    reference = _trainer(tmp_path / "reference", tiny_model_dir, lr_scheduler_type="linear", max_steps=4)
    reference.train()
    expected = {row["step"]: row["learning_rate"] for row in _rows(reference, "learning_rate")}
    # each step logs the rate it was taken at: after the skipped step 2 the schedule has not moved, so step 3 gets
    # step 2's rate (it got step 3's, 0.005 of 0.01 -> 0 over 4 steps, before)
    assert rates == {1: expected[1], 2: expected[2], 3: expected[2], 4: expected[3]}
    assert expected[2] > expected[3]


def _with_loss_scaler(trainer, monkeypatch, init_scale: float) -> torch.amp.GradScaler:
    """A real torch GradScaler in the trainer's accelerator, as accelerate installs one for fp16 on CUDA (it scales
    the loss in `backward`, and the prepared optimizer steps through it); `unscale_gradients` unscales through it, as
    accelerate's does under fp16. Installed before `train()` prepares the optimizer."""
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1000)
    monkeypatch.setattr(trainer.accelerator, "scaler", scaler)
    monkeypatch.setattr(trainer.accelerator, "unscale_gradients",
                        lambda optimizer=None: scaler.unscale_(trainer.optimizer.optimizer))  # fmt: skip
    return scaler


def test_fp16_loss_scaler_overflows_are_the_scalers_not_skipped_steps(tiny_model_dir, tmp_path, monkeypatch):
    """Three overflows in a row (inf gradients at steps 1-3) with grad_reg_max_skips=2: the scaler skips each step and
    halves its scale; no skipped step is counted, no error, ZClip sees only the finite steps, and the run doctor finds
    nothing non-finite."""
    from trl_grpo_ext.doctor import diagnose

    trainer = _trainer(
        tmp_path, tiny_model_dir, _TamperedTrainer, factors=dict.fromkeys((0, 1, 2), math.inf), grad_reg=["zclip"],
        grad_reg_max_skips=2, max_steps=5, run_doctor=True, lr_scheduler_type="constant",
    )  # fmt: skip
    _with_loss_scaler(trainer, monkeypatch, init_scale=1024.0)
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    state = trainer.grad_reg_state
    assert (trainer.state.global_step, state.skipped, state.consecutive_skips, state.scaler_overflows) == (5, 0, 0, 3)
    logs = {row["step"]: row for row in _rows(trainer, "grad_reg/scaler_overflows")}
    assert [logs[s]["grad_reg/scaler_overflows"] for s in range(1, 6)] == [1.0, 2.0, 3.0, 3.0, 3.0]
    assert [logs[s]["grad_reg/skipped_steps"] for s in range(1, 6)] == [0.0] * 5
    assert [logs[s]["loss_scale"] for s in range(1, 6)] == [1024.0, 512.0, 256.0, 128.0, 128.0]  # halved per overflow
    assert all(math.isinf(logs[s]["grad_norm"]) for s in (1, 2, 3)) and math.isfinite(logs[4]["grad_norm"])
    assert len(state.zclip.buffer) == 2  # steps 4 and 5 (the warm-up buffer): no overflow in ZClip's statistics
    assert trainer.optimizer.optimizer.state_dict()["state"][0]["step"] == 2  # AdamW stepped twice
    assert any(not torch.equal(initial[n], p) for n, p in trainer.model.named_parameters())
    assert [f for f in diagnose(trainer.state.log_history).findings if f.check == "nonfinite"] == []


def test_overflows_below_a_loss_scale_of_1_are_divergence(tiny_model_dir, tmp_path, monkeypatch):
    """At a scale below 1 an overflow is not the scaler's calibration: it counts as a skipped step, and
    grad_reg_max_skips of them stop the run."""
    trainer = _trainer(
        tmp_path, tiny_model_dir, _TamperedTrainer, factors=dict.fromkeys(range(3), math.inf), grad_reg=["zclip"],
        grad_reg_max_skips=2, max_steps=3,
    )  # fmt: skip
    _with_loss_scaler(trainer, monkeypatch, init_scale=0.5)
    with pytest.raises(NonFiniteGradientError, match="grad_reg_max_skips=2"):
        trainer.train()
    assert (trainer.grad_reg_state.skipped, trainer.grad_reg_state.scaler_overflows) == (2, 0)


def test_consecutive_nonfinite_steps_save_and_stop(tiny_model_dir, tmp_path):
    trainer = _trainer(
        tmp_path, tiny_model_dir, _TamperedTrainer, factors=dict.fromkeys(range(5), math.nan),
        grad_reg=["zclip", "agc"], grad_reg_max_skips=2, max_steps=5,
    )  # fmt: skip
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(NonFiniteGradientError, match=r"grad_reg_max_skips=2\).*the last one at step 2 "):
        trainer.train()
    checkpoint = tmp_path / "checkpoint-1"
    assert trainer.state.global_step == 1 and checkpoint_problem(str(checkpoint)) is None
    saved = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert_close(dict(saved.named_parameters()), initial, rtol=0, atol=0)  # never updated
    assert trainer.grad_reg_state.skipped == 2

    # a complete checkpoint of this step exists already: no second save, the same error
    saves = []
    trainer._save_checkpoint = lambda model, trial: saves.append(trial)
    trainer.grad_reg_state.consecutive_skips = 1
    with pytest.raises(NonFiniteGradientError):
        trainer.features["grad_reg"]._count_skip(trainer.model, math.nan)
    assert saves == []


def test_skip_nonfinite_alone_clips_as_stock(tiny_model_dir, tmp_path):
    """With finite gradients, `skip_nonfinite` clips at max_grad_norm exactly as the Trainer does."""
    stock = _trainer(tmp_path / "stock", tiny_model_dir, max_steps=2, max_grad_norm=0.05)
    stock.train()  # trained before the second trainer is built: building one seeds the RNG that sampling uses
    guarded = _trainer(
        tmp_path / "guarded", tiny_model_dir, max_steps=2, max_grad_norm=0.05, grad_reg="skip_nonfinite"
    )
    guarded.train()
    assert all(row["grad_reg/clipped"] == 1.0 for row in _rows(guarded, "grad_reg/clipped"))  # clipping happened
    keys = ("loss", "grad_norm", "reward", "entropy")
    assert [[r[k] for k in keys] for r in _rows(stock, "loss")] == [
        [r[k] for k in keys] for r in _rows(guarded, "loss")
    ]
    for (name, a), (_, b) in zip(stock.model.named_parameters(), guarded.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_resume_is_exact(tiny_model_dir, tmp_path):
    config = {
        "grad_reg": ["zclip", "agc"],
        "zclip_warmup_steps": 2,
        "beta": 0.04,
        "kl_target": 0.01,
        "kl_horizon": 100,
    }
    assert check_resume(config, tmp_path, tiny_model_dir) <= 1e-6


GRAD_REG_2P = {"grad_reg": ["zclip", "agc"], "zclip_warmup_steps": 2, "beta": 0.04, "kl_target": 0.001,
               "kl_horizon": 50, "per_device_train_batch_size": 6, "max_steps": 4, "save_steps": 4}  # fmt: skip


@two_process("grad_reg", GRAD_REG_2P)
def test_two_processes_hold_the_same_state(two_process_runs):
    """Under 2 processes each rank logs from its own ZClip and β: they must agree at every step, and move. The run is
    scenario "grad_reg" of the suite's shared two-process job (tests/two_process.py)."""
    ranks = full_records(two_process_runs["grad_reg"])
    keys = ("grad_reg/threshold", "grad_reg/z", "grad_reg/agc_clipped_frac", "kl_coef", "grad_norm")
    per_rank = [[{k: row[k] for k in keys if k in row} for row in rank["logs"] if "kl_coef" in row] for rank in ranks]
    assert len(per_rank[0]) == 4 and per_rank[0] == per_rank[1]
    betas = [row["kl_coef"] for row in per_rank[0]]
    assert betas[0] == 0.04 and len(set(betas)) == 4  # beta moves every step, identically on both ranks
    assert any("grad_reg/z" in row for row in per_rank[0])  # ZClip is past its warm-up


def test_lora_trains_with_zclip_agc_and_adaptive_kl(tiny_model_dir, tmp_path):
    """Zero-initialized lora_B is left to the global clip (AGC would hold each of its rows at λ·ε = 1e-5), and β
    follows Ziegler et al.'s rule on the KL TRL logs."""
    trainer = _trainer(
        tmp_path, tiny_model_dir, grad_reg=["zclip", "agc"], zclip_warmup_steps=2, max_steps=3, learning_rate=5e-2,
        beta=0.04, kl_target=0.01, kl_horizon=100, peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )  # fmt: skip
    lora_b_rows = []

    class LoraBGrads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n and p.grad is not None]
            lora_b_rows.append(max(unitwise_norm(g).max().item() for g in grads))

    trainer.add_callback(LoraBGrads())
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)
    assert lora_b_rows[0] > 10 * 0.01 * 1e-3  # not AGC-clipped at the first step, while lora_B is still zero
    fractions = [row["grad_reg/agc_clipped_frac"] for row in _rows(trainer, "grad_reg/agc_clipped_frac")]
    assert len(fractions) == 3 and all(0.0 <= f <= 1.0 for f in fractions)
    # adaptive KL, 8 completions a step: step 1's policy is the reference (KL 0): error clip(0/0.01 - 1) = -0.2,
    # beta = 0.04 * (1 - 0.2 * 8/100) = 0.03936; step 3's beta follows from step 2's KL the same way
    rows = _rows(trainer, "kl_coef")
    kl = [row["kl"] for row in rows]
    assert kl[0] == 0.0 and kl[1] > 0.0
    error = min(max(kl[1] / 0.01 - 1, -0.2), 0.2)
    expected = [0.04, 0.03936, 0.03936 * (1 + error * 8 / 100)]
    assert_close([row["kl_coef"] for row in rows], expected, rtol=1e-6, atol=0)
    assert_close(trainer.beta, expected[2] * (1 + min(max(kl[2] / 0.01 - 1, -0.2), 0.2) * 8 / 100), rtol=1e-6, atol=0)


# --- DeepSpeed and FSDP: what is refused before the model loads. The engines themselves run in
# tests/engines/test_engines.py (real DeepSpeed ZeRO-2/3 and FSDP2 on 2 CPU processes).


def test_grad_reg_is_refused_where_deepspeed_would_apply_a_nan_step(tmp_path, monkeypatch):
    """Releases before DEEPSPEED_FLOOR, and bf16.check_grad_overflow=false, let DeepSpeed write a NaN step into the
    weights inside `backward`, before the guard runs: refused, one line, before TrainingArguments builds the plugin."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, grad_reg=["zclip"]))
    monkeypatch.setattr(grad_reg_config, "version", lambda package: {"deepspeed": "0.19.7"}[package])
    check_deepspeed(args)  # no DeepSpeed in this launch: nothing read
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    message = (
        "grad_reg=['zclip'] under DeepSpeed (accelerate launch's ACCELERATE_DEEPSPEED_ZERO_STAGE=2) needs "
        "deepspeed>=0.19.8, found 0.19.7"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        GRPOConfig(**small_grpo_kwargs(tmp_path, grad_reg=["zclip"]))
    monkeypatch.setattr(grad_reg_config, "version", lambda package: "0.19.8")
    check_deepspeed(args)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    # a flag off as DeepSpeed's pydantic config reads it, under both names of the bf16 section
    for section, off in [("bf16", False), ("bf16", "false"), ("bf16", 0), ("bf16", "no"), ("bfloat16", "off")]:
        unchecked = {section: {"enabled": True, "check_grad_overflow": off}, "zero_optimization": {"stage": 2}}
        with pytest.raises(ValueError, match=re.escape("bf16.check_grad_overflow is off, so DeepSpeed applies")):
            GRPOConfig(**small_grpo_kwargs(tmp_path, grad_reg=["zclip"], deepspeed=unchecked))
    refused = [
        ({"zero_optimization": {"stage": 0}}, "ZeRO stage 0 steps with the plain optimizer"),
        ({"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}, "fp16 loss scaling counts each loss-scale"),
        ({"zero_optimization": {"stage": 1, "compute_grad_norm": False}}, "compute_grad_norm is off"),
    ]
    for config, message in refused:
        with pytest.raises(ValueError, match=re.escape(message)):
            GRPOConfig(**small_grpo_kwargs(tmp_path, grad_reg=["zclip"], deepspeed=config))
    # where DeepSpeed skips by itself: ZeRO-3 checks the norm whatever the flag, fp32 ignores the bf16 flag
    for bf16, stage in [(True, 3), (False, 2)]:
        config = {"bf16": {"enabled": bf16, "check_grad_overflow": False}, "zero_optimization": {"stage": stage}}
        args.deepspeed = config
        check_deepspeed(args)
    args.grad_reg = []  # the guard off: DeepSpeed's own behaviour is left alone
    args.deepspeed = {"zero_optimization": {"stage": 0}, "fp16": {"enabled": True}}
    check_deepspeed(args)


class _StandInEngine:
    """A stand-in for a DeepSpeed engine at the two points grad_reg reads it (the real engine runs in
    tests/engines/test_engines.py, where DeepSpeed 0.19.8 reports an infinite norm for every step it skips and never
    takes a non-finite one, so neither case below can happen there): `skipped_steps` and the config it parsed."""

    def __init__(self, stage=2, fp16=False, bf16=False, check=True):
        self.skipped_steps, self.optimizer = 0, SimpleNamespace(clip_grad=1.0)
        self._stage, self._fp16, self._bf16 = stage, fp16, bf16
        self._config = SimpleNamespace(bfloat16_config=SimpleNamespace(check_grad_overflow=check))

    def zero_optimization_stage(self):
        return self._stage

    def fp16_enabled(self):
        return self._fp16

    def bfloat16_enabled(self):
        return self._bf16

    def zero_compute_grad_norm(self):
        return True


def _stand_in_deepspeed_trainer(tmp_path, engine):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, grad_reg=["zclip"], zclip_warmup_steps=2))
    trainer = SimpleNamespace(args=args, deepspeed=engine, state=SimpleNamespace(global_step=0),
                              accelerator=SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, scaler=None),
                              _metrics=defaultdict(lambda: defaultdict(list)))  # fmt: skip
    return trainer, GradReg(trainer)


def test_a_skip_is_read_off_the_engine_not_off_its_norm_with_a_stand_in_engine(tmp_path):
    """DeepSpeed 0.19.0-0.19.7 reported a finite norm (about 1.0) for a NaN step: whether a step was skipped is the
    engine's count going up, whatever norm it reports; a non-finite norm on a step the engine took stops the run."""
    engine = _StandInEngine()
    trainer, feature = _stand_in_deepspeed_trainer(tmp_path, engine)
    feature.training_step(None)
    engine.skipped_steps += 1  # the engine skipped this step, and reports a finite norm
    feature.clip_gradients(None, lambda model: torch.tensor(1.0))
    assert feature.state().skipped == 1 and feature.state().consecutive_skips == 1
    feature.training_step(None)  # the next step is taken, with a finite norm
    feature.clip_gradients(None, lambda model: torch.tensor(0.5))
    assert feature.state().skipped == 1 and feature.state().consecutive_skips == 0
    feature.training_step(None)  # taken with a NaN norm: the weights are gone
    with pytest.raises(NonFiniteGradientError, match="DeepSpeed took optimizer step 1 with a gradient norm of nan"):
        feature.clip_gradients(None, lambda model: torch.tensor(float("nan")))


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        (_StandInEngine(stage=0), "ZeRO stage 0 steps with the plain optimizer"),
        (_StandInEngine(fp16=True), "fp16 loss scaling counts each loss-scale overflow"),
        (_StandInEngine(bf16=True, check=False), "bf16.check_grad_overflow is off"),
    ],
)
def test_an_engine_that_would_not_skip_is_refused_at_the_first_step_with_a_stand_in_engine(tmp_path, engine, message):
    """The config DeepSpeed parsed, read at the first step, catches what the config check could not read (a base64
    config, accelerate's own)."""
    trainer, feature = _stand_in_deepspeed_trainer(tmp_path, engine)
    with pytest.raises(ValueError, match=re.escape(f"grad_reg=['zclip'] under DeepSpeed: {message}")):
        feature.training_step(None)
    # ZeRO-3 checks the norm itself: accepted
    trainer, feature = _stand_in_deepspeed_trainer(tmp_path, _StandInEngine(stage=3, bf16=True, check=False))
    feature.training_step(None)


@pytest.mark.parametrize(
    ("environ", "engine"),
    [
        ({"ACCELERATE_USE_FSDP": "true"}, "FSDP, from accelerate launch's ACCELERATE_USE_FSDP"),
        ({"ACCELERATE_USE_DEEPSPEED": "1"}, "DeepSpeed, from accelerate launch's ACCELERATE_DEEPSPEED_ZERO_STAGE=2"),
    ],
)
def test_agc_is_refused_at_config_time_under_a_partitioning_engine(tmp_path, monkeypatch, environ, engine):
    monkeypatch.setattr(grad_reg_config, "version", lambda package: "0.19.8")
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(f"{engine} keeps them in partitions. Use 'zclip' there.")):
        GRPOConfig(**small_grpo_kwargs(tmp_path, grad_reg=["zclip", "agc"]))

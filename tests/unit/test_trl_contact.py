"""The contact surface with TRL's and transformers' private API (`trl_grpo_ext.trl_contact`): the import-time check
refuses a TRL that changed, the private methods are overridden in one class only, private attributes are read in one
module only, and restored state lands on the trainer's device."""

import ast
import inspect
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from trl.trainer.grpo_trainer import GRPOTrainer as TRLGRPOTrainer
from trl.trainer.utils import RepeatSampler

import trl_grpo_ext
from trl_grpo_ext import trl_contact
from trl_grpo_ext.resume import load_resume_state, save_resume_state
from trl_grpo_ext.trl_contact import (
    DEEPSPEED_ATTRIBUTES,
    PRIVATE_METHODS,
    GRPOLoopState,
    TRLCompatibilityError,
    TRLContact,
    check_contact_surface,
    check_deepspeed_engine,
    hook_name,
)

PACKAGE = Path(trl_grpo_ext.__file__).parent


def test_installed_trl_and_transformers_fit():
    check_contact_surface()  # raises on a mismatch


def test_changed_parameters_are_refused_with_the_method_and_the_supported_versions():
    class RenamedArgument(TRLGRPOTrainer):
        def _compute_loss(self, model, batch):  # TRL renamed `inputs`
            return super()._compute_loss(model, batch)

    with pytest.raises(TRLCompatibilityError) as error:
        check_contact_surface(RenamedArgument)
    message = str(error.value)
    assert "_compute_loss" in message and "('self', 'model', 'batch')" in message
    assert "trl>=1.16,<1.17" in message and "transformers>=5.18,<6" in message
    assert "installed: trl " in message


def test_method_that_clips_inline_is_refused():
    """transformers before 5.3 clips gradients inside the training loop: `grad_reg` would silently do nothing."""

    class OldTransformers(TRLGRPOTrainer):
        _clip_grad_norm = None

    with pytest.raises(TRLCompatibilityError, match=r"transformers 5.24.0 Trainer\._clip_grad_norm is gone"):
        check_contact_surface(OldTransformers)


def test_compute_entropy_keyword_removed_is_refused():
    class NoEntropyKeyword(TRLGRPOTrainer):
        def _get_per_token_logps_and_entropies(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size=None
        ):
            raise AssertionError("not called")

    with pytest.raises(TRLCompatibilityError, match="_get_per_token_logps_and_entropies"):
        check_contact_surface(NoEntropyKeyword)


def test_hook_name_taken_by_trl_is_refused():
    class TakesOurName(TRLGRPOTrainer):
        def hook_compute_loss(self, model, inputs):
            raise AssertionError("not called")

    with pytest.raises(TRLCompatibilityError, match="hook_compute_loss"):
        check_contact_surface(TakesOurName)


def test_attribute_no_longer_set_is_refused(monkeypatch):
    monkeypatch.setitem(trl_contact.PRIVATE_ATTRIBUTES, "_renamed_buffer", TRLGRPOTrainer)
    with pytest.raises(TRLCompatibilityError, match=r"GRPOTrainer no longer sets self\._renamed_buffer"):
        check_contact_surface()


def test_renamed_sampler_field_is_refused():
    """A renamed field would switch the epoch-order fix of exact resume off without a word."""

    class RenamedSeed(RepeatSampler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.random_seed = self.__dict__.pop("seed")

    with pytest.raises(TRLCompatibilityError, match="RepeatSampler has no field 'seed'"):
        check_contact_surface(sampler_class=RenamedSeed)


PRETRAINED = transformers.PreTrainedModel
GRAD_HOOK_INTERNAL = "PreTrainedModel.enable_input_require_grads registers make_inputs_require_grads"


class OldCompileConfig:
    """A CompileConfig without the private switch fast generation sets off CUDA."""


class RenamedGradHook(transformers.PreTrainedModel):
    def enable_input_require_grads(self):
        def make_inputs_need_grads(module, input, output):
            output.requires_grad_(True)

        self.get_input_embeddings().register_forward_hook(make_inputs_need_grads)


@pytest.mark.parametrize(
    "changed, named",
    [
        ({"compile_config_class": OldCompileConfig}, "CompileConfig._compile_all_devices"),
        ({"model_class": RenamedGradHook}, GRAD_HOOK_INTERNAL),
        (
            {"model_class": type("NoFlag", (), {"enable_input_require_grads": PRETRAINED.enable_input_require_grads})},
            "PreTrainedModel._can_compile_fullgraph",
        ),
    ],
    ids=["compile-all-devices", "grad-hook-name", "fullgraph-flag"],
)
def test_a_transformers_internal_that_is_gone_fails_at_import_naming_it(changed, named):
    """Fast generation's transformers internals are checked like TRL's: a rename would otherwise be a silent no-op
    (the repeated hooks would pile up again) or a late error."""
    with pytest.raises(TRLCompatibilityError) as error:
        check_contact_surface(**changed)
    assert f"transformers {named}" in str(error.value) and "is gone (written against 5.24.0)" in str(error.value)
    assert "supported: trl>=1.16,<1.17, transformers>=5.18,<6" in str(error.value)


def test_version_outside_the_tested_range_warns_only(monkeypatch, caplog):
    monkeypatch.setitem(trl_contact.SUPPORTED, "trl", ">=99")
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.trl_contact"):
        check_contact_surface()
    assert "tested with trl>=99" in caplog.text


def test_supported_ranges_are_the_ones_pyproject_states():
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    for name, spec in trl_contact.SUPPORTED.items():
        assert f'"{name}{spec}"' in pyproject


def test_private_methods_are_overridden_in_trl_contact_only():
    """Every class of the package: a method named like a private attribute of TRL's trainer is an override, and only
    `TRLContact` may have one; each override forwards to its hook."""
    overriding = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    is_def = isinstance(item, ast.FunctionDef)
                    if is_def and item.name.startswith("_") and not item.name.startswith("__"):
                        if hasattr(TRLGRPOTrainer, item.name):
                            where = path.relative_to(PACKAGE).as_posix()
                            overriding.setdefault(item.name, []).append(f"{where}:{node.name}")
    assert {name: where for name, where in overriding.items() if where != ["trl_contact/hooks.py:TRLContact"]} == {}
    overridden = set(overriding)
    called = ("_get_grad_norm", "_get_output_dir", "_inner_training_loop", "save_model")  # called or looked for
    assert overridden == {n for n in PRIVATE_METHODS if n not in called}
    for name in overridden:
        assert hook_name(name) in TRLContact.__dict__
        assert f"self.{hook_name(name)}(" in inspect.getsource(TRLContact.__dict__[name])


def _private_names(tree: ast.AST) -> tuple[set[str], list[tuple[int, str]]]:
    """(`_names` this module defines: functions, classes, module and class attributes, `self._x =` targets; every
    `._name` attribute access with its line)."""
    defined, used = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id == "self":
                defined.add(node.attr)
            used.append((node.lineno, node.attr))
    return defined, used


def test_private_attributes_are_read_in_trl_contact_only():
    """Every `._name` access in the package outside `trl_contact/` is to a name the package defines itself (and
    that TRL's trainer does not have): anything else is somebody else's private API."""
    trees = {path: ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}
    ours = set().union(*(_private_names(tree)[0] for tree in trees.values()))
    ours = {name for name in ours if not hasattr(TRLGRPOTrainer, name)} - set(trl_contact.PRIVATE_ATTRIBUTES)
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line}: .{name}"
        for path, tree in trees.items()
        if path.relative_to(PACKAGE).parts[0] != "trl_contact"
        for line, name in _private_names(tree)[1]
        if name not in ours
    ]
    assert offenders == []


def test_compute_entropy_reaches_the_hooks_by_name_however_trl_passes_it():
    """TRL passing `compute_entropy` positionally must not switch the per-group entropy statistic off."""

    class Probe(TRLContact):
        def hook_get_per_token_logps_and_entropies(self, **kwargs):
            self.seen = kwargs
            return None

    probe = Probe.__new__(Probe)  # no model needed: only the forwarding runs
    ids, mask = torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5)
    probe._get_per_token_logps_and_entropies("model", ids, mask, 3, 2, True)
    assert probe.seen["compute_entropy"] is True and probe.seen["batch_size"] == 2
    assert probe.seen["logits_to_keep"] == 3 and probe.seen["model"] == "model"
    probe._get_per_token_logps_and_entropies("model", ids, mask, 3)
    assert probe.seen["compute_entropy"] is False  # TRL's default, filled in


def test_restored_buffered_batch_goes_to_the_trainers_device(tmp_path):
    """The state file is read onto the CPU; the buffered batch must land on `accelerator.device` (here the meta
    device stands in for a GPU) with its dtypes, and the metrics and step come back as they were."""
    batch = {
        "prompt_ids": torch.arange(6).reshape(2, 3),
        "advantages": torch.tensor([0.5, -0.5], dtype=torch.float32),
        "old_per_token_logps": torch.zeros(2, 3, dtype=torch.bfloat16),
        "num_items_in_batch": torch.tensor(6),
        "policy_group_names": ["a", "b"],
    }
    saved = {
        "step": 3,
        "buffered_inputs": [batch, batch],
        "pending_metrics": {"reward": [0.25]},
        "pending_loss": 1.5,
        "last_logged_step": 1,
    }
    save_resume_state(str(tmp_path), 0, {"grpo_loop": saved})
    state = load_resume_state(str(tmp_path), 0)["grpo_loop"]
    assert state["buffered_inputs"][0]["prompt_ids"].device.type == "cpu"
    trainer = SimpleNamespace(accelerator=SimpleNamespace(device=torch.device("meta")), _metrics={"train": {}})
    GRPOLoopState(trainer).load_state_dict(state)
    assert trainer._step == 3 and trainer._metrics["train"] == {"reward": [0.25]}
    for restored in trainer._buffered_inputs:
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                assert restored[key].device.type == "meta" and restored[key].dtype == value.dtype, key
            else:
                assert restored[key] == value
    trainer._tr_loss, trainer._globalstep_last_logged = torch.tensor(0.25), 0
    GRPOLoopState.restore_pending_loss(trainer)
    assert trainer._tr_loss.item() == 1.75 and trainer._globalstep_last_logged == 1
    GRPOLoopState.restore_pending_loss(trainer)  # once only
    assert trainer._tr_loss.item() == 1.75


def test_the_package_re_exports_every_public_name_of_its_modules_and_checks_at_import():
    """`trl_contact` is a package by role; `from trl_grpo_ext.trl_contact import X` works for every public name, as
    when it was one module, and importing it runs `check_contact_surface()` (its last statement)."""
    folder = PACKAGE / "trl_contact"
    modules = sorted(path.stem for path in folder.glob("*.py") if path.stem != "__init__")
    assert modules == ["accessors", "deepspeed_internals", "generation_internals", "hooks", "loop_state", "surface",
                       "vllm_internals"]  # fmt: skip
    for stem in modules:
        module = __import__(f"trl_grpo_ext.trl_contact.{stem}", fromlist=["_"])
        own = [name for name, value in vars(module).items() if not name.startswith("_")
               and getattr(value, "__module__", module.__name__) == module.__name__ and name.isidentifier()
               and not inspect.ismodule(value) and name != "logger"]  # fmt: skip
        for name in own:
            assert name in trl_contact.__all__ and getattr(trl_contact, name) is getattr(module, name), name
    last = ast.parse((folder / "__init__.py").read_text()).body[-1]
    assert ast.unparse(last) == "check_contact_surface()"


def test_a_deepspeed_engine_without_what_grad_reg_touches_is_refused_by_name():
    """DeepSpeed is optional, so its attributes are checked when the trainer first meets an engine (the real engine
    runs in tests/engines/test_engines.py): an engine, its parsed config or its ZeRO optimizer without one of
    `DEEPSPEED_ATTRIBUTES` raises, naming it; a ZeRO-0 engine's plain optimizer is not asked for `clip_grad`."""

    def engine(stage=2):
        return SimpleNamespace(
            skipped_steps=0, zero_optimization_stage=lambda: stage, fp16_enabled=lambda: False,
            bfloat16_enabled=lambda: False, zero_compute_grad_norm=lambda: True,
            _config=SimpleNamespace(bfloat16_config=SimpleNamespace(check_grad_overflow=True)),
            optimizer=SimpleNamespace(clip_grad=1.0),
        )  # fmt: skip

    check_deepspeed_engine(engine())
    owners = {"engine": lambda e: e, "engine.optimizer": lambda e: e.optimizer,
              "engine._config.bfloat16_config": lambda e: e._config.bfloat16_config}  # fmt: skip
    for owner, name in DEEPSPEED_ATTRIBUTES:
        lacking = engine()
        delattr(owners[owner](lacking), name)
        with pytest.raises(TRLCompatibilityError, match=re.escape(f"{owner} has no `{name}`, which grad_reg reads")):
            check_deepspeed_engine(lacking)
    plain = engine(stage=0)
    del plain.optimizer.clip_grad
    check_deepspeed_engine(plain)

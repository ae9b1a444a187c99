"""Issue #16: the package's shape. The trainer composes its features in one visible place (`composition.STEP`), modes
are entries of registries (adding one touches no other code), task support and the consumer-GPU estimator stay out
of the trainer core, and the config documents exactly the fields it has."""

import ast
import dataclasses
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
import torch
import trl
from datasets import Dataset

import trl_grpo_ext
from tests.conftest import length_reward, small_grpo_kwargs
from tests.meta.reward_scale.config import REWARD_SCALE_CONFIG, RewardScaleFields
from tests.meta.reward_scale.feature import RewardScale
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.composition import FEATURES, PACKAGE_FEATURES, STEP, step_features
from trl_grpo_ext.config import FEATURE_CONFIGS
from trl_grpo_ext.entropy import bonus
from trl_grpo_ext.entropy.modes import ENTROPY_REG_MODES, EntropyMode
from trl_grpo_ext.feature_api import FEATURE_CLASSES, POINTS, Feature, Registry, Regroup
from trl_grpo_ext.field_checks import config_parts
from trl_grpo_ext.grad_reg.modes import GRAD_REG_MODES, GradRegMode
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows

PACKAGE = Path(trl_grpo_ext.__file__).parent
# a folder of the package with a `feature.py` holds a feature (`composition.py` imports each of those modules)
FEATURE_FOLDERS = {path.parent.name for path in PACKAGE.glob("*/feature.py")}
# the `Feature` method each point of `STEP` calls (the point's name, but for the checkpoint's `state`)
METHOD = {point: "state" if point == "checkpoint" else point for point in POINTS}


def test_step_lists_every_point_in_order_and_only_known_features():
    assert tuple(STEP) == POINTS
    names = [feature.name for feature in FEATURES]
    assert len(set(names)) == len(names)
    for point, acting in STEP.items():
        assert set(acting) <= set(names), f"STEP[{point!r}] names an unknown feature"
        assert len(set(acting)) == len(acting)
    assert len(STEP["clip_gradients"]) <= 1  # the trainer hands transformers' clipping to one feature


@pytest.mark.parametrize("feature", FEATURES, ids=[f.name for f in FEATURES])
def test_each_feature_overrides_exactly_the_points_step_lists_for_it(feature):
    """`STEP` is the whole truth of what runs when: a feature method for a point it is not listed at would never be
    called, and a listed point it does not override would be a no-op in the table."""
    overridden = {point for point in POINTS if getattr(feature, METHOD[point]) is not getattr(Feature, METHOD[point])}
    listed = {point for point, acting in STEP.items() if feature.name in acting}
    assert overridden == listed


def test_features_talk_through_announced_events_not_the_mro():
    """No feature is a base class of the trainer (no `super()` chains between features), and no feature module
    imports another feature's module: a regroup reaches entropy regularization only as an announced `Regroup`."""
    assert not any(issubclass(GRPOTrainer, feature) for feature in FEATURES)
    folders = FEATURE_FOLDERS
    assert folders == {feature.__module__.split(".")[1] for feature in FEATURES}  # each folder's feature is in STEP
    for folder in folders:
        for path in (PACKAGE / folder).glob("*.py"):
            imported = _imports(path)
            others = {other for other in folders - {folder}
                      if any(name.startswith(f"trl_grpo_ext.{other}") for name in imported)}  # fmt: skip
            assert not others, f"{path.relative_to(PACKAGE)} imports {others}"


class StepCounter(Feature):
    """A trivial feature for `test_a_new_feature_is_its_folder_and_its_line_in_step`: notes the global step after
    each micro-step. In the package it would be `trl_grpo_ext/step_counter/feature.py` (its folder) plus its name in
    `STEP["training_step_end"]`."""

    name = "step_counter"

    @classmethod
    def build(cls, trainer) -> "StepCounter":
        return cls(trainer)

    def __init__(self, trainer):
        super().__init__(trainer)
        self.seen: list[int] = []

    def training_step_end(self) -> None:
        self.seen.append(self.trainer.state.global_step)


@pytest.fixture
def step_counter():
    """`StepCounter`, defined when this module was imported and so recorded in `FEATURE_CLASSES`, named in `STEP`
    for one test: the one line a new feature adds outside its folder."""
    assert FEATURE_CLASSES["step_counter"] is StepCounter
    assert "step_counter" not in {feature.name for feature in FEATURES}  # only STEP makes the trainer build it
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(STEP, "training_step_end", (*STEP["training_step_end"], "step_counter"))
        yield StepCounter


def test_a_new_feature_is_its_folder_and_its_line_in_step(tmp_path, tiny_model_dir, step_counter):
    """Adding a feature touches no other place of the package: named in `STEP` at the point it acts, the trainer
    builds it (`step_features`) and calls it there. Two optimizer steps of two micro-steps each: it sees global
    steps 0, 0, 1, 1 (transformers counts an optimizer step after its last micro-step), once each."""
    assert step_counter in step_features(STEP)
    overridden = {
        point for point in POINTS if getattr(step_counter, METHOD[point]) is not getattr(Feature, METHOD[point])
    }
    assert overridden == {point for point, acting in STEP.items() if "step_counter" in acting} == {"training_step_end"}
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16, seed=0)))
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=2, gradient_accumulation_steps=2))
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, dataset)
    trainer.train()
    assert list(trainer.features) == ["step_counter"]  # every feature of the package is off
    assert trainer.features["step_counter"].seen == [0, 0, 1, 1]
    assert trainer.state.global_step == 2


@dataclass
class RewardScaleConfig(RewardScaleFields, GRPOConfig):
    """`GRPOConfig` with the test feature's settings: outside the package, a feature's fields class is a base of a
    subclass (in the package, a base of `GRPOConfig` itself)."""


def test_a_feature_with_settings_from_outside_the_package(tmp_path, tiny_model_dir):
    """A user's feature with two settings (`tests/meta/reward_scale/`: its fields class and `ConfigPart` with ranges
    and a rule between fields, its `Feature`), its fields class a base of a subclass of `GRPOConfig` and its line
    added to `STEP`. The config checks its fields by their declared ranges and rule and reads strings as TrlParser
    does, and the trainer builds the feature and calls it at its point, from the step its setting names."""
    assert config_parts(RewardScaleConfig)[-1] is REWARD_SCALE_CONFIG  # found from the base, no list to edit
    kwargs = small_grpo_kwargs(tmp_path, max_steps=2, beta=0.0)
    with pytest.raises(ValueError, match=r"reward_scale must be a finite number in \(0, 10\], got 0.0"):
        RewardScaleConfig(**kwargs, reward_scale=0.0)
    with pytest.raises(ValueError, match=r"reward_scale_from_step must be an integer >= 0, got -1"):
        RewardScaleConfig(**kwargs, reward_scale=2.0, reward_scale_from_step=-1)
    with pytest.raises(ValueError, match=r"reward_scale=2.0 needs beta=0.0, got beta=0.04"):
        RewardScaleConfig(**{**kwargs, "beta": 0.04}, reward_scale=2.0)
    args = RewardScaleConfig(**kwargs, reward_scale="2.5", reward_scale_from_step="1")  # read as TrlParser reads it
    assert (args.reward_scale, args.reward_scale_from_step) == (2.5, 1)
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16, seed=0)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(STEP, "advantages", (*STEP["advantages"], "reward_scale"))
        trainer = GRPOTrainer(tiny_model_dir, length_reward, args, dataset)
        trainer.train()
    assert list(trainer.features) == ["reward_scale"]
    assert isinstance(trainer.features["reward_scale"], RewardScale)
    assert trainer.features["reward_scale"].scaled == [1]  # the generation batch of step 1 only
    assert trainer.state.global_step == 2


REPOSITORY = PACKAGE.parent
NEW_FEATURE = Path(__file__).parent / "reward_scale"  # the reward scale, a feature of two settings


def _add_reward_scale(root: Path) -> None:
    """Add the reward scale to the copy of the package and its docs at `root`, as `docs/adding-a-feature.md` says:
    its folder, its lines in `composition.py` (the imports, `PACKAGE_FEATURES`, `FeatureFields`' bases, `STEP`), its
    page in `docs/features/`. Raises AssertionError where `composition.py` no longer reads as the doc describes."""
    folder = root / "trl_grpo_ext" / "reward_scale"
    shutil.copytree(NEW_FEATURE, folder, ignore=shutil.ignore_patterns("*.md", "__pycache__"))
    shutil.copy(NEW_FEATURE / "reward-scale.md", root / "docs" / "features" / "reward-scale.md")
    composition = root / "trl_grpo_ext" / "composition.py"
    source = composition.read_text()
    edits = {  # each line of composition.py the doc names, and the same line with the feature added
        "from .vllm_lora.feature import VLLMLoRASync\n": "from .vllm_lora.feature import VLLMLoRASync\n"
        "from .reward_scale.config import RewardScaleFields\nfrom .reward_scale.feature import RewardScale\n",
        "    RunDoctor,\n)\n": "    RunDoctor,\n    RewardScale,\n)\n",
        "class FeatureFields(\n": "class FeatureFields(\n    RewardScaleFields,\n",
        '"advantages": (': '"advantages": ("reward_scale", ',
    }
    for line, added in edits.items():
        assert source.count(line) == 1, line
        source = source.replace(line, added)
    composition.write_text(source)


# Run in the copy of the package with the reward scale added: first what importing the trainer loads (every module
# of `sys.modules`, for the import test below), then its config, docstring, `STEP` and a two-step run.
NEW_FEATURE_RUN = """
import dataclasses, json, sys
from pathlib import Path

import trl_grpo_ext.trainer
print(json.dumps({"loaded": sorted(sys.modules)}), flush=True)
import trl_grpo_ext
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.composition import FEATURES, STEP
from trl_grpo_ext.config import FEATURE_CONFIGS
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows
from datasets import Dataset

root, model, kwargs = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
assert Path(trl_grpo_ext.__file__).parent == root / "trl_grpo_ext", trl_grpo_ext.__file__
assert FEATURE_CONFIGS[-1].fields.__name__ == "RewardScaleFields"  # the first base: the last section
assert {"reward_scale", "reward_scale_from_step"} <= {field.name for field in dataclasses.fields(GRPOConfig)}
assert "> Parameters that control the reward scale" in GRPOConfig.__doc__
sys.path.insert(0, str(Path(sys.argv[4]) / "docs" / "hooks"))
import reference  # the docs hook: the configuration reference's tables, from the composed docstring
assert "| `reward_scale_from_step` |" in reference.config_tables(GRPOConfig.__doc__)
assert [point for point, acting in STEP.items() if "reward_scale" in acting] == ["advantages"]
assert "reward_scale" in [feature.name for feature in FEATURES]
try:
    GRPOConfig(**kwargs, reward_scale=0.0)
    raise SystemExit("reward_scale=0.0 was accepted")
except ValueError as error:
    assert "reward_scale must be a finite number in (0, 10], got 0.0" in str(error), error
args = GRPOConfig(**kwargs, reward_scale="2.5", reward_scale_from_step="1")
dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16, seed=0)))
trainer = GRPOTrainer(model, lambda completions, **_: [float(len(c)) for c in completions], args, dataset)
trainer.train()
print(json.dumps({"features": list(trainer.features), "scaled": trainer.reward_scale_steps}))
"""


@pytest.fixture(scope="module")
def reward_scale_copy(tmp_path_factory, tiny_model_dir) -> dict:
    """A copy of the package and its docs with the reward scale added the documented way (`_add_reward_scale`), and
    one fresh process run in it (`NEW_FEATURE_RUN`), shared by the two tests that need a fresh import: the files the
    addition changed, the copy's root, the process, and the modules importing its trainer loaded."""
    root = tmp_path_factory.mktemp("copy") / "repository"
    shutil.copytree(PACKAGE, root / "trl_grpo_ext", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPOSITORY / "docs", root / "docs")
    before = {path.relative_to(root): path.read_bytes() for path in root.rglob("*") if path.is_file()}
    _add_reward_scale(root)
    after = {path.relative_to(root): path.read_bytes() for path in root.rglob("*") if path.is_file()}
    kwargs = small_grpo_kwargs(root.parent / "out", max_steps=2, beta=0.0)
    run = subprocess.run([sys.executable, "-c", NEW_FEATURE_RUN, str(root), tiny_model_dir, json.dumps(kwargs),
                          str(REPOSITORY)],
                         cwd=root, capture_output=True, text=True, timeout=600)  # fmt: skip
    lines = run.stdout.strip().splitlines()
    loaded = json.loads(lines[0])["loaded"] if lines and lines[0].startswith('{"loaded"') else None
    return {"changed": {path for path in after if before.get(path) != after[path]}, "root": root, "run": run,
            "loaded": loaded}  # fmt: skip


def test_a_new_feature_with_settings_touches_three_places(reward_scale_copy):
    """Issue #61: a feature with two settings added to a copy of the package as `docs/adding-a-feature.md` says
    touches three places: its folder, `composition.py` and its docs page. With nothing else changed, `GRPOConfig`
    has its fields, checks their ranges and documents them (also in the configuration reference's tables, which the
    docs hook builds from that docstring), the site's nav lists its page, and the trainer builds it and calls it at
    its point of the step."""
    changed, root, run = reward_scale_copy["changed"], reward_scale_copy["root"], reward_scale_copy["run"]
    places = {path.parts[1] if path.parts[:2] == ("trl_grpo_ext", "reward_scale") else str(path) for path in changed}
    assert places == {"reward_scale", "trl_grpo_ext/composition.py", "docs/features/reward-scale.md"}

    sys.path.insert(0, str(REPOSITORY / "docs" / "hooks"))
    try:
        import reference  # the docs hook: the site's nav
    finally:
        sys.path.remove(str(REPOSITORY / "docs" / "hooks"))
    nav = [{"Features": [{"Resume": "features/resume.md"}]}]
    pages = reference.feature_pages(nav, str(root / "docs"))[0]["Features"]
    assert {"Reward scale": "features/reward-scale.md"} in pages

    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"features": ["reward_scale"], "scaled": [1]}


def test_a_feature_state_name_is_refused_when_taken(tmp_path, tiny_model_dir, monkeypatch):
    """`Feature.exposes` names an attribute of the trainer: one another feature exposes is refused when the class is
    defined, one the trainer has (`model`) when the trainer is built; the exposed names are in `dir(trainer)`."""
    with pytest.raises(ValueError, match="exposes 'policy_groups', which feature 'policy_groups' already exposes"):
        type("Shadow", (Feature,), {"name": "shadow", "exposes": "policy_groups"})
    assert "shadow" not in FEATURE_CLASSES
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16, seed=0)))
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=1))
    build = classmethod(lambda cls, trainer: None)
    type("ModelShadow", (Feature,), {"name": "model_shadow", "exposes": "model", "build": build})
    try:
        monkeypatch.setitem(STEP, "advantages", (*STEP["advantages"], "model_shadow"))
        with pytest.raises(ValueError, match="'model_shadow' exposes 'model', an attribute the trainer already has"):
            GRPOTrainer(tiny_model_dir, length_reward, args, dataset)
    finally:
        FEATURE_CLASSES.pop("model_shadow")
    monkeypatch.undo()
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, dataset)
    assert {"policy_groups", "grad_reg_state", "fast_generation"} <= set(dir(trainer))
    assert trainer.policy_groups is None
    with pytest.raises(AttributeError, match="'GRPOTrainer' object has no attribute 'polciy_groups'"):
        trainer.polciy_groups  # noqa: B018


def test_a_regroup_event_names_each_new_groups_parents():
    # rows 0-3 were in 'a', 4-5 in 'b'; 'a' is split into 'a/lo' (rows 0, 1) and 'a/hi' (rows 2, 3), and 'b' is kept
    event = Regroup(("a", "b"), torch.tensor([0, 0, 0, 0, 1, 1]), ("a/lo", "b", "a/hi"),
                    torch.tensor([0, 0, 2, 2, 1, 1]), "split")  # fmt: skip
    assert event.parents() == {"a/lo": {"a": 2.0}, "b": {"b": 2.0}, "a/hi": {"a": 2.0}}


def test_task_support_and_the_estimator_stay_out_of_the_trainer_core():
    """The trainer, its config and features import nothing of `gsm8k` or `consumer_gpu`."""
    for path in _core_modules():
        bad = [name for name in _imports(path) if "gsm8k" in name or "consumer_gpu" in name]
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_the_library_core_imports_nothing_of_the_tools(reward_scale_copy):
    """Issue #34: the library core (the trainer, its config and features, the feature folders) imports nothing of
    `cli` (the command line, its errors, export, the tiny model, the optional-dependency checks) or `reporting` (the
    metrics table and plots). One exception: the run doctor reads the metrics log the reporting callback writes,
    by its file name (`reporting.callbacks.HISTORY_NAME`, in `doctor/run_dir.py`, which only the command loads)."""
    doctor_reads = {"trl_grpo_ext.reporting.callbacks", "trl_grpo_ext.reporting.callbacks.HISTORY_NAME"}
    tools = ("trl_grpo_ext.cli", "trl_grpo_ext.reporting")
    core = _core_modules()
    assert {"trainer.py", "config.py", "error_reports.py", "run_dir.py"} <= {path.name for path in core}
    for path in core:
        bad = [name for name in _imports(path) if any(name == tool or name.startswith(f"{tool}.") for tool in tools)]
        if path.parent.name == "doctor":
            bad = [name for name in bad if name not in doctor_reads]
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"
    # and what importing the trainer loads, through every module it imports, in a fresh process (the one of the
    # package copy: the package and the reward scale, which imports only `feature_api` and `field_checks`): none of the
    # tools, no task support
    loaded = reward_scale_copy["loaded"]
    assert loaded is not None, reward_scale_copy["run"].stderr[-3000:]
    outside = ("trl_grpo_ext.cli", "trl_grpo_ext.reporting", "trl_grpo_ext.gsm8k", "trl_grpo_ext.consumer_gpu")
    assert "trl_grpo_ext.trainer" in loaded and "trl_grpo_ext.reward_scale.feature" in loaded
    assert not [name for name in loaded if name.startswith(outside)]
    # issue #61: nor the libraries only some features or tools need (k-means and TF-IDF grouping, plots, GSM8K)
    extras = ("sklearn", "matplotlib", "math_verify")
    assert not [name for name in loaded if name.split(".")[0] in extras]


def test_every_package_folder_says_what_lives_there():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(PACKAGE)} has no docstring"
        for module in init.parent.glob("*.py"):
            if module.name != "__init__.py":
                assert f"`{module.stem}`" in doc, f"{init.relative_to(PACKAGE)} does not mention {module.stem}"


# --- registries ---------------------------------------------------------------------------------------------------


@pytest.fixture
def fixed_bonus():
    """A trivial entropy mode, registered for one test: a fixed bonus of 0.01 nats-weighted entropy, −0.01·H̄."""

    @ENTROPY_REG_MODES.register("fixed_bonus")
    class FixedBonus(EntropyMode):
        summary = "a fixed entropy bonus, -0.01 times the mean token entropy (a test)"

        def loss_term(self, terms):
            ones = torch.ones(len(terms.entropies), dtype=terms.entropies.dtype)
            return -bonus.entropy_bonus(terms.entropies, terms.mask, 0.01 * ones)

    yield FixedBonus
    ENTROPY_REG_MODES.unregister("fixed_bonus")


def test_a_new_entropy_mode_is_one_registered_class(tmp_path, tiny_model_dir, fixed_bonus):
    """Adding a mode touches no file of the package: the config accepts its name, the trainer builds it and adds its
    term to TRL's loss. One step on one micro-batch, same seed, with and without it: the logged losses differ by
    exactly the term, −0.01 times the step's mean token entropy (TRL's `entropy` metric over the same tokens)."""
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16, seed=0)))
    losses = {}
    for modes in ([], ["fixed_bonus"]):
        args = GRPOConfig(**small_grpo_kwargs(tmp_path / str(len(modes)), max_steps=1), entropy_reg=modes)
        trainer = GRPOTrainer(tiny_model_dir, length_reward, args, dataset)
        trainer.train()
        (row,) = [row for row in trainer.state.log_history if "loss" in row]
        losses[tuple(modes)] = (row["loss"], row["entropy"])
    assert [type(mode) for mode in trainer.features["entropy_reg"].modes] == [fixed_bonus]
    (plain, entropy), (with_bonus, same_entropy) = losses[()], losses[("fixed_bonus",)]
    assert same_entropy == pytest.approx(entropy, rel=1e-6)
    assert with_bonus - plain == pytest.approx(-0.01 * entropy, rel=1e-4, abs=1e-7)


def test_the_config_takes_validates_and_documents_modes_from_the_registries(tmp_path, fixed_bonus):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), entropy_reg="fixed_bonus,target")
    assert args.entropy_reg == ["fixed_bonus", "target"]
    with pytest.raises(ValueError, match=r"entropy_reg entries must be among \[.*'fixed_bonus'.*\], got 'nope'"):
        GRPOConfig(**small_grpo_kwargs(tmp_path), entropy_reg="nope")
    for registry, field in ((ENTROPY_REG_MODES, "entropy_reg"), (GRAD_REG_MODES, "grad_reg")):
        help_text = next(f for f in dataclasses.fields(GRPOConfig) if f.name == field).metadata["help"]
        for name, mode in registry.items():
            if mode is not fixed_bonus:  # registered after the config class was built
                assert f"{name} ({mode.summary})" in help_text
                assert f"- `{name}`: {mode.summary.split()[0]}" in GRPOConfig.__doc__


def test_a_registry_refuses_a_name_twice_or_one_yaml_cannot_hold():
    registry = Registry("some_field")

    @registry.register("first")
    class First(GradRegMode):
        summary = "a test"

    assert registry["first"] is First and First.name == "first"
    with pytest.raises(ValueError, match="some_field mode 'first' is already registered"):
        registry.register("first")(type("Again", (GradRegMode,), {}))
    with pytest.raises(ValueError, match="lowercase identifiers, got 'Two words'"):
        registry.register("Two words")(type("Bad", (GradRegMode,), {}))
    registry.unregister("first")
    assert "first" not in registry


def test_every_registered_mode_has_a_summary_with_its_source_where_it_has_one():
    for registry in (ENTROPY_REG_MODES, GRAD_REG_MODES):
        for name, mode in registry.items():
            assert mode.name == name and mode.summary, name
    for name in ("clip_cov", "kl_cov"):
        assert "arXiv:2505.22617" in ENTROPY_REG_MODES[name].summary
    assert "arXiv:2504.02507" in GRAD_REG_MODES["zclip"].summary
    assert "arXiv:2102.06171" in GRAD_REG_MODES["agc"].summary


# --- the config's fields ------------------------------------------------------------------------------------------


def test_config_docstring_and_help_describe_the_same_fields():
    """TRL's convention: every field this package adds is documented under its feature's `> Parameters that
    control ...` header of the class docstring and carries help metadata; the docstring documents no other field."""
    ours = [
        f for f in dataclasses.fields(GRPOConfig) if f.name not in {g.name for g in dataclasses.fields(trl.GRPOConfig)}
    ]
    assert ours
    doc = GRPOConfig.__doc__
    documented = re.findall(r"^        (\w+) \(`[^`]+`, \*optional\*", doc, flags=re.MULTILINE)
    assert documented == [f.name for f in ours]  # in declaration order, each once
    sections = doc.split("> Parameters that control ")[1:]
    for f in ours:
        assert f.metadata.get("help"), f"{f.name} has no help text"
        assert sum(f"        {f.name} (`" in section for section in sections) == 1, f.name


def test_each_feature_declares_its_settings_in_its_own_folder():
    """Every `<feature>/config.py` holds a part that `GRPOConfig` composes (`config.FEATURE_CONFIGS`), and each part's
    docstring section documents exactly its own fields, in order: `GRPOConfig`'s docstring is the parts' sections."""
    folders_with_settings = {path.parent.name for path in PACKAGE.glob("*/config.py")}
    composed = {part.fields.__module__ for part in FEATURE_CONFIGS}
    assert {f"trl_grpo_ext.{folder}.config" for folder in folders_with_settings} <= composed
    assert folders_with_settings <= FEATURE_FOLDERS
    for part in FEATURE_CONFIGS:
        documented = re.findall(r"^        (\w+) \(`[^`]+`, \*optional\*", part.section(), flags=re.MULTILINE)
        assert documented == [f.name for f in dataclasses.fields(part.fields)], part.fields.__name__
        assert part.section() in GRPOConfig.__doc__


# The library core: the package's top-level modules (the trainer, its config and the modules they share), the contact
# surface with TRL, and the feature folders. The tools (`cli`, `reporting`), task support (`gsm8k`) and the
# consumer-GPU presets (`consumer_gpu`) are not part of it.
CORE_MODULES = tuple(sorted(path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py"))


def test_the_top_level_is_a_few_modules_each_worth_its_own_file():
    """Issue #61: at most 10 top-level modules (with `__init__.py`), none under 30 lines but `__init__.py`, and each
    named in `docs/layout.md`, so a newcomer reads what each holds there."""
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) <= 10, [path.name for path in modules]
    layout = (PACKAGE.parent / "docs" / "layout.md").read_text()
    for path in modules:
        if path.name != "__init__.py":
            assert len(path.read_text().splitlines()) >= 30, path.name
            assert path.name in layout, path.name
    short = [path for path in PACKAGE.rglob("*.py") if len(path.read_text().splitlines()) < 30
             and path.name not in ("__init__.py", "__main__.py")]  # fmt: skip
    assert not short, [str(path.relative_to(PACKAGE)) for path in short]


def test_the_trainer_imports_each_feature_by_name():
    """Issue #61: the package's features are imported by name in `composition.py` (`PACKAGE_FEATURES`), not found by
    a glob over the folders, and they are exactly the features `STEP` names."""
    names = {name for acting in STEP.values() for name in acting}
    assert {feature.name for feature in PACKAGE_FEATURES} == names
    for module in ("composition.py", "trainer.py"):
        source = (PACKAGE / module).read_text()
        assert ".glob(" not in source and "import_module" not in source


def _core_modules() -> list[Path]:
    """The files of the library core (`CORE_MODULES`, `trl_contact.py` or the `trl_contact/` package, the `resume/`
    package, and every module of `FEATURE_FOLDERS`); each exists."""
    core = [PACKAGE / name for name in CORE_MODULES]
    core += sorted(PACKAGE.glob("trl_contact*.py")) + sorted(PACKAGE.glob("trl_contact/*.py"))
    core += sorted(PACKAGE.glob("resume/*.py"))  # a package of the core since issue #71
    core += [path for folder in FEATURE_FOLDERS for path in sorted((PACKAGE / folder).glob("*.py"))]
    assert all(path.is_file() for path in core)
    assert any("trl_contact" in path.relative_to(PACKAGE).parts[0] for path in core)
    return core


def _imports(path: Path) -> list[str]:
    """The absolute names of the modules `path` (a module of the package) imports, and of the names it imports from
    them (`from . import covariance` in `entropy/feature.py` gives `trl_grpo_ext.entropy.covariance`)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])  # e.g. trl_grpo_ext.entropy
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def test_the_test_settings_hide_no_warning_category_wholesale():
    """Issue #61: pytest's `filterwarnings` names each third-party warning it ignores by its message; none ignores a
    whole category (which hid the deprecations TRL and transformers raise about the APIs this package calls)."""
    settings = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    filters = settings["filterwarnings"]
    assert filters and all(re.match(r"ignore:[^:]+:\w+Warning$", line) for line in filters), filters


# The trainer attributes that hand out a feature's state (`Feature.exposes`: `trainer.policy_groups`, ...), by the
# feature's name.
STATE_PROPERTIES = {f.exposes: f.name for f in PACKAGE_FEATURES if f.exposes is not None}


def _feature_folder(feature: type[Feature]) -> Path:
    return Path(sys.modules[feature.__module__].__file__).parent


def _coupling_in_code(feature: type[Feature]) -> tuple[set[str], set[str]]:
    """What the modules of `feature`'s folder read of other features and write outside the feature, found in their
    code: reads of another feature's state through the trainer (`trainer.policy_groups`) or of a field of another
    feature's config part (`args.generation_compile`); writes of the trainer's attributes (`trainer.beta = ...`,
    also `trainer.generation_config.x = ...`), of a `generate` method, of string keys of TRL's dicts in `feature.py`
    (`output["policy_group_ids"] = ...`, or through a module constant holding the key), and of a DeepSpeed engine's
    clip (`set_deepspeed_clip`). A string that is exactly another feature's field name counts as a read of that
    feature's settings (`getattr(args, name)`)."""
    folders = {_feature_folder(f).name: f.name for f in PACKAGE_FEATURES}
    owners = {field.name: folders[part.fields.__module__.split(".")[1]]
              for part in FEATURE_CONFIGS for field in dataclasses.fields(part.fields)}  # fmt: skip
    reads, writes = set(), set()
    for path in sorted(_feature_folder(feature).glob("*.py")):
        tree = ast.parse(path.read_text())
        names = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}  # fmt: skip
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and owners.get(node.value, feature.name) != feature.name):  # fmt: skip
                reads.add(owners[node.value])  # a field named as a string: getattr(args, name)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                base = ast.unparse(node.value)
                if base.endswith("trainer") and node.attr in STATE_PROPERTIES:
                    reads.add(STATE_PROPERTIES[node.attr])
                if base.endswith("args") and owners.get(node.attr, feature.name) != feature.name:
                    reads.add(owners[node.attr])
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("set_deepspeed_clip"):
                writes.add("deepspeed clip_grad")
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Attribute):
                    chain = [*ast.unparse(target.value).split("."), target.attr]
                    if "trainer" in chain[:-1]:
                        writes.add(f"trainer.{chain[chain.index('trainer') + 1]}")
                    elif target.attr == "generate":
                        writes.add(f"{chain[-2]}.generate")
                elif (
                    isinstance(target, ast.Subscript)
                    and path.name == "feature.py"
                    and isinstance(target.value, ast.Name)
                    and target.value.id in ("output", "batch", "inputs")
                ):
                    key = target.slice  # a string, or a module constant that holds one (`SCORED`)
                    key = key.value if isinstance(key, ast.Constant) else names.get(getattr(key, "id", None))
                    if isinstance(key, str):
                        writes.add(f"{target.value.id}[{key!r}]")
    return reads, writes


@pytest.mark.parametrize("feature", PACKAGE_FEATURES, ids=[feature.name for feature in PACKAGE_FEATURES])
def test_each_feature_declares_what_it_reads_of_others_and_writes_outside_itself(feature):
    """Issue #61: a feature's `reads` (the other features whose state or settings it reads) and `writes` (what it
    sets on objects it does not own) are exactly what its code does (`_coupling_in_code`), so the coupling between
    features is read in their class bodies, not found by reading every module."""
    reads, writes = _coupling_in_code(feature)
    assert set(feature.reads) == reads
    assert set(feature.writes) == writes
    assert set(feature.reads) <= {f.name for f in PACKAGE_FEATURES} - {feature.name}


def test_the_coupling_scan_finds_what_it_is_written_for():
    """The scan itself, on what the features declare today: prompt skipping reads the policy groups' state and fast
    generation's `generation_compile`; gradient regularization sets TRL's KL coefficient and DeepSpeed's clip."""
    by_name = {feature.name: feature for feature in PACKAGE_FEATURES}
    assert _coupling_in_code(by_name["prompt_skip"])[0] == {"policy_groups", "fast_generation"}
    assert _coupling_in_code(by_name["grad_reg"])[1] == {"trainer.beta", "deepspeed clip_grad"}
    assert _coupling_in_code(by_name["doctor"]) == ({"fast_generation"}, set())  # its SETTINGS, by name
    assert "output['completion_scored']" in _coupling_in_code(by_name["entropy_reg"])[1]  # through a constant

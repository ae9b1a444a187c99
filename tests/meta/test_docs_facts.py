"""Issue #72: the numbers the docs state on several pages come from one source, `docs/facts.toml`, and no page claims
a GPU result without naming its measurement (`scripts/check_docs_facts.py`). The CPU demo's facts are recomputed
from a fresh demo run in tests/training/test_doctor_verdicts.py."""

import importlib.util

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def facts_check():
    spec = importlib.util.spec_from_file_location("check_docs_facts", REPO_ROOT / "scripts" / "check_docs_facts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_page_agrees_with_the_facts_and_names_its_gpu_measurements(facts_check):
    assert facts_check.facts_check() == []
    facts = facts_check.load_facts()
    assert {"demo_no_signal_steps", "demo_final_length", "policy_group_real_steps", "policy_group_oracle_share",
            "opt_in_features", "bit_for_bit", "gpu_status"} <= set(facts)  # fmt: skip


def test_a_page_that_disagrees_is_named(facts_check):
    """The disagreements of issue #72, put back one by one, each found and named."""
    facts, pages = facts_check.load_facts(), facts_check.reader_pages()
    assert facts_check.check_facts(facts, pages) == []

    def found(page, old, new):
        changed = {**pages, page: pages[page].replace(old, new, 1)}
        assert changed[page] != pages[page], (page, old)
        return facts_check.check_facts(facts, changed)

    steps = facts["policy_group_real_steps"]["value"]
    assert found("docs/features/policy-groups.md", f"threshold in {steps} stock", "threshold in 0.5× stock") == [
        f"docs/features/policy-groups.md: policy_group_real_steps is '0.5×' here, '{steps}' in docs/facts.toml"
    ]
    assert found("docs/getting-started.md", "ends with 9 steps (31-39)", "ends with 10 steps (31-39)") == [
        "docs/getting-started.md: demo_no_signal_count is '10' here, '9' in docs/facts.toml"
    ]
    assert found("README.md", "Five opt-in features", "Three opt-in features") == [
        "README.md: opt_in_features is 'Three' here, 'Five' in docs/facts.toml"
    ]
    assert found("README.md", "an uninterrupted run is stock TRL GRPO", "a run is stock TRL GRPO")[0].startswith(
        "README.md: bit_for_bit: a sentence without 'uninterrupted': With the default settings a run is stock TRL"
    )
    assert found("docs/recipes/notebooks.md", "not yet run on a GPU", "tested") == [
        "docs/recipes/notebooks.md: does not say 'not yet run on a GPU' (gpu_status)"
    ]
    # the source of a derived fact changes: the value it gives is named
    report = (REPO_ROOT / "benchmarks" / "real_model" / "results" / "real_model_mix.txt").read_text()
    [line] = [line for line in report.splitlines() if line.startswith("policy_groups (seeds [")]
    assert f"): steps x{steps[:-1]}," in line
    stale = {**facts, "policy_group_real_steps": {**facts["policy_group_real_steps"], "value": "0.5×"}}
    assert f"docs/facts.toml: policy_group_real_steps = '0.5×', but its source gives '{steps}'" in (
        facts_check.check_facts(stale, pages)
    )
    features = {**facts, "opt_in_features": {**facts["opt_in_features"], "other": ["resume"]}}
    assert any("add the new page to opt_in or other" in line for line in facts_check.check_facts(features, pages))


@pytest.mark.parametrize(
    ("sentence", "claim"),
    [
        ("Both run on Colab's free T4 (16 GB): open one and run all.", True),  # issue #72's example
        ("It also comes with ready recipes for consumer GPUs (8-24 GB cards).", True),
        ("The 3B preset fits a 12 GB card with room to spare.", True),
        ("A step takes 40 s on an 8 GB card.", True),
        ("Fast generation is 3× faster on a GPU.", True),
        ("Both are written for Colab's free T4 and not yet run on a GPU.", False),
        ("The 3B preset is estimated to fit a 12 GB card.", False),
        ("A step takes 40 s on a T4 (an estimate from arithmetic).", False),
        ("Use ddp.yaml when the model fits on one card.", False),  # a condition, not a result
        ("The four are not yet run on a GPU in this repository.", False),
        ("The presets target one GPU.", False),
    ],
)
def test_a_gpu_claim_must_name_its_measurement(facts_check, sentence, claim):
    assert bool(facts_check.gpu_claims({"page.md": sentence})) is claim

"""The documentation (issue #34): the configuration reference that docs/hooks/reference.py generates lists every
field, the modes it reads statically are the registered ones, and every relative link of README.md and docs/ points
to a file and heading that exist (the site's strict build checks docs/ again; README.md is only checked here)."""

import dataclasses
import importlib.util
import re

import pytest
from trl.trainer.grpo_config import GRPOConfig as TRLGRPOConfig

from tests.conftest import REPO_ROOT
from trl_grpo_ext import GRPOConfig
from trl_grpo_ext.config import FEATURE_CONFIGS
from trl_grpo_ext.entropy.modes import ENTROPY_REG_MODES
from trl_grpo_ext.grad_reg.modes import GRAD_REG_MODES

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
ROW_NAME = re.compile(r"^\| `(\w+)` \|", re.MULTILINE)


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference():
    return load(REPO_ROOT / "docs" / "hooks" / "reference.py", "docs_reference")


def test_the_configuration_reference_lists_every_field_this_package_adds(reference):
    """The hook reads the class docstring (statically when the site is built; here the imported one, whose
    `{..._MODES}` lines the package has filled): one row per field, in declaration order, none twice."""
    trl_fields = {field.name for field in dataclasses.fields(TRLGRPOConfig)}
    ours = [field.name for field in dataclasses.fields(GRPOConfig) if field.name not in trl_fields]
    tables = reference.config_tables(GRPOConfig.__doc__)
    assert ROW_NAME.findall(tables) == ours
    sections = sum(part.section().count("> Parameters that control") for part in FEATURE_CONFIGS)
    assert tables.count("\n## ") + tables.startswith("## ") == sections >= len(FEATURE_CONFIGS)  # one or more a part


def test_the_recipe_fields_table_lists_every_script_field(reference):
    recipe = load(REPO_ROOT / "recipes" / "math_gsm8k.py", "math_gsm8k_for_docs")
    table = reference.script_table(str(REPO_ROOT), str(REPO_ROOT / "recipes" / "math_gsm8k.py"))
    fields = {field.name: field for field in dataclasses.fields(recipe.GSM8KScriptArguments)}
    assert ROW_NAME.findall(table) == list(fields)
    # the f-string help text filled from the reward registry, as the command line's --help shows it
    assert fields["reward_funcs"].metadata["help"] in table


def test_the_modes_read_statically_are_the_registered_ones(reference):
    for registry, name in ((ENTROPY_REG_MODES, "ENTROPY_REG_MODES"), (GRAD_REG_MODES, "GRAD_REG_MODES")):
        listed = reference.registered_modes(str(REPO_ROOT), name)
        assert re.findall(r"- `(\w+)`: ", listed) == list(registry), name
        for mode, cls in registry.items():
            assert f"- `{mode}`: {cls.summary}." in listed
        assert " ".join(registry.describe("    ", width=60).split()) == listed  # the imported docstring's words


def test_the_configuration_page_holds_the_current_tables_as_markdown(reference):
    """Issue #72: the field tables existed only in the built site, so docs/configuration.md read as an empty page on a
    code host. They are written into the page (`python docs/hooks/reference.py`); here the page's parts must be what
    the code generates now, every field a row of the Markdown itself (the site's build checks the same statically)."""
    page = (REPO_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    parts = reference.generated_parts(str(REPO_ROOT), GRPOConfig.__doc__)
    assert reference.with_parts(page, parts) == page, "stale: run python docs/hooks/reference.py"
    trl_fields = {field.name for field in dataclasses.fields(TRLGRPOConfig)}
    ours = [field.name for field in dataclasses.fields(GRPOConfig) if field.name not in trl_fields]
    recipe = load(REPO_ROOT / "recipes" / "math_gsm8k.py", "math_gsm8k_for_page")
    script = [field.name for field in dataclasses.fields(recipe.GSM8KScriptArguments)]
    assert ROW_NAME.findall(page) == ours + script
    stale = page.replace("| `eval_limit` | `200` |", "| `eval_limit` | `100` |")
    assert reference.with_parts(stale, parts) == page  # a stale row is rewritten
    with pytest.raises(reference.PluginError, match="no <!-- generated: GRPOConfig --> followed by"):
        reference.with_parts(page.replace(reference.END_MARKER, ""), parts)


def test_a_docstring_without_parameter_sections_is_refused(reference):
    with pytest.raises(reference.PluginError, match="no 'Parameters:' section"):
        reference.config_tables("Configuration.\n\nRaises:\n    ValueError: never.\n")


def github_anchor(heading: str) -> str:
    """The anchor a code host (GitHub) gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def without_code(text: str) -> str:
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.MULTILINE | re.DOTALL))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO_ROOT)) for p in PAGES])
def test_every_relative_link_points_to_an_existing_file_and_heading(page):
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", without_code(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            bad.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md":
            text = re.sub(r"^(```|~~~).*?^\1", "", linked.read_text(encoding="utf-8"), flags=re.M | re.S)
            if fragment not in {github_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}:
                bad.append(f"{target}: no such heading")
    assert not bad, bad


def test_the_readme_stays_short_and_keeps_its_two_commands():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    assert "make demo   # set up, then train a tiny model built locally on the CPU demo" in readme
    assert "make test   # set up, then run the test suite" in readme


def test_a_feature_page_needs_no_line_in_the_nav(reference, tmp_path):
    """Issue #61: a page in docs/features/ that mkdocs.yml's "Features" section does not list is added at its end,
    titled by its first heading (`feature_pages`, the docs hook's `on_config`); listed pages stay as they are."""
    (tmp_path / "features").mkdir()
    (tmp_path / "features" / "a.md").write_text("# Feature A\n")
    (tmp_path / "features" / "new.md").write_text("Intro\n# Reward scale\n\ntext\n")
    nav = [{"Home": "index.md"}, {"Features": [{"A, by hand": "features/a.md"}]}]
    assert reference.feature_pages(nav, str(tmp_path))[1] == {
        "Features": [{"A, by hand": "features/a.md"}, {"Reward scale": "features/new.md"}]
    }
    (tmp_path / "features" / "untitled.md").write_text("no heading\n")
    with pytest.raises(Exception, match="untitled.md has no '# ' heading"):
        reference.feature_pages(nav, str(tmp_path))


# What a user reads or runs from a clone (issue #72): the docs, the recipes and their configs and notebooks, the
# benchmarks (their recorded results aside), the package. Tests and CI may read the project's shared data folder.
CLONE_FILES = [
    path
    for path in [
        *(REPO_ROOT / name for name in ("README.md", "Makefile", "pyproject.toml", "mkdocs.yml")),
        *(REPO_ROOT / folder for folder in ("docs", "recipes", "benchmarks", "trl_grpo_ext")),
    ]  # fmt: skip
    for path in ([path] if path.is_file() else sorted(path.rglob("*")))
    if path.is_file()
    and "results" not in path.parts
    and "__pycache__" not in path.parts
    and path.suffix in {"", ".md", ".py", ".yaml", ".yml", ".toml", ".ipynb", ".json", ".sh", ".txt"}
]


def test_no_page_config_or_recipe_names_files_outside_the_repository():
    """A fresh clone has no `../shared`: every route the docs give is in the repository (the Hub names, the
    `trl-grpo-ext smollm2` command, a GSM8K folder the user gives)."""
    assert len(CLONE_FILES) > 100
    outside = [f"{path.relative_to(REPO_ROOT)}:{number}" for path in CLONE_FILES
               for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if "../shared" in line or re.search(r"\bget_smollm2\.py", line)]  # fmt: skip
    assert not outside, outside


def test_the_examples_the_wheel_check_runs_are_the_pages_own(tmp_path):
    """scripts/wheel_check.sh runs the README's minimal script and getting-started's offline `trl-grpo-ext grpo` in a
    clean environment without extras (issue #72), taken from the pages by scripts/doc_examples.py: each marker finds
    one block, and the replacements the page tells an offline reader to make are all made."""
    doc_examples = load(REPO_ROOT / "scripts" / "doc_examples.py", "doc_examples")
    work = str(tmp_path)
    minimal = doc_examples.example("minimal-script", work)
    assert f'model = "{work}/tiny"' in minimal and "trainer.train()" in minimal and "Qwen/" not in minimal
    grpo = doc_examples.example("grpo-offline", work)
    assert "--reward_funcs accuracy_reward" in grpo and f"{work}/tiny-grpo" in grpo
    assert grpo.count("/tmp/") == grpo.count(f"{work}/") == 6  # every path moved into the work folder
    with pytest.raises(ValueError, match="0 code blocks contain"):
        doc_examples.EXAMPLES["gone"] = ("README.md", "no such marker in any block", [])
        doc_examples.example("gone", work)

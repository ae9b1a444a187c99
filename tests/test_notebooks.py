"""Notebooks: each runs top to bottom in smoke mode (tiny local model, CPU, local GSM8K) with no error and writes its
plots; each is committed without outputs."""

import json
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO_ROOT

NOTEBOOK_DIR = REPO_ROOT / "recipes" / "notebooks"
PLOTS = {
    "gsm8k_qlora_quickstart.ipynb": ["quickstart_training_curves.png"],
    "policy_grouping_walkthrough.ipynb": [
        "walkthrough_difficulty.png",
        "walkthrough_policy_groups.png",
        "walkthrough_entropy.png",
    ],
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb")) == sorted(PLOTS)


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_notebook_is_committed_without_outputs(name):
    notebook = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    # a story: it opens with text, and no two code cells follow each other without a word between them
    kinds = [cell.cell_type for cell in notebook.cells]
    assert kinds[0] == "markdown" and "code,code,code" not in ",".join(kinds)


@pytest.fixture
def kernel_of_this_python(tmp_path, monkeypatch) -> str:
    """The name of a kernel that runs `sys.executable`, the interpreter of this test run (the project's virtual
    environment), found first because JUPYTER_PATH comes first in Jupyter's search path. Without it, `python3`
    could resolve to a kernelspec of another environment (a user-wide one in ~/.local/share/jupyter)."""
    name = "trl-grpo-ext-tests"
    spec_dir = tmp_path / "jupyter" / "kernels" / name
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "trl-grpo-ext tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return name


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_notebook_runs_in_smoke_mode(name, gsm8k_dir, kernel_of_this_python, tmp_path, monkeypatch):
    out = tmp_path / "plots"
    # The kernel inherits this environment (conftest sets HF_HUB_OFFLINE=1: a download attempt fails the run).
    monkeypatch.setenv("TRL_GRPO_EXT_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("NOTEBOOK_OUTPUT_DIR", str(out))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # tiny matrices: a second thread only adds contention on 2 cores
    monkeypatch.delenv("GSM8K_DATASET_PATH", raising=False)  # the notebook finds ../shared/data/gsm8k itself
    notebook = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell("import sys\nprint(sys.executable)"))

    # Run from the notebook's folder, as Jupyter does; a cell that raises stops the run with its traceback.
    client = NotebookClient(
        notebook, kernel_name=kernel_of_this_python, timeout=600, resources={"metadata": {"path": str(NOTEBOOK_DIR)}}
    )
    client.execute()

    assert notebook.cells[0].outputs[0]["text"].strip() == sys.executable
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output["output_type"] == "error"]
    assert any(output.get("data", {}).get("image/png") for output in outputs), "no plot was shown"
    text = "".join(output.get("text", "") for output in outputs)
    assert str(gsm8k_dir.resolve()) in text, "the notebook did not read the local GSM8K copy"
    for plot in PLOTS[name]:
        path = out / plot
        assert path.is_file(), f"{plot} was not written; files: {sorted(p.name for p in out.iterdir())}"
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert path.stat().st_size > 5_000, f"{plot}: {path.stat().st_size} bytes, too small for a plot"

"""Notebooks: each runs top to bottom in smoke mode (tiny local model, CPU, local GSM8K) with no error and writes its
plots; each is committed without outputs, opens by saying what it downloads, on which card and for how long, and is
ready for Colab: an install cell that does nothing where the package imports, and a precision picked from the card."""

import json
import re
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


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_notebook_is_ready_for_colab(name):
    notebook = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    top = notebook.cells[0].source
    # What it downloads (model id, data set, sizes), which card, how long (an estimate, and from what).
    assert "Qwen/Qwen2.5-0.5B-Instruct" in top and "openai/gsm8k" in top and re.search(r"\d GB", top)
    assert "**Which card.**" in top and "T4" in top
    assert "**How long.**" in top and "minutes on a T4. An estimate, not a measurement" in top
    assert "from arithmetic" in top
    # The first code cell installs from a clone or a wheel, skipped where the package imports, and keeps torch.
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    install = code[0]
    assert 'REPO_URL = ""' in install and 'WHEEL = ""' in install and "install route:" in install
    assert 'if importlib.util.find_spec("trl_grpo_ext") is not None:' in install
    assert 'f"torch=={torch.__version__}' in install and '"--constraint"' in install
    # One precision for the whole notebook, from the card; no bf16 written into a setting.
    everything = "\n".join(code[1:])
    assert 'PRECISION = "fp32" if SMOKE else training_precision()' in everything
    assert 'bf16=PRECISION == "bf16"' in everything and 'fp16=PRECISION == "fp16"' in everything
    assert not re.search(r"\bbf16=(?!PRECISION)", everything), "a hard-coded bf16 setting"
    assert [line for line in everything.splitlines() if "torch.bfloat16" in line] == [
        'DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[PRECISION]'
    ]
    # The T4 path: the fp16 preset, whose memory estimate the notebook prints.
    assert '"gsm8k-t4.yaml"' in everything and (REPO_ROOT / "recipes/configs/gsm8k-t4.yaml").is_file()


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
    monkeypatch.setenv("GSM8K_DATASET_PATH", str(gsm8k_dir))  # real GSM8K (without it: seeded problems)
    notebook = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell("import sys\nprint(sys.executable)"))

    # Run from the notebook's folder, as Jupyter does; a cell that raises stops the run with its traceback.
    client = NotebookClient(
        notebook, kernel_name=kernel_of_this_python, timeout=600, resources={"metadata": {"path": str(NOTEBOOK_DIR)}}
    )
    client.execute()

    assert notebook.cells[0].outputs[0]["text"].strip() == sys.executable
    # The install cell (the notebook's first code cell) saw the package importable and installed nothing.
    install = next(cell for cell in notebook.cells if 'REPO_URL = ""' in cell.source)
    assert [output["text"] for output in install.outputs] == ["trl_grpo_ext is already importable: install skipped\n"]
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output["output_type"] == "error"]
    assert any(output.get("data", {}).get("image/png") for output in outputs), "no plot was shown"
    text = "".join(output.get("text", "") for output in outputs)
    folders = (str(gsm8k_dir), str(gsm8k_dir.resolve()))  # as given or resolved: a symlinked ../shared prints as given
    assert any(folder in text for folder in folders), "the notebook did not read the local GSM8K copy"
    assert "precision: fp32" in text  # the CPU
    # Without a GPU the T4 preset is shown, estimated against a 16 GB card, with its launch command.
    assert "gsm8k-t4.yaml: Qwen/Qwen2.5-1.5B-Instruct, LoRA r=16, fp16 (float16)" in text
    assert "fits (limit 90% = 14.40 GiB)" in text
    assert "accelerate launch recipes/math_gsm8k.py --config recipes/configs/gsm8k-t4.yaml" in text
    for plot in PLOTS[name]:
        path = out / plot
        assert path.is_file(), f"{plot} was not written; files: {sorted(p.name for p in out.iterdir())}"
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert path.stat().st_size > 5_000, f"{plot}: {path.stat().st_size} bytes, too small for a plot"

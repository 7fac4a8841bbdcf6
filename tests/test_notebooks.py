"""The workshop notebooks: stored clean (fast tests) and run top to bottom on real engines (slow).

Fast checks (no MPI, no TensorFlow): every notebook is stored without outputs or execution
counts, is thin (no ``def``, no ``%%px``/``%px``), names no absolute or personal path, ends by
stopping its Lab, has an Exercise, and matches what ``scripts/make_notebooks.py`` generates.

Execution (``-m notebook``): each notebook runs with nbclient in a fresh kernel, one after another
(a 2-core machine cannot run two labs at once), with ``notebooks/`` as the working directory and
runs recorded in a temporary folder (``HPCLAB_RUNS``), so a sweep never skips points recorded by
an earlier session and the time printed is what a student on a fresh checkout waits.

The kernel is *this* interpreter (``sys.executable``), not whatever ``python3`` kernelspec Jupyter
finds first: a user-level kernelspec (``~/.local/share/jupyter/kernels/python3``) or a kernel whose
argv is a bare ``python`` resolved on PATH could otherwise run the notebooks in a Python without
hpclab, Horovod or the venv's MPI. A kernelspec pointing at ``sys.executable`` is written to a
temporary folder and handed to nbclient through its own KernelSpecManager.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
import warnings
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
GENERATOR = ROOT / "scripts" / "make_notebooks.py"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
EXPECTED = [
    "00_welcome",
    "01_batch_size_accuracy",
    "02_hardware_vs_statistical",
    "03_precision",
    "04_scaling_out",
    "05_critical_batch",
]

CELL_TIMEOUT_S = 300  # one cell (a sweep) may take this long before nbclient gives up
BUDGET_S = 180  # what a notebook may take on 2 cores (warned about, not failed)

# Absolute or personal paths a notebook must not carry (it must work from any checkout).
_ABSOLUTE = re.compile(
    r"(?<![\w.~-])/(?:root|home|work|Users|tmp|scratch|mnt|opt)(?:/|\b)"
    r"|[A-Za-z]:\\\\|~/"
)
_DEF = re.compile(r"^\s*(?:async\s+)?def\s", re.M)
_PX = re.compile(r"^\s*%%?px", re.M)


def _ids(paths):
    return [p.stem for p in paths]


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


# ---------------------------------------------------------------------------------------------
# fast: how the notebooks are stored
# ---------------------------------------------------------------------------------------------


def test_every_workshop_notebook_is_present():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED, (
        f"notebooks/ holds {[p.name for p in NOTEBOOKS]}; expected {EXPECTED} "
        "(regenerate with `.venv/bin/python scripts/make_notebooks.py`)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_stored_without_outputs(path):
    nb = _read(path)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert not cell.get("outputs"), (
            f"{path.name}: cell {i} was saved with outputs; clear them "
            "(or regenerate with scripts/make_notebooks.py) before committing"
        )
        assert cell.get("execution_count") is None, (
            f"{path.name}: cell {i} was saved with execution_count={cell.execution_count}"
        )
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", (
        f"{path.name}: kernelspec should be the generic 'python3' so it opens on any machine"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_thin_and_portable(path):
    nb = _read(path)
    for i, cell in enumerate(_code_cells(nb)):
        src = cell.source
        assert not _DEF.search(src), (
            f"{path.name}: code cell {i} defines a function; logic belongs in hpclab, "
            "the notebook only calls it"
        )
        assert not _PX.search(src), (
            f"{path.name}: code cell {i} uses %px/%%px; training runs through lab.run/lab.sweep"
        )
    raw = path.read_text()
    hit = _ABSOLUTE.search(raw)
    assert hit is None, (
        f"{path.name} contains an absolute or personal path ({hit.group(0)!r}); notebooks must "
        "run from any checkout"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_starts_a_lab_and_stops_it_at_the_end(path):
    nb = _read(path)
    code = _code_cells(nb)
    assert any("Lab(" in c.source for c in code), f"{path.name} never starts a Lab"
    last = code[-1].source.strip()
    assert last.endswith("lab.stop()"), (
        f"{path.name}: the last code cell must end with lab.stop() (it ends with {last[-60:]!r}), "
        "so the engines do not outlive the notebook"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_has_an_exercise(path):
    nb = _read(path)
    exercises = [c for c in nb.cells if c.cell_type == "markdown" and "Exercise" in c.source]
    assert exercises, f"{path.name} has no markdown cell with an Exercise"
    assert "Hint" in exercises[-1].source, f"{path.name}: the Exercise gives no hints"


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not GENERATOR.exists(), reason="no scripts/make_notebooks.py")
def test_notebooks_match_their_generator():
    gen = _generator()
    built = gen.build()
    assert sorted(built) == EXPECTED
    for name, nb in built.items():
        stored = (NOTEBOOK_DIR / f"{name}.ipynb").read_text()
        assert gen.dumps(nb) == stored, (
            f"notebooks/{name}.ipynb differs from what scripts/make_notebooks.py builds: edit the "
            "generator, then run `.venv/bin/python scripts/make_notebooks.py`"
        )


# ---------------------------------------------------------------------------------------------
# slow: run every notebook end to end on real MPI engines
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_dirs(tmp_path_factory):
    """A kernelspec that starts exactly this interpreter (the venv's), in a private folder."""
    from ipykernel.kernelspec import write_kernel_spec

    root = tmp_path_factory.mktemp("kernels")
    write_kernel_spec(
        path=root / "hpclab-venv", overrides={"display_name": "hpclab test kernel (this venv)"}
    )
    argv = json.loads((root / "hpclab-venv" / "kernel.json").read_text())["argv"]
    assert argv[0] == sys.executable, argv
    return [str(root)]


@pytest.mark.mpi
@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs_top_to_bottom(
    path, kernel_dirs, tmp_path, monkeypatch, capsys, record_property
):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    # Runs go to a fresh folder: a sweep must really train, not reuse an earlier session's runs.
    monkeypatch.setenv("HPCLAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    km = AsyncKernelManager(
        kernel_name="hpclab-venv", kernel_spec_manager=KernelSpecManager(kernel_dirs=kernel_dirs)
    )
    nb = _read(path)
    client = NotebookClient(
        nb,
        km=km,
        timeout=CELL_TIMEOUT_S,
        allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    t0 = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(
            f"{path.name} failed after {time.perf_counter() - t0:.0f} s:\n{exc}", pytrace=False
        )
    elapsed = time.perf_counter() - t0
    record_property("seconds", round(elapsed, 1))
    with capsys.disabled():
        print(f"\n[notebook] {path.name}: {elapsed:.0f} s top to bottom", flush=True)
    assert (tmp_path / "runs").is_dir() and any((tmp_path / "runs").iterdir()), (
        f"{path.name} ran but recorded no run under HPCLAB_RUNS"
    )
    if elapsed > BUDGET_S:
        warnings.warn(
            f"{path.name} took {elapsed:.0f} s, over the {BUDGET_S} s workshop budget "
            "(a busy machine is slower; on an idle 2-core machine it should fit)",
            stacklevel=2,
        )

"""What a workshop notebook must be, as checks that return problems (sentences), not asserts.

The notebooks in ``notebooks/`` are the source an instructor edits in JupyterLab; these checks are
what keeps them workshop-ready whatever saved them: tests/test_notebooks.py runs them on every
stored notebook, and tests/test_browser.py on a copy edited and saved in a real JupyterLab.
Imported as ``from notebook_checks import ...`` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

STRIP = "make strip (or .venv/bin/jupyter nbconvert --clear-output --inplace notebooks/{name})"

# Absolute or personal paths a notebook must not carry (it must work from any checkout).
_ABSOLUTE = re.compile(
    r"(?<![\w.~-])/(?:root|home|work|Users|tmp|scratch|mnt|opt)(?:/|\b)"
    r"|[A-Za-z]:\\\\|~/"
)
_DEF = re.compile(r"^\s*(?:async\s+)?def\s", re.M)
_PX = re.compile(r"^\s*%%?px", re.M)
#: The notebooks whose code is the lesson (issue 33: students write the per-rank data-parallel
#: loop themselves). In them, and only in cells that start with ``%%px`` (code that runs on the
#: engines), functions and ``%%px`` are allowed; their kernel cells stay thin like every other.
CODE_IS_THE_LESSON = {"12_the_loop_by_hand"}
#: Headings every notebook carries (issue 12: objectives at the top, answers, take-aways).
HEADINGS = ("## Learning objectives", "## Exercise", "## Answers", "## Take-aways")


def read(path: Path):
    return nbformat.read(path, as_version=4)


def code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def stored_clean(nb, name: str) -> list[str]:
    """Valid nbformat, no outputs or execution counts, the generic python3 kernelspec."""
    problems = []
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        problems.append(f"{name} is not valid nbformat 4: {exc.message}")
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count")):
            problems.append(
                f"{name}: cell {i} was saved with outputs or an execution count; clear them "
                f"before committing: {STRIP.format(name=name)}"
            )
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        problems.append(f"{name}: the kernelspec should be the generic 'python3' (opens anywhere)")
    return problems


def is_lesson_code(name: str, cell) -> bool:
    """A ``%%px`` cell of a notebook in CODE_IS_THE_LESSON: the loop the students write."""
    return Path(name).stem in CODE_IS_THE_LESSON and cell.source.lstrip().startswith("%%px")


def thin_and_portable(nb, name: str, raw: str) -> list[str]:
    """No ``def``, no ``%px`` (logic lives in hpclab; CODE_IS_THE_LESSON's ``%%px`` cells
    excepted), no absolute or personal paths."""
    problems = []
    for i, cell in enumerate(code_cells(nb)):
        if is_lesson_code(name, cell):
            continue
        if _DEF.search(cell.source):
            problems.append(
                f"{name}: code cell {i} defines a function; logic belongs in hpclab, the "
                "notebook only calls it"
            )
        if _PX.search(cell.source):
            problems.append(f"{name}: code cell {i} uses %px; training runs through lab.run")
    hit = _ABSOLUTE.search(raw)
    if hit:
        problems.append(f"{name} contains an absolute or personal path ({hit.group(0)!r})")
    return problems


def lab_lifecycle(nb, name: str) -> list[str]:
    """It starts a Lab and its last code cell stops it (no engines outlive the notebook)."""
    code = code_cells(nb)
    if not any("Lab(" in c.source for c in code):
        return [f"{name} never starts a Lab"]
    last = code[-1].source.strip() if code else ""
    if not last.endswith("lab.stop()"):
        return [f"{name}: the last code cell must end with lab.stop() (it ends {last[-60:]!r})"]
    return []


def pedagogy(nb, name: str) -> list[str]:
    """Objectives, an exercise with hints, answers and take-aways, in that order."""
    md = [c.source for c in nb.cells if c.cell_type == "markdown"]
    found = {h: next((i for i, s in enumerate(md) if h in s), None) for h in HEADINGS}
    problems = [f"{name} has no '{h}' section" for h, i in found.items() if i is None]
    if not problems:
        order = [found[h] for h in HEADINGS]
        if order != sorted(order):
            problems.append(f"{name}: the sections should come in the order {', '.join(HEADINGS)}")
        if "Hint" not in md[found["## Exercise"]]:
            problems.append(f"{name}: the Exercise gives no hints")
    return problems


def problems(path: Path) -> list[str]:
    """Every check on one notebook file; [] when it is workshop-ready."""
    nb, name, raw = read(path), path.name, path.read_text()
    return (
        stored_clean(nb, name)
        + thin_and_portable(nb, name, raw)
        + lab_lifecycle(nb, name)
        + pedagogy(nb, name)
    )

"""docs/reference-numbers.md is what scripts/reference_table.py renders from its JSON, and the
JSON holds every workshop notebook: the docs cite one generated table, not numbers typed twice."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "reference_table", ROOT / "scripts/reference_table.py"
)
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)


def test_the_page_is_what_the_json_renders_to():
    data = json.loads(table.JSON_PATH.read_text())
    assert table.PAGE_PATH.read_text() == table.render(data), (
        "docs/reference-numbers.md was edited by hand or not re-rendered: "
        "run `python scripts/reference_table.py`"
    )


def test_every_workshop_notebook_has_its_time_and_its_measured_claims():
    from test_notebooks import EXPECTED

    notebooks = json.loads(table.JSON_PATH.read_text())["notebooks"]
    assert set(notebooks) <= set(EXPECTED) and table.notebook_stems() == sorted(EXPECTED)
    for stem, row in notebooks.items():
        assert row["seconds"] > 0 and row["measured"], (stem, row)
    missing = sorted(set(EXPECTED) - set(notebooks))  # a notebook newer than the recording
    page = table.PAGE_PATH.read_text()
    assert all(stem in page for stem in missing), missing


def test_the_docs_cite_the_generated_page():
    for doc in ("instructors.md", "lessons.md"):
        assert "reference-numbers.md" in (ROOT / "docs" / doc).read_text(), doc


def test_a_log_gives_each_notebooks_time_and_claims_with_short_floats():
    log = "\n".join(
        [
            "tests/test_notebooks.py::test_notebook_runs_top_to_bottom[00_welcome]",
            "[notebook] 00_welcome.ipynb: 20 s top to bottom",
            "[notebook] 00_welcome.ipynb claims hold: val accuracy 0.9063720703125, seed 3.5",
            "[notebook] 05_critical_batch.ipynb: 26 s top to bottom",
            "PASSED",
        ]
    )
    assert table.parse_log(log) == {
        "00_welcome": {"seconds": 20, "measured": "val accuracy 0.906, seed 3.5"},
        "05_critical_batch": {"seconds": 26},
    }

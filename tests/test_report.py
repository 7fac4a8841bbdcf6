"""write_report: one self-contained HTML file (plotly.js inline once, no CDN), escaped text.

Runs are real run folders written by tests/fakes.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import plotly.offline
import pytest
from fakes import write_run

from hpclab.records.store import load_run
from hpclab.views.charts.report import write_report


@pytest.fixture
def three_runs(tmp_path) -> list[Path]:
    runs = tmp_path / "runs"
    return [
        write_run(runs, workers=1, samples_per_sec=10_000.0),
        write_run(
            runs,
            workers=2,
            name="<b>x</b>",
            val_accs=(0.5, 0.7, 0.85),
            samples_per_sec=18_000.0,
        ),
        write_run(
            runs,
            workers=4,
            val_accs=(0.4, 0.6, 0.7),
            samples_per_sec=30_000.0,
            summary={"versions": {"tensorflow": "2.15.1", "horovod": "0.28.1", "mpich": "4.3.0"}},
        ),
    ]


def test_report_is_self_contained_and_complete(tmp_path, three_runs):
    out = write_report(three_runs, tmp_path / "out" / "report.html", title="Batch sweep")
    assert out == tmp_path / "out" / "report.html" and out.is_file()
    assert out.stat().st_mode & 0o777 == 0o644  # written atomically, readable by others
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]  # no temp file left
    page = out.read_text(encoding="utf-8")
    # plotly.js is inline, exactly once; nothing is fetched from the network
    bundle_start = plotly.offline.get_plotlyjs()[:300]
    assert page.count(bundle_start) == 1
    assert not re.search(r"<script[^>]+src=[\"']?https?:", page)
    assert '<script src="http' not in page
    assert "cdn.plot.ly/plotly" not in page.replace("https://cdn.plot.ly/un/", "")
    # every run's label, escaped; the raw name never appears as markup
    for path in three_runs:
        label = load_run(path).label
        assert label.replace("<", "&lt;").replace(">", "&gt;") in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    # header: title, versions gathered from the summaries
    assert "<h1>Batch sweep</h1>" in page
    assert "2.15.1" in page and "4.3.0" in page and "0.28.1" in page
    # ≥ 2 runs with different worker counts: all sweep sections, and the target is named
    for heading in (
        "Comparison",
        "Runs",
        "Accuracy vs global batch",
        "Steps and time to target",
        "Scaling efficiency",
    ):
        assert f"<h2>{heading}</h2>" in page
    assert "validation accuracy ≥ 0.81" in page  # 90 % of the best (0.90), rounded down


def test_single_run_report_has_no_sweep_charts(tmp_path, three_runs):
    page = write_report([load_run(three_runs[0])], tmp_path / "one.html").read_text()
    assert "<h2>Runs</h2>" in page and "Accuracy vs global batch" not in page
    assert page.count(plotly.offline.get_plotlyjs()[:300]) == 1


def test_same_worker_count_skips_scaling_and_title_is_escaped(tmp_path):
    runs = [write_run(tmp_path, batch_per_worker=b, workers=2) for b in (32, 128)]
    page = write_report(runs, tmp_path / "r.html", title="a <script>").read_text()
    assert "Steps and time to target" in page and "Scaling efficiency" not in page
    assert "<h1>a &lt;script&gt;</h1>" in page


def test_report_needs_runs(tmp_path):
    with pytest.raises(ValueError, match="at least one run"):
        write_report([], tmp_path / "r.html")

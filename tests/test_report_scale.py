"""A report over a whole runs root costs what it draws, not what the root holds
(hpclab/views/charts/report_select.py).

Runs are generated cheaply, as tests/test_records_index.py does: one run written by
tests/fakes.py, its four files copied under new run ids. What a report opens is counted at the
one function that reads a run's history (report_select.read_history); its time is bounded by the
per-run cost measured here on a report that draws every run, not by a wall-clock number."""

from __future__ import annotations

import json
import re
import time

import pytest
from fakes import write_run

from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError
from hpclab.records import index
from hpclab.records.store import load_run
from hpclab.tools import cli
from hpclab.views.charts import report_select
from hpclab.views.charts.report import render_report, rest_html, write_report

FILES = ("config.json", "summary.json", "metrics.jsonl", "epochs.jsonl")


@pytest.fixture
def opened(monkeypatch):
    """How many run histories were read (a counter around the real reader)."""
    count = {"n": 0}
    real = report_select.read_history

    def counting(path, rows):
        count["n"] += 1
        return real(path, rows)

    monkeypatch.setattr(report_select, "read_history", counting)
    return count


def _root(tmp_path, n: int, name: str = "runs"):
    """A runs root of `n` records copied from one written run, each its own seed, batch and
    creation time (run i is the i-th newest from the end)."""
    template = write_run(tmp_path / "t", RunConfig(num_samples=4000))
    meta = json.loads((template / "config.json").read_text())
    rest = {f: (template / f).read_text() for f in FILES[2:]}
    summary = json.loads((template / "summary.json").read_text())
    root = tmp_path / name
    root.mkdir()
    for i in range(n):
        folder = root / f"20260101-{i:06d}-copy"
        folder.mkdir()
        meta["config"]["seed"], meta["run_id"] = i, folder.name
        meta["created"] = f"2026-01-01T00:00:00.{i:06d}+00:00"
        (folder / "config.json").write_text(json.dumps(meta))
        for f, text in rest.items():
            (folder / f).write_text(text)
        summary["val_accuracy"] = 0.5 + (i * 7919 % n) / (2 * n)  # a shuffled order
        (folder / "summary.json").write_text(json.dumps(summary))
    return root


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


@pytest.mark.slow  # 2,000 run folders written and listed: seconds, more on a loaded machine
def test_a_report_over_thousands_of_records_draws_a_stated_few(tmp_path, opened, monkeypatch):
    curves, n = 10, 2000
    small = _root(tmp_path, curves, "small")
    big = _root(tmp_path, n)
    parses = {"n": 0}
    real_read = index._read
    monkeypatch.setattr(
        index, "_read", lambda f, s: parses.__setitem__("n", parses["n"] + 1) or real_read(f, s)
    )
    # the per-run cost, measured on a report that draws every run of a small root
    out_small, t_small = _timed(lambda: write_report(small, tmp_path / "s.html", curves=curves))
    assert opened["n"] == curves
    opened["n"] = parses["n"] = 0
    out_big, t_big = _timed(lambda: write_report(big, tmp_path / "b.html", curves=curves))
    print(f"\n[report] {curves} runs drawn: {t_small:.2f} s; {n:,} records: {t_big:.2f} s")
    # only the drawn runs' histories are opened; the root is listed once through its index
    assert opened["n"] == curves and parses["n"] == n
    # drawing all would cost n × (t_small / curves); listing the rest must cost a small part of it
    assert t_big < t_small + 0.1 * (n - curves) * t_small / curves
    page = out_big.read_text()
    newest = sorted(p.name for p in big.iterdir() if p.is_dir())[-curves:]
    assert f"Showing curves of {curves} of {n:,} runs: the newest (at most {curves})" in page
    assert all(name in page for name in newest)  # in the CSV links of the drawn runs
    table = page[page.index("<h2>Runs without curves</h2>") :]
    table = table[: table.index("<h2>", 10)]
    assert table.count("<tr>") == report_select.TABLE_ROWS + 1  # header + the listed rows
    assert f"{n - curves:,} selected runs without curves: {n - curves:,} finished" in table
    # the page grows by the table of the others, not by their curves
    rest = len("".join(rest_html(report_select.select(big, curves=curves))))
    assert len(page.encode()) < 1.1 * out_small.stat().st_size + 2 * rest
    assert "Showing curves" not in out_small.read_text()


def test_filters_and_the_best_pick_choose_what_is_drawn(tmp_path, opened):
    root = _root(tmp_path, 40)
    sel = report_select.select(root, curves=3, pick="best", where={"val_accuracy": ">=0.6"})
    accs = sorted((r["val_accuracy"] for r in sel.rows), reverse=True)
    assert all(a >= 0.6 for a in accs) and opened["n"] == 3
    assert sorted(r.summary["val_accuracy"] for r in sel.drawn) == sorted(accs[:3])
    assert "the best by final validation accuracy of the" in sel.sentence()
    sel = report_select.select(root, curves=5, runs=["*-00001?-copy"])
    assert len(sel.rows) == 10 and len(sel.drawn) == 5 and sel.total == 40
    with pytest.raises(ConfigError, match="a filter names columns"):
        report_select.select(root, where={"colour": "red"})
    with pytest.raises(ConfigError, match="no run of the 40 found matches"):
        render_report(root, where={"status": "failed"})


def test_the_best_of_each_label_draws_one_curve_per_sweep_point(tmp_path):
    root = tmp_path / "runs"
    accs = {32: (0.7, 0.9, 0.8), 256: (0.6, 0.5, 0.65)}
    for batch, values in accs.items():
        for seed, acc in enumerate(values):
            write_run(root, seed=seed, batch_per_worker=batch, summary={"val_accuracy": acc})
    sel = report_select.select(root, curves=2, pick="best-per-label")
    assert sorted(r.summary["val_accuracy"] for r in sel.drawn) == [0.65, 0.9]
    assert len({r.label for r in sel.drawn}) == 2 and "one per sweep point" in sel.sentence()


def test_the_cli_reads_runs_filters_and_curves(tmp_path, capsys):
    root = _root(tmp_path, 12)
    out = tmp_path / "r.html"
    argv = ["report", str(root), "-o", str(out), "--curves", "4", "--filter", "seed<=5"]
    assert cli.main(argv) == 2  # seed is not a listing column: one sentence
    assert "a filter names columns" in capsys.readouterr().err
    argv[-1] = "workers=2"
    assert cli.main(argv + ["--runs", "*-00000?-copy", "--pick", "best"]) == 0
    page = out.read_text()
    assert "Showing curves of 4 of 12 runs: the best by final validation accuracy of the 10" in page
    assert "2 runs do not match --runs/--filter" in page
    assert cli.main(argv[:-2] + ["--filter", "workers"]) == 2
    assert "--filter takes KEY=VALUE" in capsys.readouterr().err


def test_a_long_run_is_read_thinned_keeping_its_evaluations_and_newest_rows(tmp_path):
    rows = [
        {"step": s, "loss": 1.0 / s, "eval_accuracy": 0.5 if s % 1000 == 0 else None}
        for s in range(1, 20_001)
    ]
    folder = write_run(tmp_path / "runs", history=rows)
    kept, thinned = report_select.read_history(folder / "metrics.jsonl", 400)
    steps = [r["step"] for r in kept]
    assert thinned and len(kept) <= 400 + 20 and steps == sorted(steps)
    assert {s for s in steps if s % 1000 == 0} == set(range(1000, 20_001, 1000))
    assert steps[-200:] == list(range(19_801, 20_001))  # the newest half exact
    page = write_report(folder, tmp_path / "r.html").read_text()
    share = report_select.rows_per_run(1)
    assert f"1 run(s) with more than {share:,} history rows are drawn and" in page


def _undated(page: str) -> str:
    """`page` without what differs between two writes: the date and plotly's random div ids."""
    page = re.sub(r"Written [^·]+·", "Written ·", page)
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "id", page)


def test_a_small_root_reports_as_before(tmp_path, opened):
    runs = tmp_path / "runs"
    made = [write_run(runs, workers=w, batch_per_worker=b) for w, b in ((1, 32), (2, 64), (4, 32))]
    folders = sorted(made)  # a runs root is read in folder-name order
    by_root = render_report(runs, title="t")
    as_before = render_report([load_run(f) for f in folders], title="t")  # what the CLI did
    assert _undated(by_root) == _undated(as_before)
    assert "Showing curves" not in by_root and "Runs without curves" not in by_root
    assert "3 runs</p>" in by_root and opened["n"] == 3

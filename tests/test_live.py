"""The live dashboard and what it draws from: the run adapter (views.facts), the trace specs and
static figure (views.traces), and the widget (views.live): controls, overlays, partial data,
throttling.

Runs are written to real run folders (tests/fakes.py, through RunStore) and read back with
load_run, so these tests also exercise the on-disk format the dashboard reads after a kernel
restart.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fakes import FakeRun, make_history, write_run

from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError
from hpclab.records.store import RunStore, load_run
from hpclab.views.charts.facts import ema, run_facts
from hpclab.views.charts.traces import IDEAL_NOTE, figure, trace_specs
from hpclab.views.panel.live import DEFAULT_SMOOTHING, Dashboard

ROOT = Path(__file__).resolve().parents[1]


def raw_history(path: Path) -> list[dict]:
    """Read metrics.jsonl independently of hpclab, to compare against what is drawn."""
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_give_two_rank_traces_global_and_ideal(tmp_path):
    path = write_run(tmp_path, workers=2)
    rec = load_run(path)
    raw = raw_history(path)
    dash = Dashboard("demo", ideal_single_rank=10_000.0)
    dash.show_run(rec)
    names = [t.name for t in dash.fig.data]
    assert [n for n in names if n.startswith("rank ")] == ["rank 0", "rank 1"]
    assert "global" in names
    for r in (0, 1):
        np.testing.assert_allclose(
            dash.trace(f"thr/rank{r}").y, [row["rank_samples_per_sec"][r] for row in raw]
        )
    np.testing.assert_allclose(dash.trace("thr/global").y, [row["samples_per_sec"] for row in raw])
    np.testing.assert_array_equal(dash.trace("thr/global").x, [row["step"] for row in raw])
    ideal = dash.trace("thr/ideal")
    assert ideal.visible is True
    np.testing.assert_allclose(ideal.y, [20_000.0, 20_000.0])  # workers × single-rank reference
    assert list(ideal.x) == [raw[0]["step"], raw[-1]["step"]]
    notes = {a.name: a.text for a in dash.fig.layout.annotations if a.name}
    assert notes["ideal_note"] == ""
    # the noise panel's reference line sits at the global batch (2 × 64)
    np.testing.assert_allclose(dash.trace("noise/batch").y, [128, 128])
    assert "B = 128" in notes["noise_note"]


def test_above_sixteen_ranks_throughput_is_a_min_median_max_band(tmp_path):
    cfg = RunConfig(num_samples=40000, batch_per_worker=16)
    rows = make_history(cfg, 20, 6)
    rows[2]["rank_samples_per_sec"][7] = 1.0  # one straggling rank in one window
    rec = load_run(write_run(tmp_path, cfg, workers=20, history=rows))
    specs = {s.key: s for s in trace_specs(rec)}
    assert not any(k.startswith("thr/rank") and k[8:].isdigit() for k in specs)  # no 20 lines
    matrix = np.array([r["rank_samples_per_sec"] for r in rows])
    np.testing.assert_allclose(specs["thr/rank-min"].y, matrix.min(axis=1))
    np.testing.assert_allclose(specs["thr/rank-max"].y, matrix.max(axis=1))
    np.testing.assert_allclose(specs["thr/rank-median"].y, np.median(matrix, axis=1))
    assert specs["thr/rank-max"].props["fill"] == "tonexty"  # shaded down to the min line
    assert specs["thr/rank-min"].y[2] == 1.0
    # Sixteen ranks still get a line each.
    rec16 = load_run(write_run(tmp_path / "16", cfg, workers=16, history=6))
    keys = {s.key for s in trace_specs(rec16)}
    assert {f"thr/rank{r}" for r in range(16)} <= keys and "thr/rank-min" not in keys


def test_without_reference_the_ideal_line_is_hidden_with_a_note(tmp_path):
    dash = Dashboard()
    dash.show_run(load_run(write_run(tmp_path, workers=2)))
    assert dash.trace("thr/ideal").visible is False
    notes = {a.name: a.text for a in dash.fig.layout.annotations if a.name}
    assert notes["ideal_note"] == IDEAL_NOTE == "run with 1 worker to get the ideal line"


def test_one_worker_overlay_provides_the_ideal_reference(tmp_path):
    one = load_run(write_run(tmp_path, workers=1, samples_per_sec=11_000.0))
    four = load_run(write_run(tmp_path, workers=4))
    dash = Dashboard()
    dash.show_run(four)
    dash.overlay([one])
    assert dash.trace("thr/ideal").visible is True
    np.testing.assert_allclose(dash.trace("thr/ideal").y, [44_000.0, 44_000.0])


def test_x_axis_switch_changes_x_data_and_titles(tmp_path):
    path = write_run(tmp_path, workers=2)
    raw = raw_history(path)
    rec = load_run(path)
    dash = Dashboard()
    dash.show_run(rec)
    dash.set_x("samples")
    np.testing.assert_array_equal(dash.trace("thr/global").x, [r["samples"] for r in raw])
    assert dash.fig.layout.xaxis.title.text == "samples seen"
    # epoch rows have no samples column: step × global batch
    steps = [json.loads(ln)["step"] for ln in (path / "epochs.jsonl").read_text().splitlines()]
    np.testing.assert_array_equal(dash.trace("acc/val").x, [s * 128 for s in steps])
    dash.set_x("time_s")
    np.testing.assert_allclose(dash.trace("loss/train").x, [r["time_s"] for r in raw])
    assert dash.fig.layout.xaxis5.title.text == "wall time (s)"
    with pytest.raises(ValueError, match="x must be one of"):
        dash.set_x("epochs")


def test_smoothing_changes_y_but_not_length(tmp_path):
    path = write_run(tmp_path, workers=2)
    raw_loss = [r["loss"] for r in raw_history(path)]
    dash = Dashboard()
    dash.show_run(load_run(path))
    before = np.array(dash.trace("loss/train").y)
    dash.set_smoothing(0.8)
    after = np.array(dash.trace("loss/train").y)
    assert len(after) == len(before) == len(raw_loss)
    assert not np.allclose(after, before)
    # EMA by hand: s0 = y0, s1 = 0.8·s0 + 0.2·y1, s2 = 0.8·s1 + 0.2·y2
    s1 = 0.8 * raw_loss[0] + 0.2 * raw_loss[1]
    s2 = 0.8 * s1 + 0.2 * raw_loss[2]
    np.testing.assert_allclose(after[:3], [raw_loss[0], s1, s2])
    assert len(dash.trace("thr/rank0").y) == len(raw_loss)  # throughput smoothed too
    assert len(dash.trace("acc/val").y) == 3  # epoch markers untouched
    dash.set_smoothing(0.0)
    np.testing.assert_allclose(dash.trace("loss/train").y, raw_loss)


def test_the_dashboard_starts_smoothed_and_the_slider_says_so(tmp_path):
    path = write_run(tmp_path, workers=2)
    raw_loss = [r["loss"] for r in raw_history(path)]
    dash = Dashboard()
    dash.show_run(load_run(path))
    assert 0 < DEFAULT_SMOOTHING < 1 and dash.smoothing == DEFAULT_SMOOTHING
    assert dash._smooth_ctl.value == pytest.approx(DEFAULT_SMOOTHING)
    np.testing.assert_allclose(dash.trace("loss/train").y, ema(raw_loss, DEFAULT_SMOOTHING))
    assert not np.allclose(dash.trace("loss/train").y, raw_loss)
    raw = Dashboard(smoothing=0)
    raw.show_run(load_run(path))
    np.testing.assert_allclose(raw.trace("loss/train").y, raw_loss)
    with pytest.raises(ValueError, match="smoothing"):
        Dashboard(smoothing=1.5)


def test_throughput_smoothing_starts_after_the_first_call(tmp_path):
    # Row 1 is the first call (graph optimisation, ~1 % of the steady rate): an EMA started
    # there would drag the curve down for many rows.
    cfg = RunConfig()
    rows = make_history(cfg, 2, 8)
    rates = [300.0, 9000.0, 11000.0, 10000.0, 9500.0, 10500.0, 10000.0, 9800.0]
    for row, rate in zip(rows, rates):
        row["samples_per_sec"] = rate
        row["rank_samples_per_sec"] = [rate / 2, rate / 2]
    dash = Dashboard(smoothing=0.6)
    dash.show_run(load_run(write_run(tmp_path, cfg, workers=2, history=rows)))
    want = np.concatenate([[300.0], ema(rates[1:], 0.6)])
    np.testing.assert_allclose(dash.trace("thr/global").y, want)
    np.testing.assert_allclose(dash.trace("thr/rank1").y, want / 2)
    assert min(dash.trace("thr/global").y[1:]) >= 9000.0


def test_rank_lines_differ_in_dash_and_titles_name_unit_and_x_axis(tmp_path):
    dash = Dashboard()
    dash.show_run(load_run(write_run(tmp_path, workers=4)))
    ranks = [dash.trace(f"thr/rank{r}").line for r in range(4)]
    assert len({line.dash for line in ranks}) == 4  # lockstep ranks coincide: dashes keep each
    assert len({line.color for line in ranks}) == 4
    titles = {
        a.name: a.text for a in dash.fig.layout.annotations if (a.name or "").startswith("title:")
    }
    timeline = ("throughput", "loss", "accuracy", "lr", "noise")
    assert set(titles) == {f"title:{p}" for p in (*timeline, "split")}
    assert titles["title:throughput"] == "throughput (samples/s over ≥ 1 s) vs step"
    assert all(titles[f"title:{p}"].endswith(" vs step") for p in timeline)
    assert titles["title:split"].startswith("where a step's time goes, per rank (ms per step")
    dash.set_x("time_s")
    titles = {
        a.name: a.text for a in dash.fig.layout.annotations if (a.name or "").startswith("title:")
    }
    assert all(titles[f"title:{p}"].endswith(" vs wall time (s)") for p in timeline)
    assert "vs" not in titles["title:split"]  # drawn per rank, not against the x axis


def test_the_split_panel_stacks_each_ranks_parts_and_names_pop_efficiencies(tmp_path):
    """Four ranks of the fake history (rank r computes 6 + 0.5 r ms a step and the others wait
    for rank 3 in the allreduce): a stack per rank, parts in PARTS order, POP's numbers."""
    from hpclab.core.pop import PARTS

    record = load_run(write_run(tmp_path, workers=4))
    last = record.history.iloc[-1]
    dash = Dashboard()
    dash.show_run(record)
    for part in PARTS:
        bar = dash.trace(f"split/{part}")
        assert bar.type == "bar" and bar.orientation == "h"
        assert list(bar.y) == [f"rank {r}" for r in range(4)]
        np.testing.assert_allclose(bar.x, last[f"rank_{part}_ms"])
    np.testing.assert_allclose(dash.trace("split/compute").x, [6.0, 6.5, 7.0, 7.5])
    np.testing.assert_allclose(dash.trace("split/allreduce").x, [2.5, 2.0, 1.5, 1.0])
    note = next(a.text for a in dash.fig.layout.annotations if a.name == "pop_note")
    assert f"LB {last['load_balance']:.2f}" in note
    assert f"PE {last['parallel_efficiency']:.2f}" in note
    assert f"input {last['input_share']:.0%}" in note  # the step waiting for its batch
    assert last["load_balance"] < 1.0 and last["comm_efficiency"] < 1.0


def test_ema_keeps_gaps():
    out = ema([1.0, float("nan"), 3.0], 0.5)
    assert math.isnan(out[1]) and out[0] == 1.0 and out[2] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="smoothing"):
        ema([1.0], 1.0)


def test_log_y_toggle_for_loss(tmp_path):
    dash = Dashboard()
    dash.show_run(load_run(write_run(tmp_path)))
    dash.set_log_loss(True)
    assert dash.fig.layout.yaxis2.type == "log"
    dash.set_log_loss(False)
    assert dash.fig.layout.yaxis2.type == "linear"


def test_overlay_adds_faded_dashed_traces_named_by_label(tmp_path):
    current = load_run(write_run(tmp_path, workers=2))
    old = load_run(write_run(tmp_path, workers=2, name="baseline b64", history=20))
    dash = Dashboard()
    dash.show_run(current)
    n = len(dash.fig.data)
    dash.overlay([old])
    added = dash.fig.data[n:]
    assert len(added) == 6  # throughput, loss, train acc, val acc, lr, noise scale
    assert old.label == "baseline b64 ×2"
    assert all(t.name == "baseline b64 ×2" for t in added)
    assert all(t.line.dash == "dash" and t.opacity < 1 for t in added)
    assert sum(bool(t.showlegend) for t in added) == 1  # one legend entry per earlier run
    np.testing.assert_allclose(
        dash.trace("ov0/thr/global").y, [r["samples_per_sec"] for r in raw_history(old.path)]
    )
    dash.set_x("samples")  # overlays follow the x-axis switch
    np.testing.assert_array_equal(
        dash.trace("ov0/thr/global").x, [r["samples"] for r in raw_history(old.path)]
    )
    dash.clear_overlays()
    assert len(dash.fig.data) == n


def test_empty_run_draws_then_gains_points(tmp_path):
    cfg = RunConfig()
    path = write_run(tmp_path, cfg, workers=2, status="running", history=[], val_accs=())
    rec = load_run(path)
    assert rec.history.empty and rec.epochs.empty
    dash = Dashboard()
    dash.show_run(rec)
    assert len(dash.trace("thr/global").x) == 0
    dash.set_x("time_s")
    dash.set_smoothing(0.5)
    RunStore(tmp_path, path.name).append_history(make_history(cfg, 2, 5))
    dash.update(load_run(path))
    assert len(dash.trace("thr/global").x) == 5
    assert len(dash.trace("thr/rank1").y) == 5


def test_partial_columns_do_not_crash():
    class Partial:  # an old record: a few columns only, no rank list, dict config
        history = pd.DataFrame({"step": [1, 2, 3], "loss": [2.0, 1.5, None]})
        epochs = pd.DataFrame({"epoch": [1]})
        workers = 3
        config = {"batch_per_worker": 32}
        status = "running"

    dash = Dashboard()
    dash.show_run(Partial())
    assert [t.name for t in dash.fig.data][:3] == ["rank 0", "rank 1", "rank 2"]
    assert len(dash.trace("loss/train").y) == 3
    assert np.isnan(dash.trace("thr/global").y).all()
    dash.set_x("samples")  # samples derived from step × (32 × 3)
    np.testing.assert_array_equal(dash.trace("loss/train").x, [96, 192, 288])


def test_run_adapter_reads_the_lab_meta(tmp_path):
    facts = run_facts(write_run(tmp_path, workers=2, threads_per_worker=4))
    assert facts.threads_per_worker == 4 and facts.lab["launcher"] == "mpi"
    old = run_facts(write_run(tmp_path, threads_per_worker=None))  # recorded before lab meta
    assert old.threads_per_worker is None and old.lab == {}


def test_run_adapter_hides_unanswerable_properties_but_not_bugs():
    class BadConfig:  # a property that cannot answer (a config that no longer validates)
        history = pd.DataFrame({"step": [1, 2]})
        workers = 2

        @property
        def config(self):
            raise ConfigError("RunConfig has no field 'colour'.")

    facts = run_facts(BadConfig())
    assert facts.config == {} and facts.workers == 2 and len(facts.history) == 2

    class Buggy(BadConfig):  # a programming error inside a property keeps its traceback
        @property
        def status(self):
            return 1 / 0

    with pytest.raises(ZeroDivisionError):
        run_facts(Buggy())


def test_throttling_limits_redraws_and_delivers_the_final_state():
    run = FakeRun()
    dash = Dashboard(min_interval_s=0.5)
    dash.attach(run)
    start, t0 = dash.redraws, time.monotonic()
    for n in range(1, 101):  # 100 callbacks, far faster than one per min_interval_s
        run.publish(n)
    allowed = 1 + int((time.monotonic() - t0) / 0.5)  # one per interval (+ a trailing one)
    assert dash.redraws - start <= allowed < 100
    run.status, run.done = "finished", True
    run.publish(120)  # the run's final callback: drawn at once, whatever the interval
    assert dash.wait_idle(10)  # (on the dashboard's drawing thread, never the monitor's)
    assert len(dash.trace("thr/global").x) == 120
    assert "finished" in dash._status.value
    assert dash.redraws - start <= allowed + 1


def test_trailing_redraw_delivers_rows_that_arrive_during_the_quiet_interval():
    run = FakeRun()
    dash = Dashboard(min_interval_s=0.15, max_wait_s=2.0)
    dash.attach(run)
    run.publish(5)  # inside the interval: deferred, not dropped
    assert len(dash.trace("thr/global").x) == 0
    deadline = time.monotonic() + 2.0
    while len(dash.trace("thr/global").x) != 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(dash.trace("thr/global").x) == 5
    dash.detach()
    run.publish(10)  # ignored once detached
    time.sleep(0.2)
    assert len(dash.trace("thr/global").x) == 5


def test_static_figure_shares_the_trace_code(tmp_path):
    from hpclab.core.pop import PARTS

    a = load_run(write_run(tmp_path, workers=2, name="a"))
    b = load_run(write_run(tmp_path, workers=4, name="b"))
    one = figure([a], x="samples", ideal_single_rank=9000.0)
    assert [t.name for t in one.data] == [
        s.props["name"] for s in trace_specs(a, x="samples", ideal_single_rank=9000.0)
    ]
    np.testing.assert_allclose(one.data[3].y, [18_000.0, 18_000.0])  # rank0, rank1, global, ideal
    both = figure([a, b])
    lines = [t for t in both.data if t.type == "scatter"]
    assert {t.name for t in lines} == {"a ×2", "b ×4"}
    assert sum(bool(t.showlegend) for t in lines) == 2
    bars = [t for t in both.data if t.type == "bar"]  # the split panel: one stack per run
    assert {t.name for t in bars} == set(PARTS) and {tuple(t.y) for t in bars} == {
        ("a ×2",),
        ("b ×4",),
    }
    assert sum(bool(t.showlegend) for t in bars) == len(PARTS)  # each part named once
    assert len(figure([]).data) == 0


STATIC_VIEWS = (
    "facts",
    "outcomes",
    "skeleton",
    "traces",
    "comparison",
    "batch_charts",
    "scaling_charts",
    "report",
)


def test_views_import_fast_and_static_charts_never_import_the_widget():
    code = (
        "import sys, time; t = time.time();"
        + "".join(f"import hpclab.views.charts.{m};" for m in STATIC_VIEWS)
        + "bad = [m for m in ('tensorflow', 'horovod', 'ipyparallel', 'ipywidgets',"
        " 'hpclab.views.panel.live') if m in sys.modules]; assert not bad, bad;"
        "import hpclab.views.panel.live; dt = time.time() - t;"
        "bad = [m for m in ('tensorflow', 'horovod', 'ipyparallel', 'ipywidgets') if m in sys.modules];"
        "print(bad, dt); assert not bad, bad; assert dt < 3, dt"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_each_chart_has_its_own_legend_inside_its_panel(tmp_path):
    import plotly.graph_objects as go

    from hpclab.views.charts.skeleton import AXES, LEGENDS, skeleton

    fig = skeleton(go.Figure, "", "step")
    assert fig.layout.autosize is True  # as wide as the cell or page
    for panel, legend in LEGENDS.items():
        xa, ya = AXES[panel]
        x_dom = fig.layout[xa.replace("x", "xaxis")].domain
        y_dom = fig.layout[ya.replace("y", "yaxis")].domain
        box = fig.layout[legend]
        assert box.x == x_dom[1] and box.y in (y_dom[0], y_dom[1])  # a corner of its own panel
    drawn = figure([load_run(write_run(tmp_path, val_accs=[0.5, 0.8]))])
    for trace in drawn.data:
        panel = next(p for p, axes in AXES.items() if axes == (trace.xaxis, trace.yaxis))
        assert trace.legend == LEGENDS[panel], (trace.name, trace.legend, panel)

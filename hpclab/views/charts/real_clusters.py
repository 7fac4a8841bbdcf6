"""The student's two ranks beside real clusters: one figure per lesson, the cluster's series from
:mod:`hpclab.core.real_clusters` and :mod:`hpclab.core.real_targets` (Pollux OSDI'21 T4 traces,
MLPerf v3.0 H100) and the student's own measurement on the same axes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpclab.views.charts import overlap as overlap_charts
from hpclab.views.charts.facts import facts_of
from hpclab.views.charts.scaling_charts import scaling_series

YOURS = dict(size=13, symbol="star", line=dict(width=1, color="black"))


def scaling_figure(section, records: Iterable[Any]) -> go.Figure:
    """Notebook 04: E(N) against GPUs on the clusters (lines), the student's E(2) (stars)."""
    fig = go.Figure()
    for s in section.series:
        fig.add_trace(
            go.Scatter(
                x=s["x"],
                y=s["y"],
                name=s["name"],
                mode="lines+markers",
                line=dict(dash="solid" if s["kind"] == "weak" else "dash"),
            )
        )
    for s in scaling_series(records):
        if s["workers"][-1] == 2:
            fig.add_trace(
                go.Scatter(
                    x=[2],
                    y=[s["efficiency"][-1]],
                    name=f"your run: {s['name']}",
                    mode="markers",
                    marker=YOURS,
                )
            )
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_xaxes(type="log", title="GPUs (your runs: ranks)", tickvals=[1, 2, 4, 8, 16, 32, 64])
    fig.update_yaxes(title="scaling efficiency E(N) = T_N / (N · T_1)", rangemode="tozero")
    fig.update_layout(title="Your E(2) beside 64 T4s and DGX H100s", height=480)
    return fig


def critical_batch_figure(section, fit, best, b_simple: dict) -> go.Figure:
    """Notebook 05. Left: steps to target against the batch, each workload's points and fitted
    S(B) with B_crit marked, the student's beside them. Right: B_simple / B_crit along training
    (1 on the x axis: where the run reached the target), the student's B_simple at the target."""
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.12,
        subplot_titles=("steps to target against the batch", "B_simple / B_crit along training"),
    )
    steps = [s for s in section.series if s["kind"] == "steps"]
    steps.append(
        {
            "name": "your MNIST-1D sweep",
            "x": list(best["global_batch"]),
            "y": list(best["steps"]),
            "fit": fit,
        }
    )
    for k, s in enumerate(steps):
        _fitted_steps(fig, s, _color(k))
    for k, s in enumerate(x for x in section.series if x["kind"] == "b_simple"):
        fig.add_trace(
            go.Scatter(
                x=np.asarray(s["x"]) / s["target_step"],
                y=np.asarray(s["y"]) / s["b_crit"],
                name=s["name"],
                mode="lines",
                line=dict(color=_color(k)),
            ),
            row=1,
            col=2,
        )
    values = [v for v in b_simple.values() if v]
    fig.add_trace(
        go.Scatter(
            x=[1.0] * len(values),
            y=[v / fit.b_crit for v in values],
            name="your B_simple at the target",
            mode="markers",
            marker=YOURS,
            marker_color=_color(len(steps) - 1),
        ),
        row=1,
        col=2,
    )
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=2)
    fig.update_xaxes(type="log", title="global batch B", row=1, col=1)
    fig.update_yaxes(type="log", title="steps to target", row=1, col=1)
    fig.update_xaxes(title="steps / steps to target", range=[0, 1.5], row=1, col=2)
    fig.update_yaxes(type="log", title="B_simple / fitted B_crit", row=1, col=2)
    fig.update_layout(title="Your critical batch beside T4 and H100 runs", height=480)
    return fig


def _fitted_steps(fig: go.Figure, s: dict, color: str) -> None:
    """One workload on the left panel: its points, its fitted S(B) and B_crit (a diamond)."""
    mine = s["name"].startswith("your")
    fig.add_trace(
        go.Scatter(
            x=s["x"],
            y=s["y"],
            name=s["name"],
            mode="markers",
            marker=YOURS if mine else dict(size=8),
            marker_color=color,
        ),
        row=1,
        col=1,
    )
    f = s["fit"]
    b = np.geomspace(min(s["x"]) / 2, max(max(s["x"]) * 2, f.b_crit * 1.5), 60)
    fig.add_trace(
        go.Scatter(
            x=b,
            y=f.predict_steps(b),
            mode="lines",
            line=dict(color=color),
            name=f"S(B) fit: B_crit {f.b_crit:,.0f}",
            showlegend=False,
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=[f.b_crit],
            y=[f.predict_steps(f.b_crit)],
            mode="markers",
            marker=dict(symbol="diamond", size=11, color=color),
            name=f"B_crit {f.b_crit:,.0f}",
            showlegend=False,
        ),
        row=1,
        col=1,
    )


def hardware_statistical_figure(section, speed_table, best, workers: int = 2) -> go.Figure:
    """Notebook 02, three panels: samples/s against the local batch, each relative to its own
    smallest local batch (hardware efficiency); steps to target against the global batch; time
    to target against the global batch, relative to the soonest. The clusters' lines beside the
    student's stars (their local batch: the global batch over ``workers``)."""
    fig = make_subplots(
        rows=1,
        cols=3,
        horizontal_spacing=0.08,
        subplot_titles=(
            "samples/s / samples/s at the smallest local batch",
            "steps to target",
            "time to target / the soonest",
        ),
    )
    speed = speed_table.sort_values("global_batch")
    rate = list(speed["samples_per_sec"])
    mine = {
        "rate": (list(speed["global_batch"] / workers), rate),
        "steps": (list(best["global_batch"]), list(best["steps"])),
        "time": (list(best["global_batch"]), list(best["time_to_target_s"])),
    }
    seen: list[str] = []  # one legend entry and one colour per cluster line across panels
    for col, kind in enumerate(("rate", "steps", "time"), start=1):
        for s in (x for x in section.series if x["kind"] == kind):
            if s["name"] not in seen:
                seen.append(s["name"])
            y = np.asarray(s["y"], dtype=float)
            y = y / (y[0] if kind == "rate" else y.min()) if kind != "steps" else y
            fig.add_trace(
                go.Scatter(
                    x=s["x"],
                    y=y,
                    name=s["name"],
                    mode="lines+markers",
                    line=dict(color=_color(seen.index(s["name"]))),
                    legendgroup=s["name"],
                    showlegend=kind != "time",
                ),
                row=1,
                col=col,
            )
        x, y = mine[kind]
        y = np.asarray(y, dtype=float)
        ok = np.isfinite(y)
        if ok.any() and kind != "steps":
            y = y / (y[ok][0] if kind == "rate" else y[ok].min())
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                name="your runs (2 ranks, MNIST-1D)",
                mode="markers+lines",
                marker=YOURS,
                line=dict(color="black", dash="dot"),
                legendgroup="yours",
                showlegend=col == 1,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(type="log", row=1, col=col)
        fig.update_yaxes(type="log", row=1, col=col)
    fig.update_xaxes(title="local batch (per GPU / per rank)", row=1, col=1)
    fig.update_xaxes(title="global batch", row=1, col=2)
    fig.update_xaxes(title="global batch", row=1, col=3)
    fig.update_layout(title="Hardware and statistical efficiency: your runs beside T4s", height=460)
    return fig


def overlap_figure(section, runs: Iterable[Any], local_batch: int) -> go.Figure:
    """Notebook 13: the exposed synchronisation's share of a step against the local batch on 16
    T4 nodes (overlapped), and the student's arms at their local batch."""
    fig = go.Figure()
    for s in section.series:
        fig.add_trace(go.Scatter(x=s["x"], y=s["y"], name=s["name"], mode="lines+markers"))
    for _, arm in overlap_charts.arms(runs).iterrows():
        fig.add_trace(
            go.Scatter(
                x=[local_batch],
                y=[arm["allreduce_share"]],
                name=f"your run: {arm['arm']}",
                mode="markers",
                marker=YOURS,
            )
        )
    fig.update_xaxes(type="log", title="local batch (images per GPU; yours: per rank)")
    fig.update_yaxes(title="exposed allreduce / step", tickformat=".0%", rangemode="tozero")
    fig.update_layout(title="Exposed allreduce: your two ranks beside 16 T4 nodes", height=460)
    return fig


def share_figure(section, runs: Iterable[Any]) -> go.Figure:
    """Notebook 06: the synchronisation share of a step against GPUs, one line per local batch
    (T4s packed 4 a node), and the student's allreduce share at their ranks (stars)."""
    fig = go.Figure()
    for k, s in enumerate(section.series):
        fig.add_trace(
            go.Scatter(
                x=s["x"],
                y=s["y"],
                name=s["name"],
                mode="lines+markers",
                line=dict(color=_color(k)),
            )
        )
    for f in facts_of(runs):
        split = f.summary.get("time_split") or {}
        if split.get("step_ms"):
            fig.add_trace(
                go.Scatter(
                    x=[f.workers],
                    y=[split["allreduce_ms"] / split["step_ms"]],
                    name=f"your run: {f.label}",
                    mode="markers",
                    marker=YOURS,
                )
            )
    fig.add_vrect(x0=4.5, x1=64, fillcolor="grey", opacity=0.08, line_width=0)
    fig.update_xaxes(
        type="log",
        title="GPUs, 4 a node (yours: ranks on one machine)",
        tickvals=[1, 2, 4, 8, 16, 32, 64],
    )
    fig.update_yaxes(title="synchronisation / step", tickformat=".0%", rangemode="tozero")
    fig.update_layout(
        title="Where the time goes: your ranks beside T4s (shaded: across nodes)", height=460
    )
    return fig


def prediction_figure(section, predicted_ms: float, measured_ms) -> go.Figure:
    """Notebook 10: predicted / measured for each of MLPerf's larger runs predicted from its 8-
    and 64-GPU runs (the band as error bars), beside the student's 2-rank step time at a local
    batch the planner never ran (the mean of the measured repeats)."""
    rows = [s for s in section.series if s["kind"] == "ratio"]
    fig = go.Figure()
    for k, what in enumerate(("step time", "steps", "minutes", "GPU-hours")):
        mine = [s for s in rows if s["name"].endswith(what)]
        lo = [
            s["predicted"] / s["measured"] - s["band"][0] / s["measured"] if s["band"] else 0
            for s in mine
        ]
        hi = [
            s["band"][1] / s["measured"] - s["predicted"] / s["measured"] if s["band"] else 0
            for s in mine
        ]
        fig.add_trace(
            go.Scatter(
                x=[s["name"] for s in mine],
                y=[s["predicted"] / s["measured"] for s in mine],
                error_y=dict(type="data", symmetric=False, array=hi, arrayminus=lo),
                mode="markers",
                marker=dict(size=11, color=_color(k)),
                name=f"MLPerf H100, {what} (from 8 and 64 GPUs)",
            )
        )
    measured = float(np.mean(measured_ms))
    fig.add_trace(
        go.Scatter(
            x=["your 2 ranks: step time"],
            y=[predicted_ms / measured],
            mode="markers",
            marker=YOURS,
            name="your held-out step time (planner fitted without it)",
        )
    )
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_yaxes(type="log", title="predicted / measured (bars: the band)")
    fig.update_layout(title="Predict someone else's 768-GPU run: predicted / measured", height=480)
    return fig


def _color(k: int) -> str:
    palette = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")
    return palette[k % len(palette)]


__all__ = [
    "scaling_figure",
    "hardware_statistical_figure",
    "critical_batch_figure",
    "overlap_figure",
    "share_figure",
    "prediction_figure",
]

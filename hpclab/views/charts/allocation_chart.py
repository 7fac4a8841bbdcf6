"""The allocation plan's charts (:mod:`hpclab.core.allocation`): time to target against GPU-hours
with the Pareto set and its named points, and the critical-batch fit beside its measurements.

* :func:`pareto_figure` — every (ranks, global batch) choice as a point, coloured by ranks, the
  Pareto set joined, the named points labelled ("cheapest", "the knee", ...), both axes log.
* :func:`critical_batch_figure` — steps and samples to target against the global batch as
  McCandlish et al. 2018 draw them (Fig. 6), the measured best-LR points on the fitted curve with
  its ±2 standard-error band.
* :func:`steps_samples_figure` — steps against samples to target, the trade-off curve
  (S/S_min − 1)(E/E_min − 1) = 1 of McCandlish et al. 2018 (Fig. 6) through the best-LR
  points, B_crit marked where both are twice their minimum.

plotly only; static figures, no widgets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpclab.core.allocation import Allocation
from hpclab.core.critical_batch import CriticalBatchFit
from hpclab.views.charts.skeleton import RUN_COLORS


def _hours(row: dict) -> float:
    return row["time_s"] / 3600


def pareto_figure(allocation: Allocation) -> go.Figure:
    """Time to target (hours) against GPU-hours for every choice; the Pareto set and the named
    points on top."""
    fig = go.Figure()
    workers = sorted({r["workers"] for r in allocation.rows})
    for i, w in enumerate(workers):
        rows = [r for r in allocation.rows if r["workers"] == w]
        fig.add_trace(
            go.Scatter(
                x=[r["gpu_hours"] for r in rows],
                y=[_hours(r) for r in rows],
                mode="markers",
                marker=dict(size=9, color=RUN_COLORS[i % len(RUN_COLORS)], opacity=0.8),
                name=f"{w} rank{'s' if w > 1 else ''}",
                text=[f"global batch {r['global_batch']:,}" for r in rows],
                hovertemplate="%{text}<br>%{x:.3g} GPU-h, %{y:.3g} h<extra>%{fullData.name}</extra>",
            )
        )
    front = sorted(allocation.pareto, key=lambda r: r["gpu_hours"])
    fig.add_trace(
        go.Scatter(
            x=[r["gpu_hours"] for r in front],
            y=[_hours(r) for r in front],
            mode="lines",
            line=dict(color="black", width=1, dash="dot"),
            name="Pareto set",
        )
    )
    for label, r in allocation.named.items():
        fig.add_annotation(
            x=np.log10(r["gpu_hours"]),
            y=np.log10(_hours(r)),
            text=f"{label}<br>{r['workers']} × {r['local_batch']:g}",
            showarrow=True,
            arrowhead=2,
            ax=40,
            ay=-30,
            font=dict(size=11),
        )
    fig.update_xaxes(type="log", title_text="GPU-hours (ranks × hours)")
    fig.update_yaxes(type="log", title_text=f"hours to {allocation.target}")
    fig.update_layout(
        title="Plan: time to target against its cost",
        height=460,
        margin=dict(t=60, b=50, l=60, r=20),
    )
    return fig


def critical_batch_figure(fit: CriticalBatchFit, measured: Sequence | None = None) -> go.Figure:
    """Steps (left) and samples (right) to target against the global batch: the fitted
    S(B) = S_min (1 + B_crit/B) and E(B) = E_min (1 + B/B_crit) with a ±2 SE band, the points
    it was fitted to, and every LR tried when ``measured`` (rows with global_batch, lr, steps)
    is given."""
    lo, hi = min(fit.batches) / 2, max(fit.batches) * 4
    b = np.geomspace(lo, hi, 80)
    s, se = fit.predict_steps(b), fit.steps_se(b)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("steps to target", "samples to target"))
    for col, scale in ((1, np.ones_like(b)), (2, b)):
        fig.add_trace(
            go.Scatter(
                x=np.concatenate([b, b[::-1]]),
                y=np.concatenate(
                    [(s + 2 * se) * scale, np.maximum(s - 2 * se, 1e-9)[::-1] * scale[::-1]]
                ),
                fill="toself",
                line=dict(width=0),
                fillcolor="rgba(27,158,119,0.15)",
                name="±2 standard errors",
                showlegend=col == 1,
                hoverinfo="skip",
            ),
            row=1,
            col=col,
        )
        fig.add_trace(
            go.Scatter(
                x=b,
                y=s * scale,
                mode="lines",
                line=dict(color="#1b9e77"),
                name=f"fit: B_crit ≈ {fit.b_crit:,.0f}",
                showlegend=col == 1,
            ),
            row=1,
            col=col,
        )
        pts = np.asarray(fit.batches)
        fig.add_trace(
            go.Scatter(
                x=pts,
                y=np.asarray(fit.steps) * (pts if col == 2 else 1),
                mode="markers",
                marker=dict(size=10, color="#d95f02"),
                name="best LR per batch",
                showlegend=col == 1,
            ),
            row=1,
            col=col,
        )
        if measured:
            tried = [r for r in measured if r.get("steps")]
            fig.add_trace(
                go.Scatter(
                    x=[r["global_batch"] for r in tried],
                    y=[r["steps"] * (r["global_batch"] if col == 2 else 1) for r in tried],
                    mode="markers",
                    marker=dict(size=6, color="#7570b3", symbol="x"),
                    name="every LR tried",
                    showlegend=col == 1,
                    text=[f"lr {r['lr']:g}" for r in tried],
                ),
                row=1,
                col=col,
            )
        fig.add_vline(x=fit.b_crit, line=dict(color="grey", dash="dash"), row=1, col=col)
        fig.update_xaxes(type="log", title_text="global batch", row=1, col=col)
        fig.update_yaxes(type="log", row=1, col=col)
    fig.update_layout(height=380, margin=dict(t=60, b=50, l=60, r=20))
    return fig


def steps_samples_figure(fit: CriticalBatchFit) -> go.Figure:
    """Steps (y) against samples (x) to target, both log: the fitted trade-off curve
    (S/S_min − 1)(E/E_min − 1) = 1 traced over the batch, the best-LR points labelled with their
    batch, the two limits S_min and E_min dotted, and B_crit's point (2 E_min, 2 S_min)."""
    lo, hi = min(fit.batches) / 4, max(fit.batches) * 8
    b = np.geomspace(lo, hi, 120)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=fit.predict_samples(b),
            y=fit.predict_steps(b),
            mode="lines",
            line=dict(color="#1b9e77"),
            name="fit: (S/S_min − 1)(E/E_min − 1) = 1",
        )
    )
    pts = np.asarray(fit.batches)
    fig.add_trace(
        go.Scatter(
            x=pts * np.asarray(fit.steps),
            y=np.asarray(fit.steps),
            mode="markers+text",
            marker=dict(size=10, color="#d95f02"),
            text=[f"B={int(p):,}" for p in pts],
            textposition="top right",
            name="best LR per batch",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[2 * fit.e_min],
            y=[2 * fit.s_min],
            mode="markers",
            marker=dict(size=14, color="grey", symbol="diamond-open"),
            name=f"B_crit ≈ {fit.b_crit:,.0f}: twice the fewest steps and samples",
        )
    )
    fig.add_hline(y=fit.s_min, line=dict(color="grey", dash="dot"))
    fig.add_vline(x=fit.e_min, line=dict(color="grey", dash="dot"))
    fig.update_xaxes(type="log", title_text="samples to target (E = B × S)")
    fig.update_yaxes(type="log", title_text="optimizer steps to target (S)")
    fig.update_layout(
        height=420,
        title="Steps vs samples: small batches save samples, large batches save steps",
        margin=dict(t=60, b=50, l=70, r=20),
    )
    return fig


__all__ = ["pareto_figure", "critical_batch_figure", "steps_samples_figure"]

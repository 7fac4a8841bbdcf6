"""Sweep charts against the global batch: final accuracy, and steps/time to a target accuracy.

* :func:`accuracy_vs_batch` — final validation accuracy vs global batch, one line per LR rule.
* :func:`steps_to_target_chart` — steps and time to a target accuracy vs global batch on log-log
  axes, with the perfect-scaling 1/B line. Shallue et al. 2018 ("Measuring the Effects of Data
  Parallelism on Neural Network Training", arXiv:1811.03600) find three regimes: perfect scaling
  (on the 1/B line), diminishing returns (bending away), maximal data parallelism (flat).

Runs may be given as Runs, RunRecords or run folder paths. Static plotly figures, no widgets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpclab.views.charts.facts import RunFacts, facts_of, text
from hpclab.views.charts.outcomes import (
    default_target,
    evaluations,
    failed,
    final_val_accuracy,
    steps_done,
    steps_to_target,
    time_done,
    time_to_target,
)
from hpclab.views.charts.skeleton import RUN_COLORS


def _rule(config: dict) -> str:
    opt = config.get("optimizer")
    return opt if opt in ("lars", "lamb", "adam") else str(config.get("lr_scaling", "?"))


def series_names(runs: list[RunFacts]) -> list[str]:
    """One series per LR rule / optimizer; warm-up, optimizer and precision are added to the
    name only when they differ across the runs."""
    parts = [
        (
            _rule(f.config),
            str(f.config.get("optimizer", "")),
            f"warm-up {f.config.get('warmup_epochs', 0):g}"
            if isinstance(f.config.get("warmup_epochs"), (int, float))
            else "",
            str(f.config.get("precision", "")),
        )
        for f in runs
    ]
    varies = [len({p[i] for p in parts}) > 1 for i in range(4)]
    names = []
    for p in parts:
        extra = [p[i] for i in (1, 2, 3) if varies[i] and p[i] and not (i == 1 and p[0] == p[1])]
        names.append(" · ".join([p[0], *extra]))
    return names


def _batch_axis(batches: Iterable[int]) -> dict:
    vals = sorted({int(b) for b in batches if b})
    return dict(
        type="log",
        tickvals=vals,
        ticktext=[f"{b:,}" for b in vals],
        title_text="global batch (samples per step)",
    )


def accuracy_vs_batch(records: Iterable[Any]) -> go.Figure:
    """Final validation accuracy vs global batch (log x), one line per LR rule / optimizer.

    Diverged and failed runs are drawn as crosses, not dropped.
    """
    runs = [f for f in facts_of(records) if f.global_batch]
    names = series_names(runs)
    fig = go.Figure()
    for i, series in enumerate(dict.fromkeys(names)):
        members = sorted(
            (f for f, n in zip(runs, names) if n == series), key=lambda f: f.global_batch
        )
        color = RUN_COLORS[i % len(RUN_COLORS)]
        accs = [final_val_accuracy(f) for f in members]
        fig.add_trace(
            go.Scatter(
                x=[f.global_batch for f in members],
                y=[a if a is not None else np.nan for a in accs],
                mode="lines+markers",
                name=text(series),
                line=dict(color=color),
                marker=dict(
                    size=10, color=color, symbol=["x" if failed(f) else "circle" for f in members]
                ),
                text=[f"{text(f.label)} ({text(f.status)})" for f in members],
                hovertemplate="%{text}<br>batch %{x}<br>val accuracy %{y:.3f}<extra></extra>",
            )
        )
        for f, a in zip(members, accs):
            if a is None:
                fig.add_annotation(
                    x=math.log10(f.global_batch),
                    y=0.02,
                    text=f"{text(f.status)}: no accuracy",
                    showarrow=False,
                    font=dict(size=10, color=color),
                )
    fig.update_layout(
        template="plotly_white",
        height=420,
        title=dict(text="Final validation accuracy vs global batch"),
        xaxis=_batch_axis(f.global_batch for f in runs),
        yaxis=dict(title_text="final validation accuracy", range=[0, 1.02]),
        margin=dict(l=60, r=20, t=60, b=50),
    )
    return fig


def ideal_inverse_batch(
    anchor_batch: float, anchor_value: float, batches: Iterable[float]
) -> list[float]:
    """Perfect scaling: value(B) = value(B0) · B0 / B (twice the batch, half the steps)."""
    return [anchor_value * anchor_batch / b for b in batches]


def _bounds(runs: list[RunFacts], target: float | None) -> list[tuple]:
    """(run, steps, seconds): to the target when reached, else what the run did (lower bound)."""
    out = []
    for f in runs:
        s = steps_to_target(evaluations(f), target) if target is not None else None
        t = time_to_target(evaluations(f), target) if target is not None else None
        out.append((f, s, t) if s is not None else (f, steps_done(f), time_done(f)))
    return out


def steps_to_target_chart(records: Iterable[Any], target: float | None = None) -> go.Figure:
    """Steps and wall time to reach `target` validation accuracy vs global batch, log-log.

    The dotted line is perfect scaling, 1/B, anchored at the smallest batch that reached the
    target (Shallue et al. 2018, arXiv:1811.03600). Runs that never reached the target are drawn
    as open triangles at the steps/time they ran (a lower bound) and labelled, never dropped.
    """
    runs = [f for f in facts_of(records) if f.global_batch]
    if target is None:
        target = default_target(runs)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("steps to target", "time to target (s)"))
    names = series_names(runs)
    reached_all = []
    # a run with no step/time record at all is still shown, at the top of its panel
    top = {p: max([r[p] for r in _bounds(runs, target) if r[p]] or [1.0]) for p in (1, 2)}
    for i, series in enumerate(dict.fromkeys(names)):
        color = RUN_COLORS[i % len(RUN_COLORS)]
        members = sorted(
            (f for f, n in zip(runs, names) if n == series), key=lambda f: f.global_batch
        )
        got = (
            [
                (f, steps_to_target(evaluations(f), target), time_to_target(evaluations(f), target))
                for f in members
            ]
            if target is not None
            else [(f, None, None) for f in members]
        )
        reached = [(f, s, t) for f, s, t in got if s is not None]
        missed = [(f, steps_done(f), time_done(f)) for f, s, t in got if s is None]
        missed = [(f, s or top[1], t or top[2]) for f, s, t in missed]
        reached_all += reached
        for col, pick in ((1, 1), (2, 2)):
            fig.add_trace(
                go.Scatter(
                    x=[r[0].global_batch for r in reached],
                    y=[r[pick] for r in reached],
                    mode="lines+markers",
                    name=text(series),
                    legendgroup=f"s{i}",
                    showlegend=col == 1,
                    line=dict(color=color),
                    marker=dict(size=9, color=color),
                    text=[text(r[0].label) for r in reached],
                    hovertemplate="%{text}<br>batch %{x}<br>%{y:,.4g}<extra></extra>",
                ),
                row=1,
                col=col,
            )
            fig.add_trace(
                go.Scatter(
                    x=[m[0].global_batch for m in missed],
                    y=[m[pick] for m in missed],
                    mode="markers+text",
                    name=f"{text(series)}: target not reached",
                    legendgroup=f"s{i}",
                    showlegend=bool(missed) and col == 1,
                    marker=dict(
                        size=11, color=color, symbol="triangle-up-open", line=dict(width=2)
                    ),
                    text=["not reached" for _ in missed],
                    textposition="top center",
                    textfont=dict(size=10, color=color),
                    customdata=[text(m[0].label) for m in missed],
                    hovertemplate="%{customdata}<br>batch %{x}<br>never reached the target; "
                    "ran %{y:,.4g}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    batches = sorted({f.global_batch for f in runs})
    if reached_all:
        anchor = min(reached_all, key=lambda r: (r[0].global_batch, r[1]))
        b0 = anchor[0].global_batch
        xs = [b for b in batches if b >= b0]
        for col, pick in ((1, 1), (2, 2)):
            if anchor[pick] is None:
                continue
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ideal_inverse_batch(b0, anchor[pick], xs),
                    mode="lines",
                    name="ideal 1/B (perfect scaling)",
                    legendgroup="ideal",
                    showlegend=col == 1,
                    line=dict(dash="dot", color="#888"),
                ),
                row=1,
                col=col,
            )
    elif runs:
        fig.add_annotation(
            text="no run reached the target",
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
            font=dict(size=14, color="#a00"),
        )
    title = (
        "Steps and time to target vs global batch"
        if target is None
        else f"Steps and time to validation accuracy ≥ {target:.3g} vs global batch"
    )
    fig.update_layout(
        template="plotly_white",
        height=460,
        margin=dict(l=60, r=20, t=90, b=50),
        title=dict(
            text=title,
            subtitle=dict(
                text=(
                    "On the dotted line: perfect scaling. Bending away: diminishing returns. Flat: "
                    "maximal data parallelism (Shallue et al. 2018)."
                )
            ),
        ),
    )
    for col in (1, 2):
        fig.update_xaxes(**_batch_axis(batches), row=1, col=col)
        fig.update_yaxes(type="log", row=1, col=col)
    fig.update_yaxes(title_text="optimizer steps", row=1, col=1)
    fig.update_yaxes(title_text="seconds", row=1, col=2)
    return fig

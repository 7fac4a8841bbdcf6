"""The learning-rate window: final validation accuracy vs peak LR at one global batch, per optimizer.

A large batch tolerates only a band of peak learning rates: below it the run under-trains, above
it the loss diverges or collapses to chance (Goyal et al. 2017, arXiv:1706.02677, sec. 5; You et
al. 2017, arXiv:1708.03888, sec. 4 motivate LARS by exactly this instability). Sweeping the peak LR
per optimizer at one batch shows the band's width: runs tagged ``lr-window``
(:data:`hpclab.views.charts.lessons.WINDOW_TAG`). Diverged and collapsed runs are drawn as crosses at
their final accuracy (at chance) or at 0 when they have none.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go

from hpclab.views.charts.facts import facts_of, text
from hpclab.views.charts.lessons import FAILED, optimizer_name, peak_lr
from hpclab.views.charts.outcomes import final_val_accuracy
from hpclab.views.charts.skeleton import RUN_COLORS


def lr_window_chart(records: Iterable[Any]) -> go.Figure:
    """Final validation accuracy vs peak learning rate (log x), one line per optimizer × batch."""
    runs = [f for f in facts_of(records) if peak_lr(f) and f.global_batch]
    groups: dict[str, list] = {}
    for f in sorted(runs, key=peak_lr):
        groups.setdefault(f"{optimizer_name(f)} · batch {f.global_batch:,}", []).append(f)
    fig = go.Figure()
    for i, (name, members) in enumerate(groups.items()):
        color = RUN_COLORS[i % len(RUN_COLORS)]
        accs = [final_val_accuracy(f) for f in members]
        fig.add_trace(
            go.Scatter(
                x=[peak_lr(f) for f in members],
                y=[a if a is not None else 0.0 for a in accs],
                mode="lines+markers",
                name=text(name),
                line=dict(color=color),
                marker=dict(
                    size=11,
                    color=color,
                    symbol=["x" if f.status in FAILED else "circle" for f in members],
                ),
                text=[f"{text(f.label)} ({text(f.status)})" for f in members],
                hovertemplate="%{text}<br>peak lr %{x:.4g}<br>val accuracy %{y:.3f}<extra></extra>",
            )
        )
    lrs = sorted({peak_lr(f) for f in runs})
    fig.update_layout(
        template="plotly_white",
        height=420,
        title=dict(text="The learning-rate window: final validation accuracy vs peak LR"),
        xaxis=dict(
            type="log",
            title_text="peak learning rate (after warm-up)",
            tickvals=lrs,
            ticktext=[f"{v:.3g}" for v in lrs],
        ),
        yaxis=dict(
            title_text="final validation accuracy (× = diverged or collapsed)", range=[0, 1.02]
        ),
        margin=dict(l=60, r=20, t=60, b=50),
        legend=dict(orientation="h", y=-0.2),
    )
    if not runs:
        fig.add_annotation(text="no runs with a peak LR", showarrow=False, x=0.5, y=0.5)
    return fig


__all__ = ["lr_window_chart"]

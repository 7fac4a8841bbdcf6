"""The scaling ablation's chart (hpclab.studies.scaling_ablation): per pass, one bar of height 1
split into E(2) and the E points each cost lost — the parts add up to 1 - E by construction, so
the bar shows at a glance which part is largest; the passes side by side show how far a repeat
moves each part."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from hpclab.views.charts.skeleton import RUN_COLORS


def figure(table: pd.DataFrame) -> go.Figure:
    """Stacked bars from :func:`hpclab.studies.scaling_ablation.table` (its ``E`` and
    ``<part> loss`` columns; the spread row is left out: it is the yardstick, not a pass)."""
    rows = table[table["pass"] != "spread"] if len(table) else table
    fig = go.Figure()
    if rows.empty:
        fig.update_layout(title="scaling ablation: no complete pass yet")
        return fig
    names = [f"pass {p}" for p in rows["pass"]]
    fig.add_bar(x=names, y=rows["E"], name="E(2) kept", marker_color="#4c9a2a")
    losses = [c for c in rows.columns if c.endswith(" loss")]
    for i, col in enumerate(losses):
        fig.add_bar(x=names, y=rows[col], name=col, marker_color=RUN_COLORS[i % len(RUN_COLORS)])
    fig.update_layout(
        barmode="relative",
        title="where weak scaling's E(2) went: E kept + the parts lost (they add up to 1)",
        yaxis_title="share of ideal 2-rank throughput",
        height=380,
    )
    return fig

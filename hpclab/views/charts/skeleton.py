"""The dashboard's six-panel figure before any run is drawn: grid, axis titles, notes, colours.

Both the live widget (:class:`hpclab.views.panel.live.Dashboard`, a ``go.FigureWidget``) and the static
report figure (:func:`hpclab.views.charts.traces.figure`, a ``go.Figure``) start from :func:`skeleton`, so
they look the same. The colour tables are shared by every chart in :mod:`hpclab.views`.

plotly only: the widget class is passed in by the caller, never imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpclab.core.catalog import RATE_WINDOW_S
from hpclab.views.charts.facts import X_AXES, text

# panel → (x axis, y axis) of the subplot grid built by skeleton() (row-major cell order)
PANELS = ("throughput", "loss", "accuracy", "lr", "noise", "split")
AXES = {
    "throughput": ("x", "y"),
    "loss": ("x2", "y2"),
    "accuracy": ("x3", "y3"),
    "lr": ("x4", "y4"),
    "noise": ("x5", "y5"),
    "split": ("x6", "y6"),
}
TIMELINE = PANELS[:5]  # the panels drawn against the x axis switch (split is per rank)
#: one legend per panel, drawn inside its top-right corner (plotly's legend, legend2, …)
LEGENDS = {
    "throughput": "legend",
    "loss": "legend2",
    "accuracy": "legend3",
    "lr": "legend4",
    "noise": "legend5",
    "split": "legend6",
}
#: each panel's title: what it shows and its unit; :func:`titles` adds the x axis ("… vs step")
TITLES = (
    f"throughput (samples/s over ≥ {RATE_WINDOW_S:g} s)",
    "loss (cross-entropy)",
    "accuracy (fraction correct)",
    "learning rate",
    "gradient noise scale B_simple and the global batch (samples)",
    f"where a step's time goes, per rank (ms per step over ≥ {RATE_WINDOW_S:g} s)",
)
Y_TITLES = ("samples/s", "loss", "accuracy", "learning rate", "samples", "")
SPLIT_X_TITLE = "ms per step"

# colours: the current run's metrics, its ranks, and one colour per other run
COLORS = {
    "global": "#222222",
    "ideal": "#8c8c8c",
    "train": "#1f77b4",
    "val": "#d62728",
    "lr": "#2ca02c",
    "noise": "#9467bd",
    "batch": "#8c8c8c",
}
RANK_COLORS = (
    "rgb(102,194,165)",
    "rgb(252,141,98)",
    "rgb(141,160,203)",
    "rgb(231,138,195)",
    "rgb(166,216,84)",
    "rgb(255,217,47)",
    "rgb(229,196,148)",
    "rgb(179,179,179)",
)
#: per-rank throughput lines coincide while ranks run in lockstep: a dash pattern each keeps
#: every rank visible on top of the others (a straggler's line then leaves the bundle)
RANK_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
RUN_COLORS = (
    "rgb(27,158,119)",
    "rgb(217,95,2)",
    "rgb(117,112,179)",
    "rgb(231,41,138)",
    "rgb(102,166,30)",
    "rgb(230,171,2)",
    "rgb(166,118,29)",
    "rgb(102,102,102)",
)


@dataclass
class TraceSpec:
    """One trace on one panel: a stable key, the data, plotly properties (name, style...), and
    its kind: a line (``go.Scatter``) or a bar (``go.Bar``, the split panel's stacks)."""

    key: str
    panel: str
    x: np.ndarray
    y: np.ndarray
    props: dict = field(default_factory=dict)
    kind: str = "scatter"

    def trace(self) -> go.Scatter | go.Bar:
        xaxis, yaxis = AXES[self.panel]
        cls = go.Bar if self.kind == "bar" else go.Scatter
        return cls(
            x=self.x, y=self.y, xaxis=xaxis, yaxis=yaxis, legend=LEGENDS[self.panel], **self.props
        )


def skeleton(cls: type, title: str, x: str) -> go.Figure:
    """An empty six-panel figure of class `cls` (go.Figure or go.FigureWidget), x axis `x`."""
    base = make_subplots(
        rows=3,
        cols=2,
        specs=[[{}, {}], [{}, {}], [{}, {}]],
        subplot_titles=titles(x),
        vertical_spacing=0.1,
        horizontal_spacing=0.09,
    )
    for panel, ann in zip(PANELS, base.layout.annotations):  # make_subplots' titles, in order
        ann.name = f"title:{panel}"
    fig = base if cls is go.Figure else cls(base)
    fig.update_layout(
        title=dict(text=text(title)) if title else None,
        height=860,
        autosize=True,  # as wide as the notebook cell or the page, and follows it
        template="plotly_white",
        margin=dict(l=60, r=20, t=80 if title else 50, b=50),
        barmode="stack",  # the split panel: one stack of parts per rank
    )
    for panel, legend in LEGENDS.items():  # each chart names its own lines, inside a corner
        xa, ya = AXES[panel]
        x_dom = fig.layout[xa.replace("x", "xaxis")].domain
        y_dom = fig.layout[ya.replace("y", "yaxis")].domain
        low = panel == "accuracy"  # accuracy climbs to the top: its legend sits low
        fig.layout[legend] = dict(
            x=x_dom[1],
            y=y_dom[0] if low else y_dom[1],
            xanchor="right",
            yanchor="bottom" if low else "top",
            orientation="v",
            groupclick="togglegroup",
            font=dict(size=10),
            bgcolor="rgba(255,255,255,0.75)",
        )
    for i, panel in enumerate(PANELS):
        xa, ya = AXES[panel]
        fig.layout[xa.replace("x", "xaxis")].title = X_AXES[x] if panel in TIMELINE else ""
        fig.layout[ya.replace("y", "yaxis")].title = Y_TITLES[i]
    fig.layout.xaxis6.title = SPLIT_X_TITLE
    fig.layout.yaxis6.autorange = "reversed"  # rank 0 on top
    fig.layout.yaxis3.range = [0, 1.02]
    fig.layout.yaxis.rangemode = "tozero"  # throughput: scale differences read honestly
    for name, (xa, ya), where in (
        ("ideal_note", AXES["throughput"], (0.01, 0.99)),
        ("noise_note", AXES["noise"], (0.01, 0.99)),
        ("pop_note", AXES["split"], (0.01, 1.0)),
    ):
        fig.add_annotation(
            name=name,
            text="",
            showarrow=False,
            xref=f"{xa} domain",
            yref=f"{ya} domain",
            x=where[0],
            y=where[1],
            xanchor="left",
            yanchor="top",
            font=dict(size=11, color="#555"),
            align="left",
        )
    return fig


def set_notes(fig: go.Figure, texts: dict[str, str]) -> None:
    """Fill the named in-panel notes ('ideal_note', 'noise_note') with escaped text."""
    for ann in fig.layout.annotations:
        if ann.name in texts:
            ann.text = text(texts[ann.name])


def titles(x: str) -> tuple[str, ...]:
    """The panels' titles for x axis `x`: each says its unit and what it is drawn against."""
    return tuple(
        f"{title} vs {X_AXES[x]}" if panel in TIMELINE else title
        for panel, title in zip(PANELS, TITLES)
    )


def set_x_titles(fig: go.Figure, x: str) -> None:
    """Name x axis `x` on every panel, in the axis titles and the panel titles."""
    for panel in TIMELINE:
        fig.layout[AXES[panel][0].replace("x", "xaxis")].title.text = X_AXES[x]
    by_name = dict(zip(PANELS, titles(x)))
    for ann in fig.layout.annotations:
        if ann.name and ann.name.startswith("title:"):
            ann.text = by_name[ann.name.removeprefix("title:")]

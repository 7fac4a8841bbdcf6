"""Compare recorded runs side by side: :func:`compare` → a :class:`Comparison` (table + figure).

The table has one row per run (batch, LR rule, precision, peak LR, final accuracy, throughput,
wall time, steps and time to a target accuracy); the figure overlays validation accuracy vs epoch
and vs samples seen, with throughput bars. Runs may be given as Runs, RunRecords or run folder
paths. Static plotly only, no widgets; nothing here imports TensorFlow.

The per-run numbers live in :mod:`hpclab.views.charts.outcomes`, the sweep charts in
:mod:`hpclab.views.charts.batch_charts` and :mod:`hpclab.views.charts.scaling_charts`; this
module re-exports them because it is the notebooks' one import for comparing runs
(``from hpclab.views.charts.comparison import compare, steps_to_target_chart``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpclab.views.charts.batch_charts import (
    accuracy_vs_batch,
    ideal_inverse_batch,
    series_names,
    steps_to_target_chart,
)
from hpclab.views.charts.facts import RunFacts, as_run, column, facts_of, text
from hpclab.views.charts.outcomes import (
    TARGET_FRACTION,
    default_target,
    describe_target,
    evaluations,
    final_val_accuracy,
    finite,
    steps_to_target,
    throughput,
    time_done,
    time_to_target,
)
from hpclab.views.charts.scaling_charts import (
    batch_effect,
    pop_factors,
    scaling_efficiency,
    scaling_series,
)
from hpclab.views.charts.skeleton import RUN_COLORS

__all__ = [
    "Comparison",
    "compare",
    "table_html",
    # re-exported (see the module docstring)
    "TARGET_FRACTION",
    "accuracy_vs_batch",
    "as_run",
    "batch_effect",
    "default_target",
    "describe_target",
    "facts_of",
    "final_val_accuracy",
    "ideal_inverse_batch",
    "pop_factors",
    "scaling_efficiency",
    "scaling_series",
    "series_names",
    "steps_to_target",
    "steps_to_target_chart",
    "throughput",
    "time_to_target",
]


def _unique_labels(runs: list[RunFacts]) -> list[str]:
    labels = [f.label for f in runs]
    return [
        f"{lab} [{f.run_id[-6:] or i}]" if labels.count(lab) > 1 else lab
        for i, (lab, f) in enumerate(zip(labels, runs))
    ]


@dataclass
class Comparison:
    """Several runs side by side: ``table`` (one row per run), ``figure()``, HTML repr."""

    runs: list[RunFacts]
    target: float | None
    table: pd.DataFrame = field(repr=False)

    def to_csv(self, path=None):
        """The comparison table (one row per run) as CSV text, or written to `path`."""
        from hpclab.records.export import frame_csv

        return frame_csv(self.table, path)

    def figure(self) -> go.Figure:
        """Validation accuracy vs epoch and vs samples seen (overlaid), and throughput bars."""
        fig = make_subplots(
            rows=1,
            cols=3,
            column_widths=[0.36, 0.36, 0.28],
            subplot_titles=(
                "validation accuracy vs epoch",
                "validation accuracy vs samples seen",
                "throughput (samples/s)",
            ),
        )
        names = _unique_labels(self.runs)
        for i, (f, name) in enumerate(zip(self.runs, names)):
            color = RUN_COLORS[i % len(RUN_COLORS)]
            e = f.epochs
            acc = column(e, "val_accuracy")
            samples = (
                column(e, "samples")
                if "samples" in e.columns
                else column(e, "step") * (f.global_batch or np.nan)
            )
            common = dict(
                mode="lines+markers",
                legendgroup=f"run{i}",
                line=dict(color=color),
                marker=dict(color=color, size=6),
            )
            fig.add_trace(
                go.Scatter(x=column(e, "epoch"), y=acc, name=text(name), **common), row=1, col=1
            )
            fig.add_trace(
                go.Scatter(x=samples, y=acc, name=text(name), showlegend=False, **common),
                row=1,
                col=2,
            )
            mean, ci = throughput(f)
            fig.add_trace(
                go.Bar(
                    x=[text(name)],
                    y=[mean if mean is not None else np.nan],
                    error_y=dict(type="data", array=[ci or 0.0], visible=ci is not None),
                    marker_color=color,
                    name=text(name),
                    legendgroup=f"run{i}",
                    showlegend=False,
                ),
                row=1,
                col=3,
            )
        if self.target is not None:
            for c in (1, 2):
                fig.add_hline(
                    y=self.target,
                    line=dict(dash="dot", color="#888", width=1),
                    annotation_text=f"target {self.target:.3g}",
                    row=1,
                    col=c,
                )
        fig.update_xaxes(title_text="epoch", row=1, col=1)
        fig.update_xaxes(title_text="samples seen", row=1, col=2)
        fig.update_xaxes(tickangle=-30, row=1, col=3)
        fig.update_yaxes(title_text="validation accuracy", range=[0, 1.02], row=1, col=1)
        fig.update_yaxes(range=[0, 1.02], row=1, col=2)
        fig.update_yaxes(title_text="samples/s", row=1, col=3)
        fig.update_layout(
            template="plotly_white",
            height=440,
            margin=dict(l=60, r=20, t=60, b=80),
            legend=dict(orientation="h", y=-0.25),
        )
        return fig

    def _repr_html_(self) -> str:
        return (
            f"<div><p>{text(describe_target(self.target, self.runs))}</p>"
            f"{table_html(self.table)}</div>"
        )


def table_html(table: pd.DataFrame) -> str:
    """The comparison table as HTML, every cell escaped."""

    def fmt(v: Any) -> str:
        if v is None or v is pd.NA or (isinstance(v, float) and not math.isfinite(v)):
            return "—"
        if isinstance(v, float):
            return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return str(v)

    return table.to_html(
        index=False,
        escape=True,
        na_rep="—",
        formatters={c: fmt for c in table.columns},
        classes="hpclab-table",
        border=0,
    )


#: POP's efficiencies over the whole run (summary "time_split"; hpclab.core.pop), and the share of the
#: step spent producing batches (the input lesson); None for old records
POP_COLUMNS = ("load_balance", "comm_efficiency", "parallel_efficiency", "input_share")


def compare(runs: Iterable[Any], target: float | None = None) -> Comparison:
    """Compare runs (Runs, RunRecords or run folder paths).

    `target`: validation accuracy for the steps/time-to-target columns; default 90 % of the best
    final validation accuracy among the runs (see :func:`default_target`).
    """
    facts = facts_of(runs)
    if target is None:
        target = default_target(facts)
    rows = []
    for f in facts:
        mean, _ = throughput(f)
        peak_lr = f.derived.get("peak_lr", f.summary.get("lr"))
        split = f.summary.get("time_split") or {}
        rows.append(
            {
                "run_id": f.run_id,
                "label": f.label,
                "status": f.status,
                "workers": f.workers,
                "global_batch": f.global_batch,
                "optimizer": f.config.get("optimizer"),
                "lr_scaling": f.config.get("lr_scaling"),
                "precision": f.config.get("precision"),
                "peak_lr": finite(peak_lr),
                "val_accuracy": final_val_accuracy(f),
                "samples_per_sec": mean,
                "overall_samples_per_sec": finite(f.summary.get("overall_samples_per_sec")),
                **{k: finite(split.get(k)) for k in POP_COLUMNS},
                "wall_time_s": finite(f.summary.get("wall_time_s")) or time_done(f),
                "steps_to_target": steps_to_target(evaluations(f), target)
                if target is not None
                else None,
                "time_to_target_s": time_to_target(evaluations(f), target)
                if target is not None
                else None,
            }
        )
        spe = f.derived.get("steps_per_epoch")
        reached = rows[-1]["steps_to_target"]
        rows[-1]["epochs_to_target"] = reached / spe if reached is not None and spe else None
    columns = [
        "run_id",
        "label",
        "status",
        "workers",
        "global_batch",
        "optimizer",
        "lr_scaling",
        "precision",
        "peak_lr",
        "val_accuracy",
        "samples_per_sec",
        "overall_samples_per_sec",
        *POP_COLUMNS,
        "wall_time_s",
        "steps_to_target",
        "epochs_to_target",
        "time_to_target_s",
    ]
    table = pd.DataFrame(rows, columns=columns)
    # never reached → <NA> / NaN (pandas' missing values), so the columns still sort and plot
    table["steps_to_target"] = pd.array([r["steps_to_target"] for r in rows], dtype="Int64")
    for name in ("epochs_to_target", "time_to_target_s"):
        table[name] = pd.array([r[name] for r in rows], dtype="Float64")
    return Comparison(runs=facts, target=target, table=table)

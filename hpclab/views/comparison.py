"""Compare recorded runs, and the sweep summary charts that make the batch-size lessons visible.

* :func:`compare` — a table (one row per run) and overlaid curves.
* :func:`accuracy_vs_batch` — final validation accuracy vs global batch, one line per LR rule.
* :func:`steps_to_target_chart` — steps and time to a target accuracy vs global batch on log-log
  axes, with the perfect-scaling 1/B line. Shallue et al. 2018 ("Measuring the Effects of Data
  Parallelism on Neural Network Training", arXiv:1811.03600) find three regimes: perfect scaling
  (on the 1/B line), diminishing returns (bending away), maximal data parallelism (flat).
* :func:`scaling_efficiency` — throughput and E(N) = T_N / (N · T_1) vs workers, weak scaling
  (fixed per-worker batch) and strong scaling (fixed global batch) drawn apart.
* :func:`steps_to_target` / :func:`time_to_target` — pure functions on an epochs DataFrame.

Runs may be given as Runs, RunRecords or run folder paths. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpclab.metrics import efficiency, throughput_stats
from hpclab.runs import RunRecord, load_run
from hpclab.views.live import RUN_COLORS, RunFacts, column, run_facts, text

TARGET_FRACTION = 0.9  # default target: 90 % of the best final validation accuracy


# ---------------------------------------------------------------------------------------------
# pure functions on one run
# ---------------------------------------------------------------------------------------------


def _first_reaching(epochs: pd.DataFrame, target: float) -> int | None:
    acc = column(epochs, "val_accuracy")
    hits = np.flatnonzero(np.isfinite(acc) & (acc >= target))
    return int(hits[0]) if hits.size else None


def steps_to_target(epochs: pd.DataFrame, target: float) -> int | None:
    """Optimizer steps at the first epoch row whose val_accuracy ≥ target; None if never."""
    i = _first_reaching(epochs, target)
    if i is None:
        return None
    step = column(epochs, "step")[i]
    return int(step) if math.isfinite(step) else None


def time_to_target(epochs: pd.DataFrame, target: float) -> float | None:
    """Training wall time (s) at the first epoch row whose val_accuracy ≥ target; None if never."""
    i = _first_reaching(epochs, target)
    if i is None:
        return None
    t = column(epochs, "time_s")[i]
    return float(t) if math.isfinite(t) else None


def as_run(run: Any) -> Any:
    """A run folder path → its RunRecord; a live Run → its snapshot; anything else unchanged."""
    if isinstance(run, (str, os.PathLike)):
        return load_run(run)
    if isinstance(run, (RunRecord, RunFacts)):
        return run
    snapshot = getattr(run, "record", None)
    return snapshot() if callable(snapshot) else run


def facts_of(runs: Iterable[Any]) -> list[RunFacts]:
    if isinstance(runs, (str, os.PathLike)) or hasattr(runs, "history"):
        runs = [runs]
    return [run_facts(as_run(r)) for r in runs]


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def final_val_accuracy(f: RunFacts) -> float | None:
    """The summary's val_accuracy, else the last epoch row's (a run still going)."""
    v = _finite(f.summary.get("val_accuracy"))
    if v is None:
        acc = column(f.epochs, "val_accuracy")
        acc = acc[np.isfinite(acc)]
        v = float(acc[-1]) if acc.size else None
    return v


def throughput(f: RunFacts) -> tuple[float | None, float | None]:
    """(global samples/s, ±95 % half-width): the summary's, else from the history rows."""
    mean, ci = (
        _finite(f.summary.get("samples_per_sec")),
        _finite(f.summary.get("samples_per_sec_ci95")),
    )
    if mean is None:
        stats = throughput_stats(column(f.history, "samples_per_sec"))
        mean, ci = _finite(stats.mean), _finite(stats.ci95)
    return mean, ci


def _steps_done(f: RunFacts) -> float | None:
    candidates = [
        _finite(f.summary.get("steps")),
        *(
            _finite(np.nanmax(c)) if np.isfinite(c).any() else None
            for c in (column(f.history, "step"), column(f.epochs, "step"))
        ),
    ]
    found = [c for c in candidates if c]
    return max(found) if found else None


def _time_done(f: RunFacts) -> float | None:
    candidates = [
        _finite(np.nanmax(c)) if np.isfinite(c).any() else None
        for c in (column(f.history, "time_s"), column(f.epochs, "time_s"))
    ]
    found = [c for c in candidates if c] or [
        c for c in [_finite(f.summary.get("train_time_s"))] if c
    ]
    return max(found) if found else None


def default_target(runs: Iterable[Any]) -> float | None:
    """90 % of the best final validation accuracy, rounded down to 2 decimals (None if no run
    has one)."""
    accs = [a for a in (final_val_accuracy(f) for f in facts_of(runs)) if a is not None]
    if not accs:
        return None
    return math.floor(TARGET_FRACTION * max(accs) * 100 + 1e-9) / 100


def describe_target(target: float | None, runs: Iterable[Any] = ()) -> str:
    """A sentence saying which target accuracy is used and where it came from."""
    if target is None:
        return "No target accuracy: no run has a validation accuracy yet."
    accs = [a for a in (final_val_accuracy(f) for f in facts_of(runs)) if a is not None]
    if accs and target == default_target(runs):
        return (
            f"Target: validation accuracy ≥ {target:.2f} ({TARGET_FRACTION:.0%} of the best "
            f"final validation accuracy, {max(accs):.3f}, rounded down)."
        )
    return f"Target: validation accuracy ≥ {target:.3g}."


# ---------------------------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------------------------


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
                "peak_lr": _finite(peak_lr),
                "val_accuracy": final_val_accuracy(f),
                "samples_per_sec": mean,
                "wall_time_s": _finite(f.summary.get("wall_time_s")) or _time_done(f),
                "steps_to_target": steps_to_target(f.epochs, target)
                if target is not None
                else None,
                "time_to_target_s": time_to_target(f.epochs, target)
                if target is not None
                else None,
            }
        )
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
        "wall_time_s",
        "steps_to_target",
        "time_to_target_s",
    ]
    table = pd.DataFrame(rows, columns=columns)
    # never reached → <NA> / NaN (pandas' missing values), so the columns still sort and plot
    table["steps_to_target"] = pd.array([r["steps_to_target"] for r in rows], dtype="Int64")
    table["time_to_target_s"] = pd.array([r["time_to_target_s"] for r in rows], dtype="Float64")
    return Comparison(runs=facts, target=target, table=table)


# ---------------------------------------------------------------------------------------------
# sweep summaries
# ---------------------------------------------------------------------------------------------


def _batch_axis(batches: Iterable[int]) -> dict:
    vals = sorted({int(b) for b in batches if b})
    return dict(
        type="log",
        tickvals=vals,
        ticktext=[f"{b:,}" for b in vals],
        title_text="global batch (samples per step)",
    )


def _failed(f: RunFacts) -> bool:
    return f.status in ("failed", "diverged")


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
                    size=10, color=color, symbol=["x" if _failed(f) else "circle" for f in members]
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
        s = steps_to_target(f.epochs, target) if target is not None else None
        t = time_to_target(f.epochs, target) if target is not None else None
        out.append((f, s, t) if s is not None else (f, _steps_done(f), _time_done(f)))
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
                (f, steps_to_target(f.epochs, target), time_to_target(f.epochs, target))
                for f in members
            ]
            if target is not None
            else [(f, None, None) for f in members]
        )
        reached = [(f, s, t) for f, s, t in got if s is not None]
        missed = [(f, _steps_done(f), _time_done(f)) for f, s, t in got if s is None]
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


# which config fields decide throughput (besides the batch and the worker count)
_THROUGHPUT_KEYS = (
    "dataset",
    "model",
    "image_shape",
    "precision",
    "fp16_allreduce",
    "steps_per_call",
    "threads_per_worker",
    "optimizer",
)


def _freeze(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def scaling_series(records: Iterable[Any]) -> list[dict]:
    """Groups of runs that differ only in worker count.

    Weak scaling: fixed per-worker batch (global batch grows with N). Strong scaling: fixed global
    batch (per-worker batch shrinks). Each series: kind, name, and per worker count N the mean
    throughput T_N and E(N) = T_N / (N · T_1) (hpclab.metrics.efficiency). Without a 1-worker
    run, T_1 is taken as T_m / m for the smallest N = m, and the name says "relative to N=m".
    """
    runs = []
    for f in facts_of(records):
        t, ci = throughput(f)
        if t is not None and t > 0 and f.global_batch and not _failed(f):
            runs.append((f, t, ci))
    out = []
    for kind, batch_of in (
        ("weak", lambda f: f.global_batch // f.workers),
        ("strong", lambda f: f.global_batch),
    ):
        groups: dict = {}
        for f, t, ci in runs:
            key = (tuple(_freeze(f.config.get(k)) for k in _THROUGHPUT_KEYS), batch_of(f))
            groups.setdefault(key, []).append((f, t, ci))
        for (_, batch), members in groups.items():
            ns = sorted({f.workers for f, _, _ in members})
            if len(ns) < 2:
                continue
            tn = {n: float(np.mean([t for f, t, _ in members if f.workers == n])) for n in ns}
            ci = {
                n: next((c for f, _, c in members if f.workers == n), None)
                if sum(f.workers == n for f, _, _ in members) == 1
                else None
                for n in ns
            }
            base = ns[0]
            t1 = tn[base] / base
            name = (
                f"weak scaling, {batch:,} per worker"
                if kind == "weak"
                else f"strong scaling, global batch {batch:,}"
            )
            if base != 1:
                name += f" (E relative to N={base})"
            model = members[0][0].config.get("model")
            if model:
                name = f"{model}: {name}"
            out.append(
                {
                    "kind": kind,
                    "name": name,
                    "workers": ns,
                    "throughput": [tn[n] for n in ns],
                    "ci95": [ci[n] for n in ns],
                    "t1": t1,
                    "efficiency": [efficiency(tn[n], t1, n) for n in ns],
                }
            )
    return out


def scaling_efficiency(records: Iterable[Any]) -> go.Figure:
    """Throughput and scaling efficiency E(N) = T_N / (N·T_1) vs number of workers.

    Weak scaling series (fixed per-worker batch) are solid, strong scaling (fixed global batch)
    dashed; dotted lines are the ideal N·T_1.
    """
    facts = facts_of(records)
    series = scaling_series(facts)
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("throughput (samples/s)", "scaling efficiency E(N) = T_N / (N·T_1)"),
    )
    workers = sorted({f.workers for f in facts})
    for i, s in enumerate(series):
        color = RUN_COLORS[i % len(RUN_COLORS)]
        dash = "solid" if s["kind"] == "weak" else "dash"
        ci = s["ci95"]
        fig.add_trace(
            go.Scatter(
                x=s["workers"],
                y=s["throughput"],
                mode="lines+markers",
                name=text(s["name"]),
                legendgroup=f"s{i}",
                line=dict(color=color, dash=dash),
                marker=dict(size=9),
                error_y=dict(type="data", array=[c or 0.0 for c in ci], visible=any(ci)),
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=s["workers"],
                y=[n * s["t1"] for n in s["workers"]],
                mode="lines",
                name=f"ideal N·T_1 ({text(s['name'])})",
                legendgroup=f"s{i}",
                showlegend=False,
                line=dict(color=color, dash="dot", width=1),
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=s["workers"],
                y=s["efficiency"],
                mode="lines+markers",
                name=text(s["name"]),
                legendgroup=f"s{i}",
                showlegend=False,
                line=dict(color=color, dash=dash),
                marker=dict(size=9),
                hovertemplate="N=%{x}<br>E=%{y:.2f}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    if not series:
        pts = [(f, throughput(f)[0]) for f in facts]
        pts = [(f, t) for f, t in pts if t is not None]
        fig.add_trace(
            go.Scatter(
                x=[f.workers for f, _ in pts],
                y=[t for _, t in pts],
                mode="markers",
                name="runs",
                text=[text(f.label) for f, _ in pts],
                marker=dict(size=9, color="#888"),
            ),
            row=1,
            col=1,
        )
        fig.add_annotation(
            text="E(N) needs runs that differ only in worker count",
            xref="paper",
            yref="paper",
            x=0.8,
            y=0.5,
            showarrow=False,
            font=dict(color="#a00"),
        )
    if workers:
        fig.add_trace(
            go.Scatter(
                x=[min(workers), max(workers)],
                y=[1.0, 1.0],
                mode="lines",
                name="perfect scaling (E = 1)",
                line=dict(dash="dot", color="#888"),
            ),
            row=1,
            col=2,
        )
    for col in (1, 2):
        fig.update_xaxes(title_text="workers (N)", tickvals=workers, row=1, col=col)
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="E(N)", rangemode="tozero", row=1, col=2)
    fig.update_layout(
        template="plotly_white",
        height=440,
        margin=dict(l=60, r=20, t=60, b=50),
        title=dict(
            text="Scaling: solid = weak (fixed per-worker batch), "
            "dashed = strong (fixed global batch)"
        ),
    )
    return fig

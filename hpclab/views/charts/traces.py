"""One run → the traces that draw it; the dashboard's static figure for reports.

:func:`trace_specs` turns one run's DataFrames into :class:`TraceSpec` s (a stable key, the data,
plotly properties) for six panels:

1. throughput — one line per rank, the global figure, and the ideal line N × (1-rank throughput)
   when a single-rank reference is known (:func:`single_rank_reference`);
2. loss — training loss (live rows) and validation loss (one marker per epoch);
3. accuracy — training accuracy (live rows) and validation accuracy (one marker per epoch);
4. learning rate — shows warm-up and the schedule as the run actually used them;
5. gradient noise scale B_simple = tr Σ / |G|² (McCandlish et al. 2018, "An Empirical Model of
   Large-Batch Training", arXiv:1812.06162: their simple estimate of B_noise, which weights Σ
   and G by the Hessian) against the current global batch: batch ≪ B_simple → a bigger
   batch is almost free in steps; batch ≫ B_simple → diminishing returns (:func:`notes`);
6. where a step's time goes, per rank, with POP's efficiencies (:mod:`hpclab.views.charts.split`).

Both the live widget (:class:`hpclab.views.panel.live.Dashboard`) and the static :func:`figure` are
built from these specs, so they always show the same thing. plotly only: no widgets, no threads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import plotly.graph_objects as go

from hpclab.core.metrics import throughput_stats
from hpclab.views.charts import split
from hpclab.views.charts.facts import (
    check_x,
    column,
    ema,
    epoch_x,
    history_x,
    last_finite,
    rank_matrix,
    run_facts,
    span,
    text,
)
from hpclab.views.charts.skeleton import (
    COLORS,
    RANK_COLORS,
    RANK_DASHES,
    RUN_COLORS,
    TraceSpec,
    set_notes,
    skeleton,
)

IDEAL_NOTE = "run with 1 worker to get the ideal line"


MAX_RANK_LINES = 16  # above this, per-rank throughput is a min / median / max band


def _rank_stats(h, ranks: np.ndarray | None) -> dict:
    """Per-row min / median / max of the ranks' throughput: from the per-rank lists, or from
    the row's own ``rank_samples_per_sec_<stat>`` columns (rows of more than RANK_LISTS_MAX
    ranks carry those instead of lists: hpclab.rank.publisher)."""
    if ranks is None:
        return {s: column(h, f"rank_samples_per_sec_{s}") for s in ("min", "max", "median")}
    with np.errstate(all="ignore"):  # a row with no rank figures yet is all-NaN
        return {
            "min": np.nanmin(ranks, axis=1) if ranks.size else np.array([]),
            "max": np.nanmax(ranks, axis=1) if ranks.size else np.array([]),
            "median": np.nanmedian(ranks, axis=1) if ranks.size else np.array([]),
        }


def _rank_band(add, hx, stats: dict, n: int, sm) -> None:
    """Per-rank throughput of many ranks as a band: min and max (filled) and the median."""
    band = dict(width=0.5, color=RANK_COLORS[0])
    add(
        "thr/rank-min",
        "throughput",
        hx,
        sm(stats["min"]),
        name=f"slowest of {n} ranks",
        mode="lines",
        line=band,
    )
    add(
        "thr/rank-max",
        "throughput",
        hx,
        sm(stats["max"]),
        name=f"fastest of {n} ranks",
        mode="lines",
        line=band,
        fill="tonexty",
        fillcolor="rgba(31,119,180,0.15)",
    )
    add(
        "thr/rank-median",
        "throughput",
        hx,
        sm(stats["median"]),
        name="median rank",
        mode="lines",
        line=dict(width=1.5, color=RANK_COLORS[0]),
    )


def trace_specs(
    run_like: Any,
    *,
    x: str = "step",
    smoothing: float = 0.0,
    role: str = "main",
    ideal_single_rank: float | None = None,
    color: str | None = None,
    key_prefix: str = "",
) -> list[TraceSpec]:
    """The traces that draw one run.

    role="main": the run in full detail (per-rank throughput, ideal line, train/val curves,
    LR, noise scale with the global batch as a reference line). role="run" (one of several runs in
    a static figure) and role="overlay" (an earlier run under the live one, dashed and faded)
    draw the run in one colour, without per-rank lines, with legends naming its config.
    Smoothing (EMA) applies to loss, accuracy and throughput; epoch markers are never smoothed.
    """
    check_x(x)
    if role not in ("main", "run", "overlay"):
        raise ValueError(f"role must be 'main', 'run' or 'overlay'; you passed role={role!r}.")
    f = run_facts(run_like)
    h, e = f.history, f.epochs
    hx, ex = history_x(f, x), epoch_x(f, x)
    sm = lambda v: ema(v, smoothing)  # noqa: E731 - a local shorthand

    def sm_rate(v):  # the first row is the first call (graph optimisation): not smoothed into
        v = np.asarray(v, dtype=float)  # the rest (meters.RateWindow keeps it apart likewise)
        return np.concatenate([v[:1], ema(v[1:], smoothing)]) if v.ndim == 1 else v

    specs: list[TraceSpec] = []

    def add(key, panel, xs, ys, **props):
        specs.append(
            TraceSpec(
                key_prefix + key,
                panel,
                np.asarray(xs, dtype=float),
                np.asarray(ys, dtype=float),
                props,
            )
        )

    if role == "main":
        compact = "rank_samples_per_sec_median" in h.columns
        ranks = None if compact else rank_matrix(h, f.workers)
        width = f.workers if ranks is None else ranks.shape[1]
        if width > MAX_RANK_LINES:
            _rank_band(add, hx, _rank_stats(h, ranks), width, sm_rate)
        for r in range(width if width <= MAX_RANK_LINES else 0):
            add(
                f"thr/rank{r}",
                "throughput",
                hx,
                sm_rate(ranks[:, r]),
                name=f"rank {r}",
                mode="lines",
                line=dict(
                    width=2,
                    color=RANK_COLORS[r % len(RANK_COLORS)],
                    dash=RANK_DASHES[r % len(RANK_DASHES)],
                ),
                hovertemplate=f"rank {r}: %{{y:,.0f}} samples/s<extra></extra>",
            )
        add(
            "thr/global",
            "throughput",
            hx,
            sm_rate(column(h, "samples_per_sec")),
            name="global",
            mode="lines",
            line=dict(width=2.5, color=COLORS["global"]),
        )
        ref = ideal_single_rank if ideal_single_rank and math.isfinite(ideal_single_rank) else None
        ends = span(hx)
        if ref is not None:
            add(
                "thr/ideal",
                "throughput",
                ends,
                np.full(ends.size, f.workers * ref),
                name=f"ideal {f.workers} × {ref:,.0f}",
                mode="lines",
                visible=True,
                line=dict(width=1.5, dash="dot", color=COLORS["ideal"]),
            )
        else:
            add(
                "thr/ideal",
                "throughput",
                [],
                [],
                name="ideal",
                mode="lines",
                visible=False,
                line=dict(width=1.5, dash="dot", color=COLORS["ideal"]),
            )
        add(
            "loss/train",
            "loss",
            hx,
            sm(column(h, "loss")),
            name="train loss",
            mode="lines",
            line=dict(color=COLORS["train"]),
        )
        add(
            "loss/val",
            "loss",
            ex,
            column(e, "val_loss"),
            name="val loss",
            mode="lines+markers",
            marker=dict(size=7, color=COLORS["val"]),
            line=dict(width=1, color=COLORS["val"]),
        )
        add(
            "acc/train",
            "accuracy",
            hx,
            sm(column(h, "accuracy")),
            name="train accuracy",
            mode="lines",
            line=dict(color=COLORS["train"]),
        )
        add(
            "acc/val",
            "accuracy",
            ex,
            column(e, "val_accuracy"),
            name="val accuracy",
            mode="lines+markers",
            marker=dict(size=7, color=COLORS["val"]),
            line=dict(width=1, color=COLORS["val"]),
        )
        add(
            "lr",
            "lr",
            hx,
            column(h, "lr"),
            name="learning rate",
            mode="lines",
            line=dict(color=COLORS["lr"]),
        )
        add(
            "noise",
            "noise",
            hx,
            column(h, "noise_scale"),
            name="B_simple",
            mode="lines",
            line=dict(color=COLORS["noise"]),
        )
        gb = f.global_batch
        add(
            "noise/batch",
            "noise",
            ends if gb else [],
            np.full(ends.size if gb else 0, gb or 0.0),
            name=f"global batch {gb}" if gb else "global batch",
            mode="lines",
            line=dict(width=1.5, dash="dash", color=COLORS["batch"]),
        )
        return specs + split.rank_specs(f)

    overlay = role == "overlay"
    col = color or RUN_COLORS[0]
    name = text(f.label)
    style = dict(legendgroup=key_prefix or name, name=name, opacity=0.55 if overlay else 1.0)
    dash = "dash" if overlay else "solid"
    tip = lambda what: f"{name}<br>{what}: %{{y:.4g}}<extra></extra>"  # noqa: E731
    lines = (  # key, panel, x, y, what the hover names, line style: one colour per run
        ("thr/global", "throughput", hx, sm_rate(column(h, "samples_per_sec")), "samples/s", {}),
        ("loss/train", "loss", hx, sm(column(h, "loss")), "train loss", {}),
        ("acc/train", "accuracy", hx, sm(column(h, "accuracy")), "train accuracy", {"width": 1}),
        ("acc/val", "accuracy", ex, column(e, "val_accuracy"), "val accuracy", {"width": 1.5}),
        ("lr", "lr", hx, column(h, "lr"), "learning rate", {}),
        ("noise", "noise", hx, column(h, "noise_scale"), "B_simple", {}),
    )
    marker = dict(size=6, color=col, symbol="circle-open" if overlay else "circle")
    for key, panel, xs, ys, what, line in lines:
        markers = key == "acc/val"  # one marker per epoch
        add(
            key,
            panel,
            xs,
            ys,
            mode="lines+markers" if markers else "lines",
            showlegend=key == "thr/global",  # one legend entry per run
            line=dict(color=col, dash=dash, **line),
            hovertemplate=tip(what),
            **({"marker": marker} if markers else {}),
            **style,
        )
    if role == "run":  # (a live overlay keeps the split panel to the current run)
        specs += split.run_specs(f, key_prefix, first=key_prefix in ("", "run0/"))
    return specs


def notes(run_like: Any, ideal_single_rank: float | None = None) -> dict[str, str]:
    """The short sentences shown inside panels (ideal-line hint, noise-scale lesson)."""
    f = run_facts(run_like)
    out = {"ideal_note": "", "noise_note": "", "pop_note": split.pop_note(f)}
    if not ideal_single_rank and f.workers > 1:
        out["ideal_note"] = IDEAL_NOTE
    b_noise = last_finite(column(f.history, "noise_scale"))
    gb = f.global_batch
    if f.workers < 2:
        out["noise_note"] = "B_simple needs ≥ 2 workers (local vs global gradient)"
    elif gb and math.isfinite(b_noise) and b_noise > 0:
        ratio = gb / b_noise
        if ratio < 0.5:
            lesson = "batch ≪ B_simple: a bigger batch still cuts steps almost for free"
        elif ratio > 2:
            lesson = "batch ≫ B_simple: diminishing returns, more batch buys few fewer steps"
        else:
            lesson = "batch ≈ B_simple: near the critical batch size"
        out["noise_note"] = f"B = {gb:,}, B_simple ≈ {b_noise:,.0f} → {lesson}"
    return out


def single_rank_reference(current: Any, candidates: Iterable[Any]) -> float | None:
    """Throughput of a finished 1-worker run with the same data, model, per-worker batch and
    precision as `current` — the reference for the ideal line — or None."""
    cur = run_facts(current).config
    keys = ("dataset", "model", "batch_per_worker", "precision", "image_shape", "steps_per_call")
    for cand in candidates:
        f = run_facts(cand)
        if f.workers != 1 or any(f.config.get(k) != cur.get(k) for k in keys):
            continue
        value = f.summary.get("samples_per_sec")
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            value = throughput_stats(column(f.history, "samples_per_sec")).mean
        if math.isfinite(value) and value > 0:
            return float(value)
    return None


def figure(
    records: Any,
    x: str = "step",
    *,
    title: str = "",
    smoothing: float = 0.0,
    ideal_single_rank: float | None = None,
) -> go.Figure:
    """A static plotly Figure with the dashboard's panels, for HTML reports.

    One run is drawn in full detail (per-rank throughput, ideal line when a single-rank
    reference is given or found among `records`); several runs are drawn one colour each.
    `records`: RunRecords, Runs or run folder paths (or one of them).
    """
    check_x(x)
    if isinstance(records, (str, os.PathLike)) or hasattr(records, "history"):
        records = [records]
    facts = [run_facts(r) for r in records]
    fig = skeleton(go.Figure, title, x)
    if len(facts) == 1:
        ref = ideal_single_rank or single_rank_reference(facts[0], facts)
        specs = trace_specs(facts[0], x=x, smoothing=smoothing, role="main", ideal_single_rank=ref)
        set_notes(fig, notes(facts[0], ref))
    else:
        specs = []
        for i, f in enumerate(facts):
            specs += trace_specs(
                f,
                x=x,
                smoothing=smoothing,
                role="run",
                color=RUN_COLORS[i % len(RUN_COLORS)],
                key_prefix=f"run{i}/",
            )
    fig.add_traces([s.trace() for s in specs])
    return fig

"""Sweep charts against the worker count: throughput and scaling efficiency, weak and strong.

* :func:`scaling_series` — groups of runs that differ only in worker count, with the mean
  throughput T_N and the efficiency E(N) = T_N / (N · T_1) of each
  (:func:`hpclab.core.metrics.efficiency`).
* :func:`scaling_efficiency` — throughput and E(N) vs workers, weak scaling (fixed per-worker
  batch) and strong scaling (fixed global batch) drawn apart.
* :func:`pop_factors` — each weak-scaling E(N) taken apart into POP's factors (load balance,
  communication efficiency, computation scalability) from the runs' time splits.

Runs may be given as Runs, RunRecords or run folder paths. Static plotly figures, no widgets.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpclab.core import pop
from hpclab.core.engine_settings import THROUGHPUT_FIELDS
from hpclab.core.metrics import efficiency
from hpclab.views.charts.facts import facts_of, text
from hpclab.views.charts.outcomes import failed, throughput
from hpclab.views.charts.skeleton import RUN_COLORS

# which RunConfig fields decide throughput (besides the batch and the worker count); the threads
# per worker and Horovod's cycle time and fusion buffer decide it too, but they are the Lab's,
# read from the record's lab meta (THROUGHPUT_FIELDS of its engine settings)
_THROUGHPUT_KEYS = (
    "dataset",
    "model",
    "image_shape",
    "synthetic_classes",
    "precision",
    "fp16_allreduce",
    "steps_per_call",
    "optimizer",
    "xla",
    "grad_allreduce",
    "publish_every_s",
    "noise_scale",
    "straggler_rank",
    "straggler_slowdown",
    "straggler_ms",
    "validation",
    "eval_every",
    "eval_samples",
)
#: which throughput E(N) is taken over: training alone, or everything a user waits for
RATES = {
    "training": "samples_per_sec (training steps only)",
    "overall": "overall_samples_per_sec (evaluation and host time included)",
}


def _freeze(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _rate(f, rate: str) -> tuple[float | None, float | None]:
    if rate == "overall":
        value = f.summary.get("overall_samples_per_sec")
        ok = isinstance(value, (int, float)) and np.isfinite(value)
        return (float(value) if ok else None), None
    return throughput(f)


def scaling_series(records: Iterable[Any], rate: str = "training") -> list[dict]:
    """Groups of runs that differ only in worker count.

    ``rate``: ``"training"`` takes T from the training steps alone (``samples_per_sec``);
    ``"overall"`` from all samples over the whole loop, evaluation included
    (``overall_samples_per_sec``): the rate a serial test phase bounds (Amdahl's law).

    Weak scaling: fixed per-worker batch (global batch grows with N). Strong scaling: fixed global
    batch (per-worker batch shrinks). Runs with different threads per worker or engine settings (``Lab``
    arguments, recorded in config.json under "lab") never share a series. Each series: kind, name,
    threads_per_worker (None if not recorded), and per worker count N the mean throughput T_N and
    E(N) = T_N / (N · T_1) (hpclab.core.metrics.efficiency). Without a 1-worker run, T_1 is taken as
    T_m / m for the smallest N = m, and the name says "relative to N=m".
    """
    if rate not in RATES:
        raise ValueError(f"rate must be one of {', '.join(RATES)}; you passed rate={rate!r}.")
    runs = []
    for f in facts_of(records):
        t, ci = _rate(f, rate)
        if t is not None and t > 0 and f.global_batch and not failed(f):
            runs.append((f, t, ci))
    name_threads = len({f.threads_per_worker for f, _, _ in runs}) > 1
    name_validation = len({f.config.get("validation") for f, _, _ in runs}) > 1
    out = []
    for kind, batch_of in (
        ("weak", lambda f: f.global_batch // f.workers),
        ("strong", lambda f: f.global_batch),
    ):
        groups: dict = {}
        for f, t, ci in runs:
            setup = tuple(_freeze(f.config.get(k)) for k in _THROUGHPUT_KEYS) + tuple(
                f.engine_settings.get(k) for k in THROUGHPUT_FIELDS
            )
            key = (setup, f.threads_per_worker, batch_of(f))
            groups.setdefault(key, []).append((f, t, ci))
        for (_, threads, batch), members in groups.items():
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
            if name_threads:
                plural = "s" if threads != 1 else ""
                name += f", {threads} thread{plural} per worker" if threads else ", threads unknown"
            if name_validation:
                name += f", validation {members[0][0].config.get('validation', 'sharded')}"
            if base != 1:
                name += f" (E relative to N={base})"
            model = members[0][0].config.get("model")
            if model:
                name = f"{model}: {name}"
            out.append(
                {
                    "kind": kind,
                    "name": name,
                    "threads_per_worker": threads,
                    "workers": ns,
                    "throughput": [tn[n] for n in ns],
                    "ci95": [ci[n] for n in ns],
                    "t1": t1,
                    "efficiency": [efficiency(tn[n], t1, n) for n in ns],
                    "runs": {n: [f for f, _, _ in members if f.workers == n] for n in ns},
                }
            )
    return out


BUSY = 0.15  # passes disagreeing about a difference of E(2) by more: too busy to tell


def weak_efficiency(records: Iterable[Any], model: str) -> dict[int, float]:
    """Weak-scaling E(2) of one model's 1-vs-2-worker pairs, by per-worker batch."""
    return {
        s["runs"][1][0].global_batch: float(s["efficiency"][-1])
        for s in scaling_series(records)
        if s["kind"] == "weak" and s["workers"] == [1, 2] and s["name"].startswith(f"{model}:")
    }


def judge(gaps: list[float], noise: float) -> str:
    """One verdict rule for a difference measured in two passes, against ``noise`` (how far
    the passes disagree): "shown" when both passes show it and their mean beats the noise;
    "reversed" when the mean beats the noise the other way; otherwise "too busy to tell" when
    the noise exceeds BUSY, else "within the noise". Two passes are the least that measures a
    spread at all, so the rule asks the mean to beat their whole disagreement; an effect that
    beats even a busy machine's noise is still shown."""
    mean = sum(gaps) / len(gaps)
    if min(gaps) > 0 and mean > noise:
        return "shown"
    if mean < -noise:
        return "reversed"
    return "too busy to tell" if noise > BUSY else "within the noise"


def batch_effect(first: Iterable[Any], repeat: Iterable[Any], model: str = "cnn1d") -> dict:
    """How much weak-scaling E(2) gains from the smallest to the largest per-worker batch that
    both passes measured, in each pass, judged against the passes' disagreement (:func:`judge`).

    The gap is read within a pass: a pass's 1- and 2-worker runs are minutes apart, so the
    level of E(2) moves between passes more than the gap does. Per-step costs (the allreduce,
    the call, the wait) do not shrink with the batch, so a small batch should scale worse."""
    e_first, e_again = weak_efficiency(first, model), weak_efficiency(repeat, model)
    both = sorted(set(e_first) & set(e_again))
    if len(both) < 2:
        raise ValueError(
            f"batch_effect needs weak-scaling pairs of {model!r} at two batches in both passes; "
            f"the first pass has {sorted(e_first)}, the repeat {sorted(e_again)}."
        )
    small, large = both[0], both[-1]
    gaps = [e[large] - e[small] for e in (e_first, e_again)]
    noise = abs(gaps[0] - gaps[1])
    return {
        "model": model,
        "per-worker batches": [small, large],
        "E(2) first pass": {b: round(e_first[b], 3) for b in both},
        "E(2) repeat": {b: round(e_again[b], 3) for b in both},
        "gaps": [round(g, 3) for g in gaps],
        "noise": round(noise, 3),
        "verdict": judge(gaps, noise),
    }


def pop_factors(records: Iterable[Any]) -> pd.DataFrame:
    """Each weak-scaling series' E(N) taken apart into POP's factors
    (:func:`hpclab.core.pop.weak_scaling_factors`): load balance x communication efficiency x
    computation scalability / the reference's parallel efficiency, beside the E(N) the
    throughput gives. One row per series and worker count above its smallest; runs without a
    time split are left out."""
    rows = []
    for s in scaling_series(records):
        if s["kind"] != "weak":
            continue
        base = s["workers"][0]
        ref = s["runs"][base][0].summary.get("time_split")
        for n, e in zip(s["workers"][1:], s["efficiency"][1:]):
            split = s["runs"][n][0].summary.get("time_split")
            if not ref or not split:
                continue
            f = pop.weak_scaling_factors(ref, split)
            rows.append(
                {
                    "series": s["name"],
                    "workers": n,
                    "E (throughput)": e,
                    "E (split)": f["efficiency"],
                    "load balance": f["load_balance"],
                    "comm efficiency": f["comm_efficiency"],
                    "computation scalability": f["computation_scalability"],
                    f"PE at {base}": f["reference_parallel_efficiency"],
                }
            )
    return pd.DataFrame(rows)


def scaling_efficiency(records: Iterable[Any], rate: str = "training") -> go.Figure:
    """Throughput and scaling efficiency E(N) = T_N / (N·T_1) vs number of workers.

    Weak scaling series (fixed per-worker batch) are solid, strong scaling (fixed global batch)
    dashed; dotted lines are the ideal N·T_1. ``rate``: see :func:`scaling_series`.
    """
    facts = facts_of(records)
    series = scaling_series(facts, rate)
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            f"throughput (samples/s, {RATES[rate].split(' (')[1].rstrip(')')})",
            "scaling efficiency E(N) = T_N / (N·T_1)",
        ),
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

"""The dashboard's sixth panel: where a step's time goes on each rank, and POP's three numbers.

One horizontal stack per rank of the parts of :data:`hpclab.core.pop.PARTS` (milliseconds per step,
over the run's latest rate window of ≥ 1 s), and a note with the POP efficiencies of that window:
load balance × communication efficiency = parallel efficiency (:mod:`hpclab.core.pop`). A straggler
shows twice: its own stack is longer in ``compute``, and every other rank's ``allreduce`` grows by
the time it waits for it. Several runs (a report): one stack per run, averaged over its ranks
and its whole run. plotly only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from hpclab.core.pop import PARTS
from hpclab.views.charts.facts import RunFacts, facts_of, text
from hpclab.views.charts.skeleton import TraceSpec

PART_COLORS = {
    "loop": "#b3b3b3",
    "input": "#8da0cb",
    "compute": "#1b9e77",
    "allreduce": "#d95f02",
    "apply": "#66a61e",
    "sync": "#e6ab02",
    "host": "#a6761d",
}


def latest(history: pd.DataFrame) -> pd.Series | None:
    """The newest history row that carries the split (None before the first, or old records)."""
    if "rank_compute_ms" not in history.columns or history.empty:
        return None
    rows = history[history["rank_compute_ms"].map(lambda c: isinstance(c, (list, tuple)))]
    return rows.iloc[-1] if len(rows) else None


def rank_specs(f: RunFacts) -> list[TraceSpec]:
    """One bar trace per part; each has a bar per rank (the live and single-run figure)."""
    row = latest(f.history)
    workers = len(row["rank_compute_ms"]) if row is not None else f.workers
    labels = np.array([f"rank {r}" for r in range(workers)], dtype=object)
    stats = ("min", "median", "max")  # rows of many ranks carry these (hpclab.rank.publisher)
    if row is None and "rank_compute_ms_median" in f.history.columns and len(f.history):
        row = f.history.iloc[-1]
        row = {p: [row.get(f"rank_{p}_ms_{s}") for s in stats] for p in PARTS}
        row = {f"rank_{p}_ms": v for p, v in row.items()}
        labels = np.array([f"{s} of {workers} ranks" for s in stats], dtype=object)
    specs = []
    for part, (what, _) in PARTS.items():
        ms = row.get(f"rank_{part}_ms") if row is not None else None
        values = np.asarray(ms if isinstance(ms, (list, tuple)) else [], dtype=float)
        specs.append(
            TraceSpec(
                f"split/{part}",
                "split",
                values,
                labels[: values.size],
                dict(
                    name=part,
                    orientation="h",
                    marker=dict(color=PART_COLORS[part]),
                    hovertemplate=f"%{{y}}: {part} %{{x:.2f}} ms/step<br>({what})<extra></extra>",
                ),
                kind="bar",
            )
        )
    return specs


def run_specs(f: RunFacts, key_prefix: str, first: bool) -> list[TraceSpec]:
    """One stack for a whole run (a report of several runs): its summary's mean split."""
    split = f.summary.get("time_split") or {}
    label = np.array([text(f.label)], dtype=object)
    specs = []
    for part in PARTS:
        value = split.get(f"{part}_ms")
        ok = isinstance(value, (int, float)) and math.isfinite(value)
        specs.append(
            TraceSpec(
                f"{key_prefix}split/{part}",
                "split",
                np.array([value] if ok else [], dtype=float),
                label if ok else label[:0],
                dict(
                    name=part,
                    orientation="h",
                    legendgroup=f"split/{part}",
                    showlegend=first,
                    marker=dict(color=PART_COLORS[part]),
                    hovertemplate=f"%{{y}}: {part} %{{x:.2f}} ms/step<extra></extra>",
                ),
                kind="bar",
            )
        )
    return specs


#: The time split's methods (hpclab.core.devices.split_method) as the chart names them.
CLOCKS = {"device_sync": "device-synced clock", "host_clock": "host clock"}


def pop_note(f: RunFacts) -> str:
    """'POP: LB 0.99 × comm 0.85 = PE 0.84 · input 4 % · step 3.10 ms' of the latest window
    ('' before it); input: the share of the step spent producing the batch."""
    row = latest(f.history)
    pop = pop_text(dict(row)) if row is not None else ""
    if not pop:
        return ""
    share = row.get("input_share")
    waits = f" · input {share:.0%}" if isinstance(share, float) and math.isfinite(share) else ""
    return f"POP: {pop}{waits} · step {row.get('step_ms', float('nan')):.2f} ms"


def pop_text(split: dict) -> str:
    """'LB 0.99 × comm 0.85 = PE 0.84' from a summary's ``time_split`` ('' if it has none)."""
    values = [split.get(k) for k in ("load_balance", "comm_efficiency", "parallel_efficiency")]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        return ""
    return "LB {:.2f} × comm {:.2f} = PE {:.2f}".format(*values)


def figure(records: Iterable[Any], title: str = "") -> go.Figure:
    """Each run's whole-run split, one stack per rank (ms per step), and its POP numbers.

    ``records``: Runs, RunRecords or run folders; runs recorded before the split existed are
    left out."""
    rows = []  # (y label, {part: ms})
    for f in facts_of(records):
        split = f.summary.get("time_split") or {}
        ranks = split.get("rank_compute_ms")
        if not isinstance(ranks, list):
            continue
        # which clock the parts were read from (summary time_split "method"; core/devices.py)
        note = "; ".join(x for x in (pop_text(split), CLOCKS.get(split.get("method"), "")) if x)
        for r in range(len(ranks)):
            label = f"{text(f.label)} · rank {r}" + (f" ({note})" if r == 0 and note else "")
            rows.append(
                (label, {p: split.get(f"rank_{p}_ms", [math.nan] * len(ranks))[r] for p in PARTS})
            )
    fig = go.Figure()
    for part, (what, _) in PARTS.items():
        fig.add_trace(
            go.Bar(
                x=[ms[part] for _, ms in rows],
                y=[label for label, _ in rows],
                name=part,
                orientation="h",
                marker=dict(color=PART_COLORS[part]),
                hovertemplate=f"%{{y}}: {part} %{{x:.2f}} ms/step<br>({what})<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        title=text(title) or "where a step's time goes, per rank (whole run)",
        xaxis_title="ms per step",
        yaxis=dict(autorange="reversed"),
        template="plotly_white",
        height=140 + 28 * max(len(rows), 1),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


#: Horovod timeline activities in the order a tensor meets them, with their colours; any other
#: activity a timeline holds is drawn after these, in grey.
TIMELINE_COLORS = {
    "NEGOTIATE_ALLREDUCE": "#7570b3",  # ranks reporting the tensor ready: the wait for the last
    "WAIT_FOR_DATA": "#8da0cb",  # GPU only: the op waits for its input on the device
    "WAIT_FOR_OTHER_TENSOR_DATA": "#a6cee3",  # GPU only: a fused neighbour's input
    "QUEUE": "#b3b3b3",
    "MEMCPY_IN_FUSION_BUFFER": "#e6ab02",
    "MPI_ALLREDUCE": "#d95f02",  # the data exchange itself
    "MEMCPY_OUT_FUSION_BUFFER": "#a6761d",
    "ALLREDUCE": "#fdbf6f",  # the operation's own rest
}


def timeline_figure(run_like: Any) -> go.Figure:
    """A run's Horovod timeline (``RunConfig.timeline_steps``): one bar per tensor group,
    stacked by activity — negotiation, waits for data (GPU only), fusion-buffer copies, the MPI
    allreduce — in milliseconds per step of each activity's own time (:mod:`hpclab.core.timeline`)."""
    f = facts_of([run_like])[0]
    tl = f.summary.get("timeline") or {}
    # (a summary from before per-group summaries: its activity totals, nested parts included)
    by = tl.get("by_tensor") or (
        {"all tensors": tl["ms_per_step"]} if tl.get("ms_per_step") else {}
    )
    seen = {a for parts in by.values() for a in parts}
    order = [a for a in TIMELINE_COLORS if a in seen] + sorted(seen - set(TIMELINE_COLORS))
    tensors = sorted(by, key=lambda t: sum(by[t].values()))
    fig = go.Figure(
        [
            go.Bar(
                x=[by[t].get(a, 0.0) for t in tensors],
                y=tensors,
                name=a,
                orientation="h",
                marker=dict(color=TIMELINE_COLORS.get(a, "#d9d9d9")),
                hovertemplate=f"%{{y}} · {a}: %{{x:.3f}} ms/step<extra></extra>",
            )
            for a in order
        ]
    )
    what = f"{tl.get('steps', 0)} steps, {len(tensors)} tensor groups"
    fig.update_layout(
        title=text(f"Horovod timeline of {f.label}: ms per step by tensor group ({what})")
        if by
        else "no timeline recorded (RunConfig.timeline_steps = 0, or one worker)",
        barmode="stack",
        xaxis_title="ms per step (each activity's own time)",
        template="plotly_white",
        height=200 + 26 * max(len(tensors), 1),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


__all__ = [
    "PART_COLORS",
    "latest",
    "rank_specs",
    "run_specs",
    "pop_note",
    "pop_text",
    "figure",
    "timeline_figure",
    "TIMELINE_COLORS",
]

"""Gradient exponents against float16's range: the histogram of Micikevicius et al. 2018
("Mixed Precision Training", ICLR, arXiv:1710.03740, Fig. 3) for this lab's models.

Takes the result of :func:`hpclab.rank.probes.fp16_exponents.gradient_exponents` (plain lists):
for each point in training, the share of gradient elements at each exponent ``floor(log2|g|)``
of the float32 reference, drawn unscaled and shifted by the loss scale's ``log2 S``, with
float16's smallest subnormal (2^-24: below it, 0) and smallest normal (2^-14: below it, fewer
significant bits) marked. Plus the table of what float16 loses at each point.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

KINDS = ("activation", "weight")


def exponent_histogram(result: dict) -> go.Figure:
    """One row per point in training, activation gradients left and weight gradients right:
    bars of the share of elements at each exponent, unscaled (grey) and scaled by S (blue)."""
    points = result["points"]
    titles = [
        f"{kind} gradients · epoch {p['epoch']} (val acc {p['val_accuracy']:.3f})"
        for p in points
        for kind in KINDS
    ]
    fig = make_subplots(
        rows=len(points), cols=2, subplot_titles=titles, shared_xaxes=True, vertical_spacing=0.12
    )
    bins, shift = result["bins"], result["scale_log2"]
    for row, p in enumerate(points, start=1):
        for col, kind in enumerate(KINDS, start=1):
            counts = p["histogram"][kind]
            total = p["elements"][kind]
            shares = [c / total for c in counts]
            for name, dx, color in (
                ("loss unscaled", 0.0, "#9e9e9e"),
                (f"loss × 2^{shift:g}", shift, "#1f77b4"),
            ):
                fig.add_trace(
                    go.Bar(
                        x=[b + dx for b in bins],
                        y=shares,
                        name=name,
                        marker_color=color,
                        opacity=0.7,
                        legendgroup=name,
                        showlegend=row == 1 and col == 1,
                    ),
                    row=row,
                    col=col,
                )
            for x, label in ((result["subnormal"], "2^-24"), (result["normal"], "2^-14")):
                fig.add_vline(
                    x=x,
                    line_dash="dash",
                    line_color="#d62728",
                    row=row,
                    col=col,
                    annotation_text=label if row == 1 else None,
                )
    fig.update_layout(
        barmode="overlay",
        height=280 * len(points) + 80,
        title="float16's range and the gradients: exponents log2|g| (share of elements)",
    )
    fig.update_xaxes(title_text="log2 |gradient|", row=len(points))
    return fig


def underflow_table(result: dict) -> pd.DataFrame:
    """One row per point × kind × scaling: the shares of all gradient elements below 2^-24 and
    2^-14 (float32 reference, shifted by the scale), flushed to 0 by float16 (0 there, not in the
    reference) and structurally 0 (0 in the reference too)."""
    rows = []
    for p in result["points"]:
        for scaling in ("unscaled", "scaled"):
            for kind in KINDS:
                rows.append(
                    {"epoch": p["epoch"], "gradients": kind, "loss": scaling, **p[scaling][kind]}
                )
    return pd.DataFrame(rows)


def _span(values: list[float], fmt: str) -> str:
    """'a–b' over the values, or one figure when they print alike."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def takeaways(saved: dict) -> list[str]:
    """The lesson's findings from :func:`hpclab.studies.fp16.measure`'s result, each difference
    set beside the spread between seeds."""
    results = saved["results"]
    epochs = [p["epoch"] for p in results[0]["points"]]
    first, last = epochs[0], epochs[-1]

    def shares(epoch, scaling, kind, field="flushed"):
        return [
            next(p for p in r["points"] if p["epoch"] == epoch)[scaling][kind][field]
            for r in results
        ]

    out = []
    for kind in KINDS:
        un, sc = shares(last, "unscaled", kind), shares(last, "scaled", kind)
        start = shares(first, "unscaled", kind)
        spread = max(un) - min(un)
        saved_share = [1 - s / u for u, s in zip(un, sc) if u > 0]  # per seed: a paired saving
        saves = (
            f"; the scale saves {_span(saved_share, '.0%')} of it at each seed"
            if saved_share
            else ""
        )
        out.append(
            f"{kind} gradients at epoch {last}: float16 flushes {min(un):.1%}–{max(un):.1%} of "
            f"them to 0 with the loss unscaled (seeds {saved['seeds']}; spread "
            f"{spread:.1%}), {min(sc):.1%}–{max(sc):.1%} with it scaled by "
            f"2^{results[0]['scale_log2']:g}{saves}; at epoch {first}: {max(start):.1%} at most."
        )
    below = shares(last, "unscaled", "activation", "below_subnormal")
    out.append(
        f"Below 2^-24 in the float32 reference at epoch {last}: {min(below):.1%}–{max(below):.1%} "
        "of the activation gradients; nb03's detector (grad_zero_fraction) counts weight "
        "gradients only."
    )
    return out

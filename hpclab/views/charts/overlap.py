"""Overlap and fusion (notebook 13): runs that differ only in how gradients cross the ranks.

An *arm* is one way of exchanging gradients: ``grad_allreduce`` (``grouped``: one fused op after
the backward pass; ``per_tensor``: one allreduce per gradient, each free to start while backprop
still runs) under the engines' Horovod settings (``cycle_time_ms``: the pause between the
background loop's negotiation rounds; ``fusion_mb``: the buffer that packs small tensors into one
allreduce, 0 = off; :class:`hpclab.core.engine_settings.EngineSettings`). Runs of one arm repeated
(a tag such as ``"repeat"``) give the run-to-run spread; every difference between arms is judged
against the largest spread measured (:func:`findings`), never against zero.

:func:`table` has one row per run, :func:`arms` one per arm (mean and spread), :func:`findings`
the comparisons in words, :func:`figure` samples/s per arm (one dot per run) beside where a step's
time goes (compute, the exposed allreduce — the part not hidden behind the backward pass — and
the rest). Sources: Horovod docs, "Tensor Fusion" and "Autotune"; Sergeev & Del Balso 2018
(arXiv:1802.05799), section 4 (fusion) and 5 (the timeline).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpclab.core.engine_settings import EngineSettings
from hpclab.views.charts.facts import facts_of
from hpclab.views.charts.split import PART_COLORS

DEFAULTS = EngineSettings()
KEYS = ["grad_allreduce", "cycle_time_ms", "fusion_mb"]  # what makes an arm
SPLIT = ["compute_ms", "allreduce_ms", "other_ms"]  # a step's time, ms (other: the rest)


def arm_name(grad_allreduce: str, cycle_time_ms: float, fusion_mb: float) -> str:
    """``per_tensor · cycle 0.1 ms · fusion 64 MB`` (fusion 0: ``fusion off``)."""
    fusion = "fusion off" if fusion_mb == 0 else f"fusion {fusion_mb:g} MB"
    return f"{grad_allreduce} · cycle {cycle_time_ms:g} ms · {fusion}"


def table(runs: Iterable[Any]) -> pd.DataFrame:
    """One row per finished run: its arm, its tags, samples/s and the time split (ms per step,
    mean over ranks and over the run but its first window: ``summary["time_split"]``)."""
    rows = []
    for f in facts_of(runs):
        if f.status != "finished":
            continue
        settings = {**DEFAULTS.to_dict(), **f.engine_settings}
        split = f.summary.get("time_split") or {}
        step = float(split.get("step_ms", float("nan")))
        compute = float(split.get("compute_ms", float("nan")))
        allreduce = float(split.get("allreduce_ms", float("nan")))
        key = (f.config["grad_allreduce"], settings["cycle_time_ms"], settings["fusion_mb"])
        rows.append(
            {
                "arm": arm_name(*key),
                **dict(zip(KEYS, key, strict=True)),
                "tags": ",".join(f.config.get("tags") or ()),
                "samples_per_sec": float(f.summary.get("samples_per_sec") or float("nan")),
                "step_ms": step,
                "compute_ms": compute,
                "allreduce_ms": allreduce,
                "other_ms": step - compute - allreduce,
                "allreduce_share": allreduce / step,
                "run_id": f.run_id,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "arm",
            *KEYS,
            "tags",
            "samples_per_sec",
            "step_ms",
            *SPLIT,
            "allreduce_share",
            "run_id",
        ],
    )


def arms(runs: Iterable[Any]) -> pd.DataFrame:
    """One row per arm: runs, mean samples/s and its spread over the arm's runs ((max − min) /
    mean; NaN for an arm run once), and the mean split in ms per step."""
    t = table(runs)
    if t.empty:
        return pd.DataFrame(columns=["arm", *KEYS, "runs", "samples_per_sec", "spread", *SPLIT])
    g = t.groupby("arm", sort=False)
    rate = g["samples_per_sec"]
    out = g[KEYS].first()
    out["runs"] = g.size()
    out["samples_per_sec"] = rate.mean()
    out["spread"] = ((rate.max() - rate.min()) / rate.mean()).where(out["runs"] > 1)
    for part in SPLIT:
        out[part] = g[part].mean()
    share = g["allreduce_share"]
    out["allreduce_share"] = share.mean()
    out["share_spread"] = (share.max() - share.min()).where(out["runs"] > 1)
    return out.reset_index()


def noise(runs: Iterable[Any]) -> dict:
    """The yardsticks: the largest relative spread of samples/s over repeated arms, and the
    largest spread of the exposed allreduce's share of a step; NaN without a repeated arm.

    The share is the steadier of the two on a shared machine: a busy neighbour slows compute
    and exchange alike, moving samples/s far more than the share of a step each takes."""
    a = arms(runs)
    return {
        "samples_per_sec": float(a["spread"].max()) if len(a) else float("nan"),
        "allreduce_share": float(a["share_spread"].max()) if len(a) else float("nan"),
    }


def _verdict(change: float, yardstick: float, higher: str, lower: str) -> str:
    if not yardstick == yardstick:  # NaN: nothing repeated, nothing to judge against
        return "unjudged (no repeat)"
    if abs(change) <= yardstick:
        return "within noise"
    return higher if change > 0 else lower


def _reference(arm: pd.Series) -> str:
    """per_tensor under the default settings is judged against grouped under them; an arm under
    other settings against the default settings with the same ``grad_allreduce``."""
    default = arm.cycle_time_ms == DEFAULTS.cycle_time_ms and arm.fusion_mb == DEFAULTS.fusion_mb
    kind = "grouped" if default else arm.grad_allreduce
    return arm_name(kind, DEFAULTS.cycle_time_ms, DEFAULTS.fusion_mb)


def findings(runs: Iterable[Any]) -> pd.DataFrame:
    """Each arm against its reference (:func:`_reference`), judged against the measured noise
    (:func:`noise`): ``rate_change``, the relative change of samples/s, against the largest
    relative spread of a repeated arm; ``share_change``, the change of the exposed allreduce's
    share of a step (a difference of fractions), against the largest spread of that share."""
    runs = list(runs)
    a = arms(runs).set_index("arm")
    yard = noise(runs)
    rows = []
    for name, arm in a.iterrows():
        ref = _reference(arm)
        if ref == name or ref not in a.index:
            continue
        r = a.loc[ref]
        change = arm.samples_per_sec / r.samples_per_sec - 1
        share = arm.allreduce_share - r.allreduce_share
        rows.append(
            {
                "arm": name,
                "against": ref,
                "rate_change": change,
                "rate_noise": yard["samples_per_sec"],
                "rate_verdict": _verdict(change, yard["samples_per_sec"], "faster", "slower"),
                "share_change": share,
                "share_noise": yard["allreduce_share"],
                "share_verdict": _verdict(share, yard["allreduce_share"], "larger", "smaller"),
            }
        )
    return pd.DataFrame(rows)


def takeaways(runs: Iterable[Any]) -> list[str]:
    """One sentence per finding (:func:`findings`), numbers and verdicts from the runs."""
    return [
        f"{f.arm} against {f.against}: samples/s {f.rate_change:+.1%} ({f.rate_verdict}; "
        f"repeats spread up to {f.rate_noise:.1%}); the exposed allreduce's share of a step "
        f"{100 * f.share_change:+.1f} percentage points ({f.share_verdict}; repeats spread up "
        f"to {100 * f.share_noise:.1f})."
        for _, f in findings(runs).iterrows()
    ]


def figure(runs: Iterable[Any], title: str = "") -> go.Figure:
    """Left: samples/s per arm, one dot per run (the repeats' spread is the noise). Right: where
    an arm's step goes, ms per step: compute, the exposed allreduce, the rest."""
    runs = list(runs)
    t, a = table(runs), arms(runs)
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.28,
        subplot_titles=("samples/s (one dot per run)", "ms per step (mean over the arm's runs)"),
    )
    fig.add_trace(
        go.Scatter(
            x=t["samples_per_sec"],
            y=t["arm"],
            mode="markers",
            marker=dict(size=10, color="#1b9e77"),
            text=t["tags"].where(t["tags"] != "", "first pass"),
            hovertemplate="%{y}<br>%{x:.1f} samples/s (%{text})<extra></extra>",
            name="a run",
        ),
        row=1,
        col=1,
    )
    colors = {
        "compute_ms": PART_COLORS["compute"],
        "allreduce_ms": PART_COLORS["allreduce"],
        "other_ms": PART_COLORS["sync"],
    }
    for part in SPLIT:
        fig.add_trace(
            go.Bar(
                x=a[part],
                y=a["arm"],
                orientation="h",
                name=part.removesuffix("_ms"),
                marker=dict(color=colors[part]),
                hovertemplate=f"%{{y}}: {part.removesuffix('_ms')} %{{x:.1f}} ms<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_layout(
        title=title or "Overlap and fusion: ResNet-20's gradients, exchanged several ways",
        barmode="stack",
        template="plotly_white",
        height=260 + 34 * max(len(a), 1),
        legend=dict(orientation="h", y=-0.2),
    )
    fig.update_yaxes(categoryorder="array", categoryarray=list(a["arm"])[::-1])
    fig.update_yaxes(showticklabels=False, row=1, col=2)
    return fig


__all__ = ["KEYS", "SPLIT", "arm_name", "arms", "figure", "findings", "noise", "table", "takeaways"]

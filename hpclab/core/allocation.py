"""The plan of an allocation: time to target, GPU- and node-hours, efficiency, for every choice of
ranks and global batch — and which choices are worth making.

For ``p`` ranks and a global batch ``B`` (local batch ``b = B / p``), from a statistical model
(:class:`hpclab.core.critical_batch.CriticalBatchFit`, steps to the target S(B)) and a hardware
model (:class:`hpclab.core.hardware_model.HardwareModel`, seconds per step T(b, p))::

    time to target   t(p, B) = S(B) · T(B/p, p)
    GPU-hours        p · t / 3600          node-hours   ⌈p / per_node⌉ · t / 3600
    hardware efficiency     T(b, 1) / T(b, p)       (weak scaling at the same local batch)
    statistical efficiency  E_min / E(B) = 1 / (1 + B / B_crit)   (McCandlish et al. 2018)

Their product is the share of the ranks' work that would be left if nothing were lost to
communication, imbalance or a batch past the critical one (the split of Crossbow: Koliousis et
al. 2019, "Crossbow: Scaling Deep Learning with Small Batch Sizes on Multi-GPU Servers",
arXiv:1901.02244, hardware × statistical efficiency).

The Pareto set keeps the choices no other choice beats on both time and cost (GPU-hours). Named
points on it: the cheapest, the fastest, the fastest within twice the cheapest's cost, and the
knee — the Pareto point farthest from the straight line joining the cheapest and the fastest on
log-time/log-cost axes (the "Kneedle" idea: Satopää et al. 2011, "Finding a 'Kneedle' in a
Haystack", ICDCS workshops). Every assumption is listed with where its number came from and how
far the plan extrapolates it. NumPy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hpclab.core.critical_batch import CriticalBatchFit
from hpclab.core.errors import ConfigError
from hpclab.core.hardware_model import HardwareModel

COST_FACTOR = 2.0  # "the fastest within 2x the cheapest"


@dataclass(frozen=True)
class Assumption:
    """One number the plan rests on: ``kind`` is ``measured here``, ``entered`` or
    ``extrapolated``; ``what`` says which number and how far."""

    kind: str
    what: str


@dataclass(frozen=True)
class Allocation:
    """Every choice evaluated (``rows``, one dict each), its Pareto set, named points, the
    assumptions and a paragraph computed from the numbers."""

    rows: tuple[dict, ...]
    pareto: tuple[dict, ...]
    named: dict[str, dict]
    assumptions: tuple[Assumption, ...]
    paragraph: str
    target: str

    def table(self):
        """The rows as a pandas DataFrame (pandas loads only here)."""
        import pandas as pd

        return pd.DataFrame(list(self.rows))


def _choices(workers: Sequence, batches: Sequence) -> list[tuple[int, int]]:
    ws = sorted({int(w) for w in workers})
    bs = sorted({int(b) for b in batches})
    if not ws or ws[0] < 1:
        raise ConfigError(f"workers must be whole numbers >= 1; you passed {list(workers)!r}.")
    if not bs or bs[0] < 1:
        raise ConfigError(
            f"batches must be whole global batch sizes >= 1; you passed {list(batches)!r}."
        )
    pairs = [(w, b) for w in ws for b in bs if b % w == 0]
    if not pairs:
        raise ConfigError(
            f"no global batch in {bs} divides evenly over any of workers {ws}; choose batches "
            "that are multiples of the worker counts."
        )
    return pairs


def evaluate(
    hardware: HardwareModel, statistics: CriticalBatchFit, workers: int, batch: int
) -> dict:
    """One choice: ``workers`` ranks at global batch ``batch`` (module doc)."""
    local = batch / workers
    parts = hardware.parts(local, workers)
    steps = float(statistics.predict_steps(batch))
    steps_rel_se = float(statistics.steps_se(batch)) / steps
    time_s = steps * parts["step"]
    nodes = hardware.network.nodes(workers)
    hw_eff = hardware.efficiency(local, workers)
    stat_eff = 1.0 / (1.0 + batch / statistics.b_crit)
    return {
        "workers": workers,
        "nodes": nodes,
        "global_batch": batch,
        "local_batch": local,
        "steps": steps,
        "step_s": parts["step"],
        "allreduce_share": parts["allreduce"] / parts["step"],
        "time_s": time_s,
        "time_s_lo": time_s * max(0.0, 1.0 - 2 * steps_rel_se),
        "time_s_hi": time_s * (1.0 + 2 * steps_rel_se),
        "gpu_hours": workers * time_s / 3600,
        "node_hours": nodes * time_s / 3600,
        "samples_per_s": workers * local / parts["step"],
        "hardware_efficiency": hw_eff,
        "statistical_efficiency": stat_eff,
        "efficiency": hw_eff * stat_eff,
    }


def pareto_front(rows: Sequence[dict], x: str = "time_s", y: str = "gpu_hours") -> list[dict]:
    """The rows no other row beats on both ``x`` and ``y`` (smaller is better), by ``x``."""
    ordered = sorted(rows, key=lambda r: (r[x], r[y]))
    front, best_y = [], math.inf
    for r in ordered:
        if r[y] < best_y:
            front.append(r)
            best_y = r[y]
    return front


def knee(front: Sequence[dict], x: str = "time_s", y: str = "gpu_hours") -> dict:
    """The Pareto point farthest below the line joining its two ends on log-log axes (both
    normalised to [0, 1]); the cheapest end when the front has fewer than three points."""
    if len(front) < 3:
        return min(front, key=lambda r: r[y])
    lx = np.log([r[x] for r in front])
    ly = np.log([r[y] for r in front])
    span_x, span_y = np.ptp(lx) or 1.0, np.ptp(ly) or 1.0
    u, v = (lx - lx.min()) / span_x, (ly - ly.min()) / span_y
    # the ends are (0, v[0]) (fastest) and (1, v[-1]) (cheapest); distance below their chord
    chord = v[0] + (v[-1] - v[0]) * u
    return front[int(np.argmax(chord - v))]


def named_points(rows: Sequence[dict], front: Sequence[dict]) -> dict[str, dict]:
    cheapest = min(rows, key=lambda r: (r["gpu_hours"], r["time_s"]))
    fastest = min(rows, key=lambda r: (r["time_s"], r["gpu_hours"]))
    budget = COST_FACTOR * cheapest["gpu_hours"]
    within = [r for r in rows if r["gpu_hours"] <= budget]
    return {
        "cheapest": cheapest,
        "fastest": fastest,
        "fastest within 2x the cheapest": min(within, key=lambda r: r["time_s"]),
        "the knee": knee(front),
    }


def _hours(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _choice(r: dict) -> str:
    ranks = "1 rank" if r["workers"] == 1 else f"{r['workers']} ranks"
    return f"{ranks} at global batch {r['global_batch']:,}"


def paragraph(
    named: dict[str, dict], statistics: CriticalBatchFit, target: str, rows: Sequence[dict]
) -> str:
    """What the plan shows, computed from its numbers."""
    cheap, fast = named["cheapest"], named["fastest"]
    within, kn = named["fastest within 2x the cheapest"], named["the knee"]
    speedup = cheap["time_s"] / fast["time_s"]
    cost_ratio = fast["gpu_hours"] / cheap["gpu_hours"]
    lines = [
        f"To reach {target}, the cheapest choice is {_choice(cheap)}: "
        f"{_hours(cheap['time_s'])} and {cheap['gpu_hours']:.3g} GPU-hours.",
        f"The fastest, {_choice(fast)}, takes {_hours(fast['time_s'])} — {speedup:.1f}x sooner "
        f"— for {cost_ratio:.1f}x the GPU-hours.",
        f"Within twice the cheapest cost the fastest is {_choice(within)} "
        f"({_hours(within['time_s'])}, {within['gpu_hours']:.3g} GPU-hours); the knee of the "
        f"time-cost curve is {_choice(kn)} ({_hours(kn['time_s'])}, "
        f"{kn['gpu_hours']:.3g} GPU-hours).",
    ]
    if fast["global_batch"] > statistics.b_crit:
        lines.append(
            f"The fastest batch is {fast['global_batch'] / statistics.b_crit:.1f}x the critical "
            f"batch (B_crit ≈ {statistics.b_crit:,.0f}): there each doubling of the batch cuts "
            "the steps by much less than half, so the extra ranks buy little time."
        )
    else:
        lines.append(
            f"Every batch of the fastest choice is below the critical batch (B_crit ≈ "
            f"{statistics.b_crit:,.0f}): the statistics still pay for larger batches, and what "
            "limits the speed-up is the hardware (its efficiency "
            f"{fast['hardware_efficiency']:.0%} at {fast['workers']} ranks)."
        )
    most = max(r["workers"] for r in rows)
    if fast["workers"] < most:
        best_most = min((r for r in rows if r["workers"] == most), key=lambda r: r["time_s"])
        lines.append(
            f"Beyond {fast['workers']} ranks the time no longer falls: the best choice on "
            f"{most} ranks takes {_hours(best_most['time_s'])}, its allreduce "
            f"{best_most['allreduce_share']:.0%} of the step (hardware efficiency "
            f"{best_most['hardware_efficiency']:.0%})."
        )
    if fast["allreduce_share"] > 0.5:
        lines.append(
            f"At {fast['workers']} ranks the allreduce is {fast['allreduce_share']:.0%} of the "
            "step: a faster network or larger local batches matter more than more ranks."
        )
    return " ".join(lines)


def assumptions(
    hardware: HardwareModel, statistics: CriticalBatchFit, rows: Sequence[dict]
) -> list[Assumption]:
    """Where every number came from, and how far the plan stretches it."""
    out = []
    b_lo, b_hi = min(statistics.batches), max(statistics.batches)
    plan_b = max(r["global_batch"] for r in rows)
    plan_b_lo = min(r["global_batch"] for r in rows)
    out.append(
        Assumption(
            "measured here",
            f"steps to target S(B) fitted at global batches {b_lo:,.0f}–{b_hi:,.0f} with the "
            f"learning rate tuned per batch: {statistics.describe()}",
        )
    )
    if plan_b > b_hi or plan_b_lo < b_lo:
        out.append(
            Assumption(
                "extrapolated",
                f"S(B) used at global batches {plan_b_lo:,}–{plan_b:,}: up to "
                f"{max(plan_b / b_hi, b_lo / plan_b_lo):.0f}x beyond the batches fitted "
                "(McCandlish et al.'s curve assumed to hold there)",
            )
        )
    notes = hardware.notes or {}
    for name, affine in (("compute", hardware.compute), ("rest", hardware.rest)):
        out.append(
            Assumption(
                "measured here" if affine.source.startswith("measured") else "entered",
                f"{name} per step = {affine.fixed_s * 1e3:.3g} ms + {affine.per_sample_s * 1e6:.4g}"
                f" µs per local sample ({affine.source})",
            )
        )
    fitted = notes.get("local_batches")
    if fitted:
        lo, hi = min(fitted), max(fitted)
        plan_lo = min(r["local_batch"] for r in rows)
        plan_hi = max(r["local_batch"] for r in rows)
        if plan_hi > hi or plan_lo < lo:
            out.append(
                Assumption(
                    "extrapolated",
                    f"compute and rest fitted at local batches {lo:g}–{hi:g}, used at "
                    f"{plan_lo:g}–{plan_hi:g}",
                )
            )
    net = hardware.network
    for name, link in (("intra-node", net.intra), ("inter-node", net.inter)):
        if link is None:
            continue
        out.append(
            Assumption(
                "measured here" if link.source.startswith("measured") else "entered",
                f"{name} link: latency {link.latency_s * 1e6:.3g} µs, bandwidth "
                f"{link.bandwidth_Bps / 1e9:.3g} GB/s ({link.source})",
            )
        )
    ranks_measured = notes.get("ranks_measured")
    most = max(r["workers"] for r in rows)
    if ranks_measured and most > max(ranks_measured):
        out.append(
            Assumption(
                "extrapolated",
                f"communication measured on up to {max(ranks_measured)} ranks, used on up to "
                f"{most} ({net.algorithm} allreduce, {net.per_node or 'all'} ranks per node)",
            )
        )
    slowdown = (
        ", ".join(f"{sc:.2f}x at local batch {b:g}" for b, sc in sorted(hardware.slowdown_by_batch))
        if hardware.slowdown_by_batch
        else f"{hardware.compute_slowdown:.2f}x"
    )
    window = (
        f" and up to {hardware.overlap_window:.0%} of compute hiding the rest"
        if hardware.overlap_window
        else ""
    )
    out.append(
        Assumption(
            notes.get("load_balance_source", "entered"),
            f"load balance {hardware.load_balance:.2f}, computation slowdown "
            f"{slowdown} at more than one rank, {hardware.overlap:.0%} "
            f"of the allreduce hidden behind backprop{window}; gradients "
            f"{hardware.gradient_bytes:,.0f} bytes",
        )
    )
    return out


def plan_allocation(
    hardware: HardwareModel,
    statistics: CriticalBatchFit,
    workers: Sequence[int],
    batches: Sequence[int],
    target: str = "the target accuracy",
    notes: Sequence[Assumption] = (),
) -> Allocation:
    """Every (workers, global batch) choice whose batch divides evenly over the workers, the
    Pareto set of time vs GPU-hours, the named points, the assumptions (``notes``: more of them,
    from whoever measured) and the paragraph."""
    rows = [evaluate(hardware, statistics, w, b) for w, b in _choices(workers, batches)]
    front = pareto_front(rows)
    front_ids = {(r["workers"], r["global_batch"]) for r in front}
    for r in rows:
        r["pareto"] = (r["workers"], r["global_batch"]) in front_ids
    named = named_points(rows, front)
    labels: dict[int, list[str]] = {}
    for label, r in named.items():
        labels.setdefault(id(r), []).append(label)
    for r in rows:
        r["named"] = ", ".join(labels.get(id(r), []))
    return Allocation(
        rows=tuple(rows),
        pareto=tuple(front),
        named=named,
        assumptions=(*assumptions(hardware, statistics, rows), *notes),
        paragraph=paragraph(named, statistics, target, rows),
        target=target,
    )


__all__ = [
    "Assumption",
    "Allocation",
    "COST_FACTOR",
    "evaluate",
    "pareto_front",
    "knee",
    "named_points",
    "paragraph",
    "assumptions",
    "plan_allocation",
]

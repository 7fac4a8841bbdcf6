"""The lab's lessons on real clusters: the quantity a notebook measures on two ranks, read from
measured data of GPU clusters (:mod:`hpclab.core.traces`; ``data/scaling-traces/``). Here the
step-time lessons: samples/s and time to target per batch (notebook 02), weak and strong scaling
and the network's cost (04), the synchronisation share of a step (06), overlap (13); the lessons
to a target (05, 10) are in :mod:`hpclab.core.real_targets`.

Each lesson's function returns a :class:`Section`: the figures its sentences state (rounded as
printed, so a test asserts exactly what a student reads), the sentences, and the series its chart
draws (:mod:`hpclab.views.charts.real_clusters`). The data is fixed, so every figure is too.

Sources, and where their setup differs from the lab's (two ranks on two CPU cores, TensorFlow +
Horovod, a grouped allreduce that never overlaps the backward pass):

* Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep Learning",
  OSDI 2021, artifact traces: 16 AWS g4dn.12xlarge nodes of 4 NVIDIA T4 each; PyTorch with
  AdaptDL, the allreduce overlapped with backprop; the validation runs' learning rates adapted by
  AdaScale, not tuned per batch.
* MLPerf Training v3.0, NVIDIA's ResNet-50 on DGX H100 (8 GPUs a node): MXNet, LARS tuned per
  scale by the submitter; time to 75.9 % top-1, the median of five runs, evaluation included.
* Time to target = steps to target × time per step (notebook 02; the split of Koliousis et al.,
  "Crossbow", VLDB 2019, that notebook 10's planner makes): Pollux's steps from AdaScale's runs, not a per-batch
  tuning, so they measure AdaScale as well as the batch (McCandlish et al. 2018,
  arXiv:1812.06162, assume the learning rate tuned per batch).

Pure: NumPy and SciPy only, reads the CSVs, writes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpclab.core.traces import read_mlperf, read_runs, read_steps, steps_to_target, traces_dir

PER_NODE = 4  # T4 GPUs in one g4dn.12xlarge node
WORKLOAD = "imagenet"  # ResNet-50: of Pollux's workloads the nearest to the lab's ResNet-20
SMALL, LARGE = 20, 200  # the smallest and largest local batch of its step-time rows
WEAK_GPUS = (1, 2, 4, 8, 16, 32, 64)
#: strong scaling at a global batch of 160-163: the local batches of the trace's √2 grid that
#: multiply back to it (E compares samples/s, which a 2 % difference in the batch hardly moves)
STRONG = ((1, 163), (2, 81), (4, 40), (8, 20))
#: the image workloads' targets (the replay's: each run's best is within a point of them)
TARGETS = {"cifar10": 0.94, "imagenet": 0.75}
MODELS = {"cifar10": "ResNet-18 on CIFAR-10", "imagenet": "ResNet-50 on ImageNet"}


@dataclass(frozen=True)
class Section:
    """One notebook's real-cluster section: ``figures`` every number a sentence states (rounded
    as printed), ``sentences`` the findings, ``series`` what the chart draws (name, x, y, kind)."""

    figures: dict
    sentences: tuple[str, ...]
    series: tuple[dict, ...] = field(default=())


def line(name: str, points: dict, kind: str, **extra) -> dict:
    """One of :attr:`Section.series` from ``{x: y}``: what the chart draws."""
    return {"name": name, "x": list(points), "y": list(points.values()), "kind": kind, **extra}


def pollux(workload: str = WORKLOAD, folder=None):
    """A Pollux workload's step rows."""
    root = Path(folder) if folder is not None else traces_dir() / "pollux-osdi21"
    return read_steps(root / workload)


def packed(steps, gpus: int, local_batch: int):
    """The row of ``gpus`` packed on as few nodes as they fit (4 a node), every node alike."""
    nodes = math.ceil(gpus / PER_NODE)
    (row,) = [
        r
        for r in steps
        if r.gpus == gpus and r.nodes == nodes and r.uniform and r.local_batch == local_batch
    ]
    return row


def _placement(steps, nodes: int, per_node: int, local_batch: int):
    (row,) = [
        r
        for r in steps
        if r.nodes == nodes
        and r.per_node == per_node
        and r.uniform
        and r.local_batch == local_batch
        and r.source == "placements"
    ]
    return row


def weak_efficiency(steps, local_batch: int) -> dict[int, float]:
    """E(N) = T_N / (N · T_1) at a fixed local batch, N = 1 … 64 packed 4 a node."""
    one = packed(steps, 1, local_batch).samples_per_s
    return {n: packed(steps, n, local_batch).samples_per_s / (n * one) for n in WEAK_GPUS}


def strong_efficiency(steps) -> dict[int, float]:
    """E(N) = T_N / (N · T_1) at a global batch of 160-163 (:data:`STRONG`)."""
    one = packed(steps, 1, STRONG[0][1]).samples_per_s
    return {n: packed(steps, n, b).samples_per_s / (n * one) for n, b in STRONG}


def scaling_out(folder=None) -> Section:
    """Notebook 04: weak and strong scaling efficiency from 1 to 64 T4s, one node's four GPUs
    against four nodes of one, and MLPerf's 8 → 64 H100s at one global batch."""
    steps = pollux(WORKLOAD, folder)
    weak = {b: weak_efficiency(steps, b) for b in (SMALL, LARGE)}
    strong = strong_efficiency(steps)
    net = {}
    for b in (SMALL, LARGE):
        node, spread = _placement(steps, 1, 4, b), _placement(steps, 4, 1, b)
        net[b] = (spread.step_s / node.step_s, node.sync_s, spread.sync_s)
    h100 = {r.gpus: r for r in read_mlperf()}
    speedup = h100[8].minutes_median / h100[64].minutes_median
    f = {
        **{f"weak_{b}_{n}": round(weak[b][n], 2) for b in weak for n in (4, 8, 64)},
        **{f"strong_{n}": round(strong[n], 2) for n in (2, 4, 8)},
        **{f"network_{b}": round(net[b][0], 2) for b in net},
        **{
            f"sync_{b}_{where}": round(net[b][i], 3)
            for b in net
            for i, where in ((1, "node"), (2, "nodes"))
        },
        "mlperf_speedup": round(speedup, 1),
        "mlperf_efficiency": round(speedup / 8, 2),
    }
    sentences = (
        f"Weak scaling, ResNet-50 on T4s at {SMALL} images per GPU: E = {f[f'weak_{SMALL}_4']:.2f}"
        f" on the 4 GPUs of one node, {f[f'weak_{SMALL}_8']:.2f} on 8 GPUs over 2 nodes, "
        f"{f[f'weak_{SMALL}_64']:.2f} on 64 GPUs over 16 nodes.",
        f"At {LARGE} images per GPU: E = {f[f'weak_{LARGE}_4']:.2f}, "
        f"{f[f'weak_{LARGE}_8']:.2f} and {f[f'weak_{LARGE}_64']:.2f} on the same 4, 8 and 64 "
        "GPUs.",
        f"What the network costs: 4 GPUs on 4 nodes take {f[f'network_{SMALL}']:.2f}x the step "
        f"of 4 GPUs in one node at {SMALL} images per GPU (synchronisation "
        f"{f[f'sync_{SMALL}_nodes']:.3f} s against {f[f'sync_{SMALL}_node']:.3f} s), "
        f"{f[f'network_{LARGE}']:.2f}x at {LARGE}.",
        f"Strong scaling at a global batch of 160-163: E = {f['strong_2']:.2f} on 2 T4s, "
        f"{f['strong_4']:.2f} on 4 (one node), {f['strong_8']:.2f} on 8 (two nodes).",
        f"MLPerf v3.0, ResNet-50 on DGX H100: 8 to 64 GPUs at the same global batch of "
        f"{h100[8].global_batch:,} trains {f['mlperf_speedup']:.1f}x faster, a strong-scaling "
        f"efficiency of {f['mlperf_efficiency']:.2f} against 8 GPUs.",
    )
    series = (
        *(line(f"T4s, weak, {b} per GPU", weak[b], "weak") for b in weak),
        line("T4s, strong, global batch 160-163", strong, "strong"),
        {
            "name": f"H100s (MLPerf), strong, global batch {h100[8].global_batch:,} (vs 8 GPUs)",
            "x": [8, 64],
            "y": [1.0, speedup / 8],
            "kind": "strong",
        },
    )
    return Section(f, sentences, series)


def time_to_target(steps, gpus: int, to_target: dict[int, float]) -> dict[int, float]:
    """Hours to target on ``gpus`` T4s packed 4 a node, per global batch B whose local batch
    B / gpus lies inside the measured ones: steps × the step time there, interpolated linearly
    between the two measured local batches around it."""
    local = sorted({r.local_batch for r in steps if r.gpus == 1})
    step_s = [packed(steps, gpus, b).step_s for b in local]
    return {
        b: s * float(np.interp(b / gpus, local, step_s)) / 3600.0
        for b, s in sorted(to_target.items())
        if local[0] <= b / gpus <= local[-1]
    }


def hardware_vs_statistical(folder=None) -> Section:
    """Notebook 02: samples/s against the local batch on 1, 16 and 64 T4s; steps to target
    against the global batch (Pollux's ImageNet runs, AdaScale); time to target on 16 and 64 T4s
    and the batch that gets there soonest."""
    steps = pollux(WORKLOAD, folder)
    root = Path(folder) if folder is not None else traces_dir() / "pollux-osdi21"
    to_target = {
        b: float(s)
        for b, s in steps_to_target(read_runs(root / WORKLOAD), TARGETS[WORKLOAD]).items()
    }
    local = sorted({r.local_batch for r in steps if r.gpus == 1})
    rate = {n: {b: packed(steps, n, b).samples_per_s for b in local} for n in (1, 16, 64)}
    hours = {n: time_to_target(steps, n, to_target) for n in (16, 64)}
    small, large = min(to_target), max(to_target)
    f = {f"rate_{n}_{b}": round(rate[n][b]) for n in rate for b in (SMALL, LARGE)}
    f |= {f"gain_{n}": round(rate[n][LARGE] / rate[n][SMALL], 2) for n in rate}
    f |= {
        "steps_small": round(to_target[small]),
        "steps_large": round(to_target[large]),
        "steps_cut": round(to_target[small] / to_target[large], 1),
        "samples_grow": round(large * to_target[large] / (small * to_target[small]), 2),
    }
    for n in hours:
        f |= {f"hours_{n}_{b}": round(h, 2) for b, h in hours[n].items()}
        f[f"soonest_{n}"] = min(hours[n], key=hours[n].get)
    ranked = sorted(hours[16].values())
    f["runner_up_16"] = round(ranked[1] / ranked[0] - 1.0, 3)
    h16 = ", ".join(f"{f[f'hours_16_{b}']:.2f} h at {b:,}" for b in hours[16])
    h64 = ", ".join(f"{f[f'hours_64_{b}']:.2f} h at {b:,}" for b in hours[64])
    sentences = (
        "Samples/s of ResNet-50 from "
        + f"{SMALL} to {LARGE} images per GPU: "
        + "; ".join(
            f"{n} T4{'s' if n > 1 else ''} {f[f'rate_{n}_{SMALL}']:,} to {f[f'rate_{n}_{LARGE}']:,}"
            f" (x{f[f'gain_{n}']:.2f})"
            for n in rate
        )
        + ".",
        f"Steps to {TARGETS[WORKLOAD]:.0%} top-1 (Pollux's runs, AdaScale learning rates): {f['steps_small']:,} at "
        f"a global batch of {small:,}, {f['steps_large']:,} at {large:,}: {large // small}x the "
        f"batch, {f['steps_cut']}x fewer steps, {f['samples_grow']:.2f}x the samples.",
        f"Time to target on 16 T4s: {h16}; soonest at {f['soonest_16']:,}, the next within "
        f"{f['runner_up_16']:.1%}.",
        f"On 64 T4s: {h64}; soonest at {f['soonest_64']:,}.",
    )
    series = (
        *(
            {
                "name": f"{n} T4{'s' if n > 1 else ''}",
                "x": local,
                "y": [rate[n][b] for b in local],
                "kind": "rate",
            }
            for n in rate
        ),
        line("ResNet-50 on ImageNet (T4s)", to_target, "steps"),
        *(line(f"{n} T4s", hours[n], "time") for n in hours),
    )
    return Section(f, sentences, series)


SHARE_BATCHES = (SMALL, 57, LARGE)  # the chart's lines: smallest, middle and largest local batch


def sync_share(steps, gpus: int, local_batch: int) -> float:
    """The exposed synchronisation's share of a step, GPUs packed 4 a node."""
    row = packed(steps, gpus, local_batch)
    return row.sync_s / row.step_s


def where_time_goes(folder=None) -> Section:
    """Notebook 06: the synchronisation share of a step against GPUs and the local batch, on
    T4s packed 4 a node (ResNet-50; PyTorch overlaps the allreduce, so this is what it left
    exposed)."""
    steps = pollux(WORKLOAD, folder)
    local = sorted({r.local_batch for r in steps if r.gpus == 1})
    share = {b: {n: sync_share(steps, n, b) for n in WEAK_GPUS} for b in local}
    inside = [share[b][n] for b in local for n in (2, 4)]
    across = {b: [share[b][n] for n in WEAK_GPUS if n > PER_NODE] for b in (SMALL, LARGE)}
    f = {
        "node_max": round(max(inside), 3),
        "across_small_min": round(min(across[SMALL]), 3),
        "across_small_max": round(max(across[SMALL]), 3),
        "across_large_max": round(max(across[LARGE]), 3),
        "at_64_small": round(share[SMALL][64], 3),
        "at_64_large": round(share[LARGE][64], 3),
    }
    sentences = (
        f"ResNet-50 on T4s, inside one node (2 or 4 GPUs): synchronisation is at most "
        f"{f['node_max']:.1%} of a step, at every local batch from {SMALL} to {LARGE}.",
        f"Across nodes (8 to 64 GPUs) at {SMALL} images per GPU: {f['across_small_min']:.1%} to "
        f"{f['across_small_max']:.1%} of a step; at {LARGE} per GPU at most "
        f"{f['across_large_max']:.1%}.",
        f"On 64 GPUs the share falls from {f['at_64_small']:.1%} at {SMALL} images per GPU to "
        f"{f['at_64_large']:.1%} at {LARGE}.",
    )
    series = tuple(
        {
            "name": f"T4s, {b} images per GPU",
            "x": list(WEAK_GPUS),
            "y": [share[b][n] for n in WEAK_GPUS],
            "kind": "share",
        }
        for b in SHARE_BATCHES
    )
    return Section(f, sentences, series)


def overlap(folder=None) -> Section:
    """Notebook 13: the synchronisation a step waits for on 16 T4 nodes (one GPU each, PyTorch
    overlapping the allreduce with backprop) against the local batch, and what overlap costs
    the computation beside it."""
    steps = pollux(WORKLOAD, folder)
    rows = {
        r.local_batch: r
        for r in steps
        if r.nodes == 16 and r.gpus == 16 and r.source == "scalability"
    }
    one = packed(steps, 1, LARGE)
    lo, hi = rows[SMALL], rows[LARGE]
    f = {
        "sync_small": round(lo.sync_s, 3),
        "sync_large": round(hi.sync_s, 4),
        "sync_fall": round(lo.sync_s / hi.sync_s),
        "share_small": round(lo.sync_s / lo.step_s, 3),
        "share_large": round(hi.sync_s / hi.step_s, 3),
        "rest_large": round(hi.compute_s, 3),
        "one_gpu_large": round(one.step_s, 3),
        "rest_over_one": round(hi.compute_s / one.step_s - 1.0, 2),
    }
    sentences = (
        f"On 16 T4 nodes (one GPU each, ResNet-50), the synchronisation a step waits for falls "
        f"from {f['sync_small']:.3f} s at {SMALL} images per GPU to {f['sync_large']:.4f} s at "
        f"{LARGE} ({f['sync_fall']}x less), though every step sends the same gradient.",
        f"Its share of the step falls from {f['share_small']:.1%} to {f['share_large']:.1%}.",
        f"The hiding is not free: at {LARGE} per GPU the rest of the step takes "
        f"{f['rest_large']:.3f} s, {f['rest_over_one']:.0%} longer than the whole step of one "
        f"GPU alone ({f['one_gpu_large']:.3f} s).",
    )
    batches = sorted(rows)
    series = (
        {
            "name": "16 T4 nodes, ResNet-50 (overlapped)",
            "x": batches,
            "y": [rows[b].sync_s / rows[b].step_s for b in batches],
            "kind": "share",
        },
    )
    return Section(f, sentences, series)


__all__ = [
    "PER_NODE",
    "WORKLOAD",
    "SMALL",
    "LARGE",
    "TARGETS",
    "Section",
    "pollux",
    "packed",
    "weak_efficiency",
    "strong_efficiency",
    "scaling_out",
    "time_to_target",
    "hardware_vs_statistical",
    "sync_share",
    "where_time_goes",
    "overlap",
]

"""Measured scaling data from real GPU clusters, read into the lab's own quantities.

Two sources (``data/scaling-traces/``, provenance and the Apache-2.0 notice beside them):

* **The Pollux trace format** (Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for
  Goodput-Optimized Deep Learning", OSDI 2021; its artifact's ``sched/traces/<workload>/``), one
  folder per workload — the format is the contract, so any workload written in it can be read
  (and replayed, :mod:`hpclab.core.replay`):

  - ``placements.csv``: ``placement,local_bsz,step_time,sync_time``, ``placement`` a string of
    per-node GPU counts (``"22"``: two GPUs on each of two nodes); seconds per step, and the
    part of it spent in gradient synchronisation (exposed: the allreduce overlaps backprop).
  - ``scalability.csv``: ``num_nodes,num_replicas,local_bsz,step_time,sync_time``.
  - ``validation-<B>.csv``: one run at global batch B: ``progress,iteration,metric,grad_sqr,
    grad_var`` per evaluation.

* **MLPerf Training v3.0, ResNet-50 on DGX H100** (``mlperf-v3.0-resnet50-h100.csv``): time to
  75.9 % top-1 at 8 to 768 GPUs, its global batch and epochs, five runs each.

B_simple (McCandlish et al. 2018, arXiv:1812.06162, eq. 2.9: tr Σ / |G|²) from the traces'
gradient statistics: AdaptDL's ``grad_sqr`` estimates |G|² and ``grad_var`` the gradient variance
of a batch of the workload's *initial* batch B0 (its ``GradientNoiseScale`` scales the variance
to B0), so B_simple = B0 · grad_var / grad_sqr; B0 is the smallest validation batch unless given
(128, 200, 12 and 256 for the four shared workloads: AdaptDL's examples start there).
Pure Python and NumPy.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpclab.core.errors import ConfigError

#: ImageNet-1k training images per epoch (MLPerf's ResNet-50 counts epochs of these).
IMAGENET_TRAIN = 1_281_167
POLLUX_WORKLOADS = ("cifar10", "imagenet", "bert", "ncf")
MLPERF_FILE = "mlperf-v3.0-resnet50-h100.csv"


def traces_dir() -> Path:
    """``$HPCLAB_DATA/scaling-traces`` where it exists (an install without the checkout: copy the
    folder there), else the checkout's ``data/scaling-traces/`` beside the package."""
    staged = os.environ.get("HPCLAB_DATA")
    if staged and (Path(staged) / "scaling-traces").is_dir():
        return Path(staged) / "scaling-traces"
    return Path(__file__).resolve().parents[2] / "data" / "scaling-traces"


@dataclass(frozen=True)
class StepRow:
    """One measured placement: seconds per step and its synchronisation part."""

    gpus: int
    nodes: int
    per_node: int  # GPUs on the fullest node (the one whose link carries the most)
    uniform: bool  # every node holds the same number of GPUs
    local_batch: int
    step_s: float
    sync_s: float
    source: str  # "placements" or "scalability"

    @property
    def global_batch(self) -> int:
        return self.gpus * self.local_batch

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / self.step_s

    @property
    def compute_s(self) -> float:
        """The step less its exposed synchronisation."""
        return self.step_s - self.sync_s


@dataclass(frozen=True)
class Run:
    """One validation run at a global batch: per evaluation, the optimizer steps (``iteration``),
    the metric and the gradient statistics."""

    batch: int
    iteration: np.ndarray
    progress: np.ndarray
    metric: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray

    def steps_to(self, target: float, lower_is_better: bool = False) -> int | None:
        """Optimizer steps at the first evaluation that reached ``target`` (exact to one
        evaluation interval), or None when the run never did."""
        hit = self.metric <= target if lower_is_better else self.metric >= target
        return int(self.iteration[np.argmax(hit)]) if hit.any() else None

    def b_simple(self, init_batch: int) -> np.ndarray:
        """B_simple at each evaluation: B0 · grad_var / grad_sqr (module doc)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            out = init_batch * self.grad_var / self.grad_sqr
        return np.where(self.grad_sqr > 0, out, np.nan)


def _rows(path: Path, columns: tuple[str, ...]) -> list[dict]:
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; a trace folder holds {path.name}.")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise ConfigError(
                f"{path} lacks the column(s) {', '.join(missing)}; it must have "
                f"{','.join(columns)}."
            )
        rows = list(reader)
    if not rows:
        raise ConfigError(f"{path} has no rows.")
    return rows


def _positive(path: Path, row: dict, key: str, allow_zero: bool = False) -> float:
    try:
        v = float(row[key])
    except (TypeError, ValueError):
        v = float("nan")
    if not (math.isfinite(v) and (v >= 0 if allow_zero else v > 0)):
        raise ConfigError(f"{path}: {key} must be a finite number > 0; a row has {row[key]!r}.")
    return v


def read_steps(folder) -> list[StepRow]:
    """Every row of ``placements.csv`` and (when present) ``scalability.csv``. A scalability row
    spreads its replicas over its nodes as evenly as they go (its fullest node holds
    ceil(replicas / nodes))."""
    folder = Path(folder)
    out = []
    path = folder / "placements.csv"
    for r in _rows(path, ("placement", "local_bsz", "step_time", "sync_time")):
        pl = r["placement"].strip()
        if not re.fullmatch(r"[1-9]+", pl):
            raise ConfigError(
                f"{path}: placement must be a string of per-node GPU counts such as '22'; a row "
                f"has {pl!r}."
            )
        counts = [int(c) for c in pl]
        out.append(_step_row(path, r, sum(counts), len(counts), max(counts), len(set(counts)) == 1))
    path = folder / "scalability.csv"
    if path.is_file():
        cols = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
        for r in _rows(path, cols):
            nodes = int(_positive(path, r, "num_nodes"))
            gpus = int(_positive(path, r, "num_replicas"))
            out.append(_step_row(path, r, gpus, nodes, math.ceil(gpus / nodes), gpus % nodes == 0))
    return out


def _step_row(path, r, gpus, nodes, per_node, uniform) -> StepRow:
    return StepRow(
        gpus=gpus,
        nodes=nodes,
        per_node=per_node,
        uniform=uniform,
        local_batch=int(_positive(path, r, "local_bsz")),
        step_s=_positive(path, r, "step_time"),
        sync_s=_positive(path, r, "sync_time", allow_zero=True),
        source=path.stem,
    )


def read_runs(folder) -> dict[int, Run]:
    """The ``validation-<B>.csv`` runs of a folder, by global batch."""
    folder = Path(folder)
    runs = {}
    for path in sorted(folder.glob("validation-*.csv")):
        m = re.fullmatch(r"validation-(\d+)\.csv", path.name)
        if not m:
            continue
        rows = _rows(path, ("progress", "iteration", "metric", "grad_sqr", "grad_var"))

        def col(key, rows=rows):
            return np.array([float(r[key]) for r in rows])

        runs[int(m.group(1))] = Run(
            batch=int(m.group(1)),
            iteration=col("iteration"),
            progress=col("progress"),
            metric=col("metric"),
            grad_sqr=col("grad_sqr"),
            grad_var=col("grad_var"),
        )
    return runs


def steps_to_target(runs: dict[int, Run], target: float, lower_is_better: bool = False) -> dict:
    """Optimizer steps to ``target`` per global batch (None where the run never reached it)."""
    return {b: runs[b].steps_to(target, lower_is_better) for b in sorted(runs)}


@dataclass(frozen=True)
class MlperfRow:
    """One MLPerf system: GPUs, global batch, epochs to target and the five runs' minutes."""

    system: str
    nodes: int
    gpus: int
    global_batch: int
    epochs: float
    minutes: tuple[float, ...]

    @property
    def steps(self) -> float:
        """Optimizer steps to the target: epochs · images per epoch / global batch."""
        return self.epochs * IMAGENET_TRAIN / self.global_batch

    @property
    def minutes_median(self) -> float:
        return float(np.median(self.minutes))

    @property
    def step_s(self) -> float:
        """Seconds per step over the whole scored run (evaluation and start-up included)."""
        return self.minutes_median * 60.0 / self.steps

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.minutes_median / 60.0


def read_mlperf(path=None) -> list[MlperfRow]:
    """The MLPerf table, by GPU count."""
    path = Path(path) if path is not None else traces_dir() / MLPERF_FILE
    cols = ("system", "nodes", "gpus", "global_batch", "epochs_to_target")
    out = []
    for r in _rows(path, cols):
        minutes = tuple(float(r[k]) for k in sorted(r) if k and k.startswith("minutes_run"))
        if not minutes or not all(math.isfinite(m) and m > 0 for m in minutes):
            raise ConfigError(f"{path}: {r['system']} needs minutes_run* > 0; it has {minutes!r}.")
        out.append(
            MlperfRow(
                system=r["system"],
                nodes=int(_positive(path, r, "nodes")),
                gpus=int(_positive(path, r, "gpus")),
                global_batch=int(_positive(path, r, "global_batch")),
                epochs=_positive(path, r, "epochs_to_target"),
                minutes=minutes,
            )
        )
    return sorted(out, key=lambda m: m.gpus)


__all__ = [
    "IMAGENET_TRAIN",
    "POLLUX_WORKLOADS",
    "MLPERF_FILE",
    "traces_dir",
    "StepRow",
    "Run",
    "read_steps",
    "read_runs",
    "steps_to_target",
    "MlperfRow",
    "read_mlperf",
]

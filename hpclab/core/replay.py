"""The planner against the world: fit on what one or two GPUs show, predict the rest, compare.

A workload folder in the Pollux trace format (:mod:`hpclab.core.traces`) is replayed as the
planner would use it:

* **Step time** — the hardware model (:mod:`hpclab.core.hardware_model`) is fitted on the rows
  with at most ``FIT_GPUS`` = 2 GPUs (one GPU; two on one node; one on each of two nodes: the
  scale the lab itself measures) and predicts every row with more:

  - ``compute(b) = c0 + c1·b`` from the 1-GPU rows (their whole step: nothing is exchanged);
  - the allreduce of one gradient across two GPUs of a node (``A_intra``) and across two nodes
    (``A_inter``), each with its overlap window φ (the share of compute it hides behind), fitted
    by least squares on relative residuals of ``compute(b) + max(A − φ·compute(b), 0)`` over the
    local batches of the 2-GPU rows. With two ranks the latency α and bandwidth β of a ring
    cannot be told apart, so all of A is put in the bandwidth term (α = 0) and the gradient's
    size is the unit (``gradient_bytes = 1``);
  - a placement of p GPUs on N nodes, g on the fullest, then costs the hierarchical ring
    (Thakur, Rabenseifner and Gropp 2005; Patarasuk and Yuan 2009, bandwidth-optimal
    allreduce) ``2(g − 1)/g · A_intra + 2(N − 1)/N · A_inter`` less what hides behind compute
    (φ of the link the allreduce crosses: the network's where N > 1).

  The band is ±2σ·(1 + log2(p/2)) around the prediction, σ the fit's rms relative residual:
  the fit's own scatter, widened by each doubling of the GPU count beyond the fit.

* **Steps to target** — S(B) = S_min (1 + B_crit / B) (McCandlish et al. 2018,
  arXiv:1812.06162; :mod:`hpclab.core.critical_batch`) fitted on the three smallest batches
  that reached the target, every larger batch predicted with a band (:func:`steps_band`). The
  hyperbola makes E(B) = B·S(B) rise with B and S(B) fall, so the samples to target of the
  batches fitted must rise (beyond one evaluation interval of granularity); where they do not,
  or the fit does not determine S_min and B_crit, the workload gets a warning sentence and its
  predictions are only the bracket the hyperbola allows beyond the largest batch fitted
  (between perfect scaling, S·B constant, and no scaling, S constant).

* **MLPerf's table** (time to train, :func:`replay_mlperf`) through the same path: each run
  predicted from the runs with fewer GPUs (steps from the samples-to-target hyperbola or its
  bracket, seconds per step affine in the local batch).

NumPy and SciPy only; pure (no files written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpclab.core.critical_batch import fit_critical_batch
from hpclab.core.errors import ConfigError
from hpclab.core.hardware_model import Affine, HardwareModel, Link, Network, fit_affine
from hpclab.core.traces import POLLUX_WORKLOADS, read_runs, read_steps, traces_dir

FIT_GPUS = 2  # the rows a fit may see: the scale the lab itself measures
FIT_BATCHES = 3  # the smallest batches the statistical model is fitted on
EXTRAPOLATED_GPUS = 16  # "at scale": the rows the replay's headline errors are read at
#: per workload of the shared traces, the target its metric is replayed to (the best each run
#: reaches is within a point of it: data/scaling-traces/README.md)
SHARED_TARGETS = {"cifar10": 0.94, "imagenet": 0.75, "bert": 88.0, "ncf": 0.69}


@dataclass(frozen=True)
class TraceHardware:
    """The hardware model fitted on a trace's ≤ 2-GPU rows (module doc)."""

    compute: Affine
    intra_s: float  # A_intra: one gradient across two GPUs of a node
    inter_s: float  # A_inter: one gradient across two nodes
    phi_intra: float
    phi_inter: float
    rel_rms: float  # rms relative residual of every row fitted

    def model(self, nodes: int, per_node: int) -> HardwareModel:
        """The :class:`HardwareModel` of a placement: the gradient is the unit of bytes."""
        network = Network(
            intra=Link(
                0.0, 1.0 / max(self.intra_s, 1e-12), _unit("2 GPUs of a node", self.intra_s)
            ),
            inter=Link(0.0, 1.0 / max(self.inter_s, 1e-12), _unit("2 nodes", self.inter_s)),
            per_node=int(per_node) if nodes > 1 else 0,
        )
        return HardwareModel(
            compute=self.compute,
            rest=Affine(0.0, 0.0, "in compute"),
            network=network,
            gradient_bytes=1.0,
            overlap_window=self.phi_inter if nodes > 1 else self.phi_intra,
        )

    def step_s(self, row) -> float:
        model = self.model(row.nodes, row.per_node)
        return model.step_s(row.local_batch, row.gpus, row.nodes)

    def band(self, predicted: float, gpus: int) -> tuple[float, float]:
        half = 2.0 * self.rel_rms * (1.0 + math.log2(max(gpus, FIT_GPUS) / FIT_GPUS))
        return predicted * max(1.0 - half, 0.0), predicted * (1.0 + half)


def _unit(where: str, seconds: float) -> str:
    return (
        f"fitted: one gradient in {seconds * 1e3:.3g} ms across {where}; the trace gives no "
        "sizes, so a byte here is one gradient"
    )


def _fit_link(rows, compute: Affine) -> tuple[float, float, np.ndarray]:
    """A and φ of one link from its 2-GPU rows: least squares on relative residuals."""
    from scipy.optimize import least_squares

    b = np.array([r.local_batch for r in rows], dtype=float)
    t = np.array([r.step_s for r in rows])
    c = np.asarray(compute(b), dtype=float)

    def residual(theta):
        a, phi = theta
        return (c + np.maximum(a - phi * c, 0.0)) / t - 1.0

    # max() makes the surface piecewise: start from the best point of a grid (φ in steps of
    # 0.02, A log-spaced over what the rows allow), then polish
    a_grid, phi_grid = np.meshgrid(
        np.geomspace(float(np.max(t)) * 1e-4, float(np.max(t)) * 2, 121), np.linspace(0, 1, 51)
    )
    pred = c + np.maximum(a_grid[..., None] - phi_grid[..., None] * c, 0.0)
    best = np.unravel_index(np.argmin(np.sum((pred / t - 1.0) ** 2, axis=-1)), a_grid.shape)
    start = [float(a_grid[best]), float(phi_grid[best])]
    fit = least_squares(residual, start, bounds=([0.0, 0.0], [np.inf, 1.0]))
    return float(fit.x[0]), float(fit.x[1]), residual(fit.x)


def fit_trace_hardware(steps) -> TraceHardware:
    """The hardware model from the rows with at most :data:`FIT_GPUS` GPUs (module doc)."""
    one = [r for r in steps if r.gpus == 1]
    intra = [r for r in steps if r.gpus == 2 and r.nodes == 1]
    inter = [r for r in steps if r.gpus == 2 and r.nodes == 2]
    for name, rows in (("1 GPU", one), ("2 GPUs on one node", intra), ("2 nodes", inter)):
        if len({r.local_batch for r in rows}) < 2:
            raise ConfigError(
                f"a trace needs rows at {name} at 2 or more local batches to fit the hardware "
                f"model; it has {len(rows)}."
            )
    compute = fit_affine(
        [r.local_batch for r in one], [r.step_s for r in one], "fitted: 1-GPU step time"
    )
    a_i, phi_i, res_i = _fit_link(intra, compute)
    a_e, phi_e, res_e = _fit_link(inter, compute)
    res_1 = np.array([compute(r.local_batch) / r.step_s - 1.0 for r in one])
    rms = float(np.sqrt(np.mean(np.concatenate([res_1, res_i, res_e]) ** 2)))
    return TraceHardware(compute, a_i, a_e, phi_i, phi_e, rms)


def replay_steps(steps) -> list[dict]:
    """Every row measured and predicted, with the band (JSON schema of ``--replay``)."""
    fit = fit_trace_hardware(steps)
    out = []
    for r in sorted(steps, key=lambda r: (r.gpus, r.nodes, r.per_node, r.local_batch)):
        predicted = fit.step_s(r)
        lo, hi = fit.band(predicted, r.gpus)
        out.append(
            {
                "gpus": r.gpus,
                "nodes": r.nodes,
                "local_batch": r.local_batch,
                "uniform": r.uniform,
                "fitted": r.gpus <= FIT_GPUS,
                "measured_s": r.step_s,
                "predicted_s": predicted,
                "band_lo_s": lo,
                "band_hi_s": hi,
            }
        )
    return out


def step_errors(rows: list[dict], min_gpus: int = EXTRAPOLATED_GPUS) -> dict:
    """Median and p90 of |predicted − measured| / measured at ``min_gpus`` or more, and how
    many of those rows lie inside their band."""
    far = [r for r in rows if r["gpus"] >= min_gpus and not r["fitted"]]
    if not far:
        return {"rows": 0, "median": None, "p90": None, "in_band": None}
    err = np.array([abs(r["predicted_s"] / r["measured_s"] - 1.0) for r in far])
    inside = [r["band_lo_s"] <= r["measured_s"] <= r["band_hi_s"] for r in far]
    return {
        "rows": len(far),
        "median": float(np.median(err)),
        "p90": float(np.percentile(err, 90)),
        "in_band": float(np.mean(inside)),
    }


def steps_band(predicted: float, rel_se: float, rel_rms: float, granularity: float, ratio: float):
    """Band of a steps-to-target prediction at ``ratio`` = B / largest batch fitted: in log
    space ±2·sqrt(rms² + granularity² + (se/S)²) (the fit's scatter, the evaluation interval's
    granularity, the parameters' uncertainty), times 1 + log2(ratio) (each doubling beyond the
    fit adds the same again: the model's own error grows as it extrapolates)."""
    half = 2.0 * math.sqrt(rel_rms**2 + granularity**2 + rel_se**2)
    half *= 1.0 + math.log2(max(ratio, 1.0))
    return predicted * math.exp(-half), predicted * math.exp(half)


def granularity(runs, batches) -> float:
    """The largest evaluation interval over the steps to target among ``batches``: a measured
    step count is exact only to one interval."""
    out = 0.0
    for b, steps in batches:
        it = runs[b].iteration
        gaps = np.diff(it) if it.size > 1 else np.array([it[0]])
        out = max(out, float(np.max(gaps)) / steps)
    return out


def hyperbola_warning(batches, steps, granularity: float) -> str | None:
    """A sentence when the points fitted contradict S(B) = S_min (1 + B_crit / B), else None.

    The hyperbola makes the samples to target E(B) = B·S(B) = E_min (1 + B / B_crit) rise with
    the batch; measured E that falls from one batch to the next by more than the evaluation
    interval's granularity (twice it: both ends are rounded) cannot lie on it — typically the
    learning rate was not tuned per batch (here AdaScale's adaptation, Shallue et al. 2018) or
    the target sits where the metric plateaus."""
    b = np.asarray(batches, dtype=float)
    e = b * np.asarray(steps, dtype=float)
    falls = np.diff(e) / e[:-1]
    worst = float(np.min(falls))
    if worst < -2.0 * granularity:
        return (
            f"the samples to target of the fitted batches {[int(x) for x in b]} fall by "
            f"{-worst:.0%} from one batch to the next (more than the evaluation granularity "
            f"{granularity:.0%} allows), which S(B) = S_min(1 + B_crit/B) forbids"
        )
    return None


def replay_statistics(runs, target: float, lower_is_better: bool = False) -> dict:
    """Steps to ``target`` fitted on the :data:`FIT_BATCHES` smallest batches that reached it,
    every other batch predicted with its band; a warning where the hyperbola does not hold."""
    reached = [(b, runs[b].steps_to(target, lower_is_better)) for b in sorted(runs)]
    reached = [(b, s) for b, s in reached if s]
    if len(reached) < FIT_BATCHES:
        raise ConfigError(
            f"the target {target:g} is reached at {len(reached)} batches; the statistical "
            f"model needs {FIT_BATCHES} (pick a target every run reaches)."
        )
    fitted = reached[:FIT_BATCHES]
    gran = granularity(runs, fitted)
    warning = hyperbola_warning(*zip(*fitted), gran)
    if warning:
        warning += ": the steps at larger batches are bracketed, not predicted."
    fit = None
    if warning is None:
        try:
            fit = fit_critical_batch(*zip(*fitted))
        except ConfigError as e:
            warning = f"S(B) = S_min(1 + B_crit/B) is not determined by the fitted batches: {e}"
    b_max, s_max = fitted[-1]
    rows = []
    for b, measured in reached:
        ratio = b / b_max
        if fit is not None:
            predicted = fit.predict_steps(b)
            lo, hi = steps_band(predicted, fit.steps_se(b) / predicted, fit.rel_rms, gran, ratio)
        elif b > b_max:  # the hyperbola's bracket beyond the largest batch fitted
            lo, hi = s_max * b_max / b, s_max
            predicted = math.sqrt(lo * hi)
        else:  # a fitted point with no curve through it: nothing predicted
            predicted = lo = hi = None
        rows.append(
            {
                "batch": int(b),
                "fitted": b <= b_max,
                "measured": float(measured),
                "predicted": predicted,
                "band_lo": lo,
                "band_hi": hi,
            }
        )
    return {"rows": rows, "warning": warning, "fit": fit.describe() if fit else None}


def replay(folder, target: float, lower_is_better: bool = False) -> dict:
    """One workload folder replayed: the JSON object ``hpclab plan --replay`` prints."""
    folder = Path(folder)
    step_rows = replay_steps(read_steps(folder))
    stats = replay_statistics(read_runs(folder), target, lower_is_better)
    held = [r for r in stats["rows"] if not r["fitted"]]
    outside = [r["batch"] for r in held if not r["band_lo"] <= r["measured"] <= r["band_hi"]]
    return {
        "step_time": step_rows,
        "steps_to_target": stats["rows"],
        "statistical_model_warning": stats["warning"],
        "summary": {
            "workload": folder.name,
            "target": target,
            "lower_is_better": lower_is_better,
            "step_time_at_16_gpus_or_more": step_errors(step_rows),
            "step_time_all_held_out": step_errors(step_rows, min_gpus=FIT_GPUS + 1),
            "statistical_fit": stats["fit"],
            "steps_held_out": len(held),
            "steps_outside_band": outside,
            "steps_max_error": max(
                (abs(r["predicted"] / r["measured"] - 1.0) for r in held), default=None
            ),
        },
    }


def _mlperf_steps(below, batch: int) -> tuple[float, float, float]:
    """Steps at ``batch`` from the runs ``below``: S = a + c/B through their distinct batches
    (least squares on relative residuals) where it exists, inside the hyperbola's bracket from
    the largest batch below (S·B rises, S falls); fewer than two batches: the bracket's middle."""
    by_batch = {r.global_batch: r.steps for r in below}
    b_max = max(by_batch)
    lo, hi = by_batch[b_max] * min(b_max / batch, 1.0), by_batch[b_max]
    predicted = math.sqrt(lo * hi)
    if len(by_batch) >= 2:
        b = np.array(sorted(by_batch), dtype=float)
        st = np.array([by_batch[x] for x in sorted(by_batch)])
        design = np.stack([np.ones_like(b), 1.0 / b], axis=1) / st[:, None]
        (a, c), *_ = np.linalg.lstsq(design, np.ones_like(st), rcond=None)
        if a > 0 and c > 0:
            predicted = min(max(a + c / batch, lo), hi)
    return predicted, lo, hi


def replay_mlperf(rows) -> list[dict]:
    """Each MLPerf run with two or more runs below it predicted from them: steps to the target
    (:func:`_mlperf_steps`) times seconds per step, affine in the local batch over the runs
    below (their communication included as measured there). MLPerf tuned LARS per scale:
    these steps follow that tuning, which is what the hyperbola assumes."""
    out = []
    for k, run in enumerate(rows):
        below = rows[:k]
        if len({r.global_batch // r.gpus for r in below}) < 2:
            continue
        steps, lo, hi = _mlperf_steps(below, run.global_batch)
        per_step = fit_affine(
            [r.global_batch / r.gpus for r in below], [r.step_s for r in below], "runs below"
        )
        step_s = float(per_step(run.global_batch / run.gpus))
        minutes = steps * step_s / 60.0
        out.append(
            {
                "gpus": run.gpus,
                "global_batch": run.global_batch,
                "fitted_on": [r.gpus for r in below],
                "measured_steps": run.steps,
                "predicted_steps": steps,
                "measured_minutes": run.minutes_median,
                "predicted_minutes": minutes,
                "band_lo_minutes": lo * step_s / 60.0,
                "band_hi_minutes": hi * step_s / 60.0,
                "measured_gpu_hours": run.gpu_hours,
                "predicted_gpu_hours": run.gpus * minutes / 60.0,
                "error": minutes / run.minutes_median - 1.0,
            }
        )
    return out


def shared_replay_errors(folder=None) -> dict:
    """The replay of every shared Pollux workload at :data:`SHARED_TARGETS`: per workload its
    step-time errors at ≥ 16 GPUs and whether the statistical model held; and the errors over
    every workload together (what ``hpclab plan`` prints beside a plan)."""
    root = Path(folder) if folder is not None else traces_dir() / "pollux-osdi21"
    per, errors = {}, []
    for name in POLLUX_WORKLOADS:
        out = replay(root / name, SHARED_TARGETS[name])
        per[name] = out["summary"]
        errors += [
            abs(r["predicted_s"] / r["measured_s"] - 1.0)
            for r in out["step_time"]
            if r["gpus"] >= EXTRAPOLATED_GPUS
        ]
    return {
        "workloads": per,
        "median": float(np.median(errors)),
        "p90": float(np.percentile(errors, 90)),
        "max_gpus": max(r.gpus for r in read_steps(root / POLLUX_WORKLOADS[0])),
    }


def error_sentence(errors: dict) -> str:
    """The replay's own error, as a plan prints it beside its prediction."""
    return (
        f"Checked against real clusters: step times predicted from 2 GPUs to "
        f"{EXTRAPOLATED_GPUS}-{errors['max_gpus']} were within {errors['median']:.0%} (median) / "
        f"{errors['p90']:.0%} (p90) on {len(errors['workloads'])} real workloads (Pollux OSDI'21 "
        "traces, T4 GPUs, PyTorch with overlapped allreduce; hpclab plan --replay)."
    )


__all__ = [
    "FIT_GPUS",
    "FIT_BATCHES",
    "EXTRAPOLATED_GPUS",
    "SHARED_TARGETS",
    "TraceHardware",
    "fit_trace_hardware",
    "replay_steps",
    "step_errors",
    "steps_band",
    "granularity",
    "hyperbola_warning",
    "replay_statistics",
    "replay_mlperf",
    "replay",
    "shared_replay_errors",
    "error_sentence",
]

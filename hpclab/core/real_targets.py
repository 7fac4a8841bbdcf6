"""The lab's lessons on real clusters, to a target: the critical batch of real training runs
(notebook 05) and a prediction of MLPerf's largest runs from its smallest (notebook 10), in the
:class:`hpclab.core.real_clusters.Section` form (figures rounded as printed, sentences, series).

Sources and where they differ from the lab (:mod:`hpclab.core.real_clusters` says more):

* Qiao et al., OSDI 2021 (Pollux): validation runs on T4s at 6-8 global batches, the learning
  rate adapted by AdaScale (one rule for every batch, not tuned per batch), with AdaptDL's
  gradient statistics (``grad_sqr``, ``grad_var``) at every evaluation.
* MLPerf Training v3.0, NVIDIA's ResNet-50 on DGX H100: epochs to 75.9 % top-1 and time to train
  (median of five runs, evaluation included) at 8, 64, 512 and 768 GPUs; MXNet, LARS tuned per
  scale by the submitter.
* McCandlish et al. 2018, arXiv:1812.06162: S(B) = S_min (1 + B_crit / B) with the learning rate
  tuned per batch (:mod:`hpclab.core.critical_batch`); B_simple = tr Σ / |G|² its predictor of
  B_crit, only roughly.

Pure: NumPy and SciPy only, reads the CSVs, writes nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hpclab.core.critical_batch import fit_critical_batch
from hpclab.core.real_clusters import MODELS, TARGETS, Section, line
from hpclab.core.replay import granularity, hyperbola_warning
from hpclab.core.traces import read_mlperf, read_runs, traces_dir

FITTED_GPUS = (8, 64)  # notebook 10: the MLPerf runs a prediction may see


def mlperf_inputs() -> tuple[str, ...]:
    """What notebook 10's student predicts from: the 8- and 64-GPU runs in full, and only the
    GPU count and global batch of the larger ones."""
    out = []
    for r in read_mlperf():
        if r.gpus in FITTED_GPUS:
            out.append(
                f"{r.gpus} GPUs: global batch {r.global_batch:,}, {r.epochs:.0f} epochs "
                f"({r.steps:,.0f} steps), {r.minutes_median:.2f} min to train "
                f"({r.step_s * 1e3:.2f} ms a step), {r.gpu_hours:.2f} GPU-hours"
            )
        else:
            out.append(f"{r.gpus} GPUs: global batch {r.global_batch:,} (predict the rest)")
    return tuple(out)


def predict_mlperf() -> Section:
    """Notebook 10: the 512- and 768-GPU runs predicted from the 8- and 64-GPU ones, as the
    planner would: seconds per step affine in the local batch through the two (their network
    included as measured), steps from the one batch they share bracketed by the hyperbola
    S(B) = S_min(1 + B_crit/B) (between perfect scaling, S·B constant, and none, S constant;
    the point prediction their geometric mean: :mod:`hpclab.core.replay`)."""
    rows = {r.gpus: r for r in read_mlperf()}
    fitted = [rows[g] for g in FITTED_GPUS]
    a, b = np.polyfit([r.global_batch / r.gpus for r in fitted], [r.step_s for r in fitted], 1)
    base = fitted[-1]
    f, series = {}, []
    for g in sorted(set(rows) - set(FITTED_GPUS)):
        r = rows[g]
        step_s = a * r.global_batch / r.gpus + b
        lo, hi = base.steps * min(base.global_batch / r.global_batch, 1.0), base.steps
        steps = math.sqrt(lo * hi)
        f |= {
            f"step_error_{g}": round(step_s / r.step_s - 1.0, 3),
            f"steps_{g}": round(steps),
            f"steps_measured_{g}": round(r.steps),
            f"minutes_{g}": round(steps * step_s / 60.0, 2),
            f"minutes_lo_{g}": round(lo * step_s / 60.0, 2),
            f"minutes_hi_{g}": round(hi * step_s / 60.0, 2),
            f"minutes_measured_{g}": round(r.minutes_median, 3),
            f"gpu_hours_{g}": round(g * steps * step_s / 3600.0, 2),
            f"gpu_hours_measured_{g}": round(r.gpu_hours, 2),
        }
        for what, pred, meas, band in (
            ("step time", step_s, r.step_s, None),
            ("steps", steps, r.steps, (lo, hi)),
            (
                "minutes",
                steps * step_s / 60.0,
                r.minutes_median,
                (lo * step_s / 60, hi * step_s / 60),
            ),
            (
                "GPU-hours",
                g * steps * step_s / 3600.0,
                r.gpu_hours,
                (g * lo * step_s / 3600, g * hi * step_s / 3600),
            ),
        ):
            series.append(
                {
                    "name": f"{g} GPUs: {what}",
                    "predicted": pred,
                    "measured": meas,
                    "band": band,
                    "kind": "ratio",
                }
            )
    small, large = rows[min(rows)], rows[max(rows)]
    f["speedup"] = round(small.minutes_median / large.minutes_median, 1)
    f["gpu_hours_ratio"] = round(large.gpu_hours / small.gpu_hours, 1)
    sentences = tuple(
        f"{g} GPUs: step time predicted {f[f'step_error_{g}']:+.1%} off; steps {f[f'steps_{g}']:,}"
        f" predicted, {f[f'steps_measured_{g}']:,} measured; {f[f'minutes_{g}']:.2f} min "
        f"predicted (band {f[f'minutes_lo_{g}']:.2f}-{f[f'minutes_hi_{g}']:.2f}), "
        f"{f[f'minutes_measured_{g}']:.3f} measured; {f[f'gpu_hours_{g}']:.2f} GPU-hours "
        f"predicted, {f[f'gpu_hours_measured_{g}']:.2f} measured."
        for g in sorted(set(rows) - set(FITTED_GPUS))
    ) + (
        f"From {small.gpus} to {large.gpus} GPUs MLPerf trained {f['speedup']}x faster for "
        f"{f['gpu_hours_ratio']}x the GPU-hours.",
    )
    return Section(f, sentences, tuple(series))


def _steps_points(workload: str, folder=None) -> tuple[dict[int, float], dict]:
    root = Path(folder) if folder is not None else traces_dir() / "pollux-osdi21"
    runs = read_runs(root / workload)
    return {b: float(runs[b].steps_to(TARGETS[workload])) for b in sorted(runs)}, runs


def b_simple_trace(runs) -> tuple[int, np.ndarray, np.ndarray]:
    """B_simple over training from the smallest-batch run, the one whose batch is B0 itself
    (:func:`hpclab.core.traces.Run.b_simple`): its batch, iterations and B_simple."""
    b0 = min(runs)
    run = runs[b0]
    bs = run.b_simple(b0)
    keep = np.isfinite(bs) & (bs > 0)
    return b0, run.iteration[keep], bs[keep]


def critical_batch(folder=None) -> Section:
    """Notebook 05: S(B) = S_min (1 + B_crit / B) fitted on Pollux's image workloads and on
    MLPerf's ResNet-50, and B_simple over training against each fitted B_crit."""
    f, sentences, series = {}, [], []
    for w in ("cifar10", "imagenet"):
        points, runs = _steps_points(w, folder)
        fit = fit_critical_batch(list(points), list(points.values()))
        b0, it, bs = b_simple_trace(runs)
        at = float(np.interp(points[b0], it, bs))  # B_simple where the B0 run reached the target
        # AdaScale, not a per-batch tuning: is E(B) = B·S(B) at least rising, as the curve says?
        bent = hyperbola_warning(
            list(points), list(points.values()), granularity(runs, points.items())
        )
        f |= {
            f"{w}_b_crit": round(fit.b_crit),
            f"{w}_b_crit_se": round(fit.b_crit_se),
            f"{w}_s_min": round(fit.s_min),
            f"{w}_rms": round(fit.rel_rms, 3),
            f"{w}_b_simple_first": round(float(bs[0])),
            f"{w}_b_simple_target": round(at),
            f"{w}_ratio": round(fit.b_crit / at, 2),
            f"{w}_samples_rise": bent is None,
        }
        sentences += [
            f"{MODELS[w]} to {TARGETS[w]:.0%} (T4s, AdaScale): B_crit = {f[f'{w}_b_crit']:,} ± "
            f"{f[f'{w}_b_crit_se']:,}, S_min = {f[f'{w}_s_min']:,} steps ({len(points)} batches "
            f"{min(points):,}-{max(points):,}; rms residual {f[f'{w}_rms']:.1%}).",
            f"Its B_simple (the batch-{b0} run) grows from {f[f'{w}_b_simple_first']:,} at the "
            f"first evaluation to {f[f'{w}_b_simple_target']:,} where that run reached the "
            f"target: B_crit / B_simple = {f[f'{w}_ratio']:.2f} there.",
        ]
        series += [
            line(MODELS[w], points, "steps", fit=fit),
            {
                "name": f"{MODELS[w]}, B_simple (batch {b0})",
                "x": it.tolist(),
                "y": bs.tolist(),
                "kind": "b_simple",
                "b_crit": fit.b_crit,
                "target_step": points[b0],
            },
        ]
    h100 = {r.global_batch: r.steps for r in read_mlperf()}  # 8 and 64 GPUs share 3,200
    fit = fit_critical_batch(list(h100), list(h100.values()))
    f |= {
        "mlperf_b_crit": round(fit.b_crit),
        "mlperf_b_crit_se": round(fit.b_crit_se),
        "mlperf_largest": max(h100),
    }
    sentences.append(
        f"ResNet-50 on DGX H100 (MLPerf, LARS tuned per scale), {len(h100)} batches "
        f"{min(h100):,}-{max(h100):,}: B_crit = {f['mlperf_b_crit']:,} ± "
        f"{f['mlperf_b_crit_se']:,} (one degree of freedom: a range, not a digit); its largest "
        f"batch, {f['mlperf_largest']:,} on 768 GPUs, is below it."
    )
    series.append(line("ResNet-50 on H100s (MLPerf)", h100, "steps", fit=fit))
    return Section(f, tuple(sentences), tuple(series))


__all__ = ["FITTED_GPUS", "mlperf_inputs", "predict_mlperf", "b_simple_trace", "critical_batch"]

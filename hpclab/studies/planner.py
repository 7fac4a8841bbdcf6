"""`plan(lab)`: a few minutes of measurement on a Lab, the two models fitted to it, and the plan of
an allocation (:mod:`hpclab.core.allocation`) — time to target and GPU-hours at scale.

What is measured (:func:`measure`, about three minutes on 2 cores with the default model) is
described in :mod:`hpclab.studies.plan_measure`: communication (the α/β sweep and the model's own
gradient allreduce held out), computation scalability, the 1-rank time split at a few local
batches, steps to target per batch at each batch's best LR, and B_simple where a run reaches the
target. This module fits the two models to it — compute and the rest affine in the local batch,
S(B) = S_min (1 + B_crit / B) (:mod:`hpclab.core.critical_batch`) — and plans.

Everything measured is a :class:`Measurements` (JSON: ``save``/``load``), so a plan can be
remade from a recorded measurement without engines. A target cluster's network and per-device
speed can be entered instead of this machine's (``network=``, ``device_samples_per_s=``); the
plan lists which numbers were measured here, which were entered and which extrapolated.
"""

from __future__ import annotations

import statistics as stats
from dataclasses import dataclass, replace
from pathlib import Path

from hpclab.core.allocation import Allocation, Assumption, plan_allocation
from hpclab.core.config import RunConfig
from hpclab.core.critical_batch import CriticalBatchFit, best_per_batch, fit_critical_batch
from hpclab.core.errors import ConfigError
from hpclab.core.hardware_model import (
    REST_PARTS,
    Affine,
    HardwareModel,
    Network,
    fit_affine,
    fit_link,
    load_balance_of,
)
from hpclab.studies.plan_measure import (
    TARGET,
    Measurements,
    b_simple_at,
    measure,
    measure_b_simple,
    measure_comm,
    measure_scalability,
    measure_splits,
    measure_sweep,
    steady_split,
    steps_to_reach,
)

PLAN_WORKERS = (1, 2, 4, 8, 16, 32, 64)
PLAN_BATCHES = (32, 64, 128, 256, 512, 1024, 2048)


# ---------------------------------------------------------------------------------------------
# fitting
# ---------------------------------------------------------------------------------------------


def computation_slowdown(splits) -> dict[int, float]:
    """s_c per local batch: a multi-rank time split's compute over the 1-rank split's at the same
    local batch (the median where a batch was run more than once), at least 1 (a ratio below is
    noise). POP's computation scalability inverted (Wagner, Mohr, Giménez and Labarta 2017;
    :mod:`hpclab.core.pop`), read from training steps: it includes whatever slows a rank's
    computation when the others train beside it (shared cores and caches, their Horovod loops)."""
    alone: dict[int, list[float]] = {}
    beside: dict[int, list[float]] = {}
    for s in splits:
        into = alone if s["workers"] == 1 else beside
        into.setdefault(int(s["local_batch"]), []).append(float(s["compute_ms"]))
    return {
        b: max(1.0, stats.median(many) / stats.median(alone[b]))
        for b, many in sorted(beside.items())
        if b in alone and stats.median(alone[b]) > 0
    }


def fit_hardware(
    m: Measurements,
    *,
    network: Network | None = None,
    device_samples_per_s: float | None = None,
    load_balance: float | None = None,
) -> HardwareModel:
    """The hardware model from the time splits (1-rank: compute and the rest; multi-rank: the
    computation slowdown, :func:`computation_slowdown`, and the load balance, the median of
    theirs) and the allreduce sweep.

    ``network`` replaces this machine's (a target cluster's links, entered); with
    ``device_samples_per_s`` the compute is a target device's rate instead of this CPU's, and no
    computation slowdown is assumed (each rank has a device of its own)."""
    ones = [s for s in m.splits if s["workers"] == 1]
    if len({s["local_batch"] for s in ones}) < 2:
        raise ConfigError(
            "splits must hold 1-rank time splits at 2 or more local batches to fit compute; "
            f"the measurement has {len(ones)}."
        )
    if not m.comm and network is None:
        raise ConfigError("comm must hold an allreduce sweep, or enter a network (network=...).")
    batches = [s["local_batch"] for s in ones]
    compute = fit_affine(
        batches, [s["compute_ms"] / 1e3 for s in ones], "measured: 1-rank time splits"
    )
    rest = fit_affine(
        batches,
        [max(sum(s[f"{p}_ms"] for p in REST_PARTS), 1e-6) / 1e3 for s in ones],
        "measured: 1-rank time splits",
    )
    ratios = computation_slowdown(m.splits)
    slowdown = stats.median(ratios.values()) if ratios else 1.0
    by_batch = tuple(sorted(ratios.items())) if len(ratios) > 1 else ()
    # POP's load balance of the multi-rank splits (their ranks' useful time), unless entered
    balances = [
        load_balance_of(s["rank_useful_ms"])
        for s in m.splits
        if s["workers"] > 1 and len(s.get("rank_useful_ms") or ()) > 1
    ]
    if load_balance is not None:
        lb_source = "entered"
    elif balances:
        load_balance, lb_source = stats.median(balances), "measured here"
    else:
        lb_source = "assumed 1.0"
    if device_samples_per_s is not None:
        compute = Affine.from_rate(device_samples_per_s, "entered: device rate")
        slowdown, by_batch = 1.0, ()
    if network is None:
        ranks = m.comm[0]["ranks"]
        link = fit_link(
            [c["bytes"] for c in m.comm],
            [c["seconds"] for c in m.comm],
            ranks,
            f"measured: allreduce sweep on {ranks} ranks",
        )
        network = Network(intra=link)
    notes = {
        "local_batches": batches,
        "ranks_measured": sorted({1, *(c["ranks"] for c in m.comm)}),
        "load_balance_source": lb_source,
    }
    return HardwareModel(
        compute=compute,
        rest=rest,
        network=network,
        gradient_bytes=float(m.gradient["bytes"]),
        load_balance=1.0 if load_balance is None else load_balance,
        compute_slowdown=slowdown,
        slowdown_by_batch=by_batch,
        notes=notes,
    )


def fit_statistics(m: Measurements) -> tuple[CriticalBatchFit, list]:
    """S(B) fitted to each batch's best-LR steps to target; the best-LR rows beside it."""
    best = best_per_batch((r["global_batch"], r["lr"], r["steps"]) for r in m.sweep)
    if len(best) < 3:
        raise ConfigError(
            f"sweep must reach the target {m.target:g} at 3 or more batches to fit the "
            f"critical batch; it did at {[b.batch for b in best]} (lower the target or train "
            "longer)."
        )
    return fit_critical_batch([b.batch for b in best], [b.steps for b in best]), best


def held_out_steps(best: list, batch: int) -> dict:
    """S(B) fitted to every best-LR point but ``batch``'s, and its prediction there against the
    steps measured at ``batch``: the statistical model checked on a point it was not fitted on.
    ``se`` is the prediction's standard error from the fit alone (the measured steps carry their
    own granularity: the evaluation interval)."""
    rest = [b for b in best if b.batch != batch]
    (left,) = [b for b in best if b.batch == batch] or [None]
    if left is None:
        have = [b.batch for b in best]
        raise ConfigError(f"batch {batch} has no best-LR steps to hold out; batches: {have}.")
    fit = fit_critical_batch([b.batch for b in rest], [b.steps for b in rest])
    predicted = fit.predict_steps(batch)
    return {
        "batch": batch,
        "predicted": predicted,
        "se": fit.steps_se(batch),
        "measured": left.steps,
        "error": predicted / left.steps - 1.0,
        "fitted_on": [b.batch for b in rest],
    }


def sweep_notes(best: list) -> list[Assumption]:
    """What the LR grid leaves open: batches whose best LR sat at the grid's edge."""
    edge = [f"{b.batch} (lr {b.lr:g})" for b in best if b.at_edge]
    if not edge:
        return [Assumption("measured here", "every batch's best LR lies inside its grid")]
    return [
        Assumption(
            "extrapolated",
            f"the best LR sat at the edge of its grid at batches {', '.join(edge)}: a wider "
            "grid may find fewer steps there",
        )
    ]


def noise_scale_notes(m: Measurements, fit: CriticalBatchFit) -> list[Assumption]:
    """The fitted B_crit beside B_simple measured where a run reached the target, or why not."""
    if not m.b_simple:
        why = "its run did not reach the target" if m.b_simple_at else "this measurement has none"
        return [Assumption("measured here", f"B_simple beside B_crit: not measured ({why})")]
    at = m.b_simple_at or {}
    where = (
        f" (at step {at['step']} of a {at['workers']}-rank run at batch {at['global_batch']})"
        if at.get("step") is not None
        else ""
    )
    return [Assumption("measured here", fit.compare_b_simple(m.b_simple)["sentence"] + where)]


@dataclass
class PlanResult:
    """The plan and everything behind it."""

    allocation: Allocation
    hardware: HardwareModel
    statistics: CriticalBatchFit
    best_lr: list
    measurements: Measurements

    @property
    def noise_scale(self) -> dict | None:
        """B_crit beside the measured B_simple (:meth:`CriticalBatchFit.compare_b_simple`), or
        None when the measurement holds no B_simple."""
        if not self.measurements.b_simple:
            return None
        return self.statistics.compare_b_simple(self.measurements.b_simple)


def plan(
    lab=None,
    *,
    measurements: Measurements | str | Path | None = None,
    cfg: RunConfig | None = None,
    workers=PLAN_WORKERS,
    batches=PLAN_BATCHES,
    target: float = TARGET,
    network: Network | None = None,
    device_samples_per_s: float | None = None,
    save: str | Path | None = None,
) -> PlanResult:
    """Measure on ``lab`` (or take a recorded ``measurements``), fit, and plan for every
    (workers, global batch) whose batch divides evenly: :class:`PlanResult`.

    >>> result = hpclab.plan(lab)                       # ~3 min of measurement here
    >>> print(result.allocation.paragraph)
    >>> hpclab.plan(measurements="plan.json", network=Network(...), device_samples_per_s=900)
    """
    if measurements is None:
        if lab is None:
            raise ConfigError("plan needs a lab to measure on, or measurements= recorded ones.")
        measurements = measure(lab, cfg, target=target)
    elif not isinstance(measurements, Measurements):
        measurements = Measurements.load(measurements)
    if save is not None:
        measurements.save(save)
    hardware = fit_hardware(
        measurements, network=network, device_samples_per_s=device_samples_per_s
    )
    statistics, best = fit_statistics(measurements)
    allocation = plan_allocation(
        hardware,
        statistics,
        workers,
        batches,
        target=f"held-out accuracy {measurements.target:g} ({measurements.model})",
        notes=[*sweep_notes(best), *noise_scale_notes(measurements, statistics)],
    )
    return PlanResult(allocation, hardware, statistics, best, measurements)


def plan_from_trace(
    folder: str | Path,
    target: float,
    *,
    lower_is_better: bool = False,
    workers=PLAN_WORKERS,
    batches=None,
    per_node: int | None = None,
) -> PlanResult:
    """The plan from someone else's measurements in the trace format (:mod:`hpclab.core.traces`:
    ``placements.csv`` timed on one and two GPUs of their cluster, in any framework, and
    ``validation-<B>.csv`` runs): the hardware model fitted exactly as the replay fits it (on
    the rows with at most 2 GPUs, :func:`hpclab.core.replay.fit_trace_hardware`, so the
    replay's error is this plan's), S(B) fitted on every batch that reached ``target``.

    ``per_node`` GPUs a node (default: the fullest node of the trace); the overlap window is the
    network's (the plan's placements cross nodes). ``batches`` default to the trace's batches
    and 2x, 4x, 8x its largest."""
    from hpclab.core.replay import FIT_GPUS, fit_trace_hardware, granularity, hyperbola_warning
    from hpclab.core.traces import read_runs, read_steps

    steps = read_steps(folder)
    fit = fit_trace_hardware(steps)
    per_node = per_node or max(r.per_node for r in steps)
    hardware = fit.model(nodes=2, per_node=per_node)
    fitted_batches = sorted({r.local_batch for r in steps if r.gpus == 1})
    fitted = {"local_batches": fitted_batches, "ranks_measured": [1, FIT_GPUS]}
    hardware = replace(hardware, notes=fitted)
    runs = read_runs(folder)
    reached = [(b, runs[b].steps_to(target, lower_is_better)) for b in sorted(runs)]
    reached = [(b, s) for b, s in reached if s]
    if len(reached) < 3:
        raise ConfigError(
            f"the target {target:g} is reached at {len(reached)} of the trace's batches; the "
            "plan needs 3 (pick a target more runs reach)."
        )
    statistics = fit_critical_batch(*zip(*reached))
    notes = [
        Assumption(
            "entered",
            f"measured elsewhere: {Path(folder).name}'s trace, hardware fitted on its rows of "
            f"1-{FIT_GPUS} GPUs ({per_node} GPUs a node; the gradient is the unit of bytes, "
            f"overlap window {fit.phi_inter:.2f} of compute)",
        )
    ]
    warning = hyperbola_warning(*zip(*reached), granularity(runs, reached))
    if warning:
        notes.append(Assumption("extrapolated", warning))
    if batches is None:
        biggest = max(b for b, _ in reached)
        batches = sorted({b for b, _ in reached} | {biggest * k for k in (2, 4, 8)})
    allocation = plan_allocation(
        hardware,
        statistics,
        workers,
        batches,
        target=f"{target:g} of {Path(folder).name}'s metric",
        notes=notes,
    )
    return PlanResult(allocation, hardware, statistics, [], None)


__all__ = [
    "plan_from_trace",
    "Measurements",
    "PlanResult",
    "measure",
    "measure_comm",
    "measure_scalability",
    "measure_splits",
    "measure_sweep",
    "computation_slowdown",
    "fit_hardware",
    "fit_statistics",
    "plan",
    "steps_to_reach",
    "steady_split",
    "b_simple_at",
    "measure_b_simple",
    "noise_scale_notes",
    "held_out_steps",
]

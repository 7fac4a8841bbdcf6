"""Where a step's time goes, and the POP efficiencies that say why a run does not scale.

Each rank times the parts of its optimizer steps inside the compiled call
(:mod:`hpclab.rank.step`) and the host time between calls; this module turns one window of those
per-rank seconds into the split the dashboard stacks and into the multiplicative efficiency model
of the POP Centre of Excellence (Performance Optimisation and Productivity; "POP standard metrics
for parallel performance analysis", https://pop-coe.eu; Wagner, Mohr, Giménez and Labarta, "A
structured approach to performance analysis", Tools for High Performance Computing 2017)::

    load balance            LB  = mean_r(useful_r) / max_r(useful_r)
    communication efficiency CommE = max_r(useful_r) / T
    parallel efficiency      PE  = LB x CommE = mean_r(useful_r) / T
    input share                  mean_r(input_r) / T  (the step waiting for its data)

``useful_r`` is rank r's time outside communication (the loop, input, forward/backward, the
optimizer's update and the host's Python between calls) and ``T`` the window's wall time (the busiest rank's
total). The allreduce *includes the wait for the slowest rank*: a straggler shows as the others'
communication time, hence as a lower LB. NumPy only: unit-tested without TensorFlow.
"""

from __future__ import annotations

import numpy as np

#: The parts of a window's time, in the order the dashboard stacks them; ``useful`` marks the
#: ones POP counts as computation (everything but communication).
PARTS = {
    "loop": ("the loop between two steps: its condition, the running sums, the step index", True),
    "input": ("batch cut from the resident shard", True),
    "compute": ("forward and backward (and a straggler's extra time)", True),
    "allreduce": ("gradient allreduce, including the wait for the slowest rank", False),
    "apply": ("the optimizer's update", True),
    "sync": ("rest of the call: the telemetry allreduce, graph dispatch", False),
    "host": ("between calls: Python, telemetry, publishing (evaluation apart)", True),
}
USEFUL = tuple(name for name, (_, useful) in PARTS.items() if useful)
#: The parts a rank times inside its compiled step (hpclab.rank.step), in PARTS order: the one
#: list of their names, which the step's timestamps, the meters' columns and :func:`split` share.
#: The other two are not timed there: ``sync`` is the call's rest, ``host`` the host's clock.
STEP_PARTS = tuple(name for name in PARTS if name not in ("sync", "host"))


def split(seconds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-rank seconds of every part in :data:`PARTS` from the raw window sums.

    ``seconds`` holds arrays over ranks: every part of :data:`STEP_PARTS` (timed inside the
    call), ``call`` (the call as the host timed it) and ``host``.
    ``sync`` is what the call took beyond its timed parts (never negative: timer resolution can
    make it so by a µs).
    """
    timed = sum(np.asarray(seconds[n], dtype=float) for n in STEP_PARTS)
    out = {name: np.asarray(seconds[name], dtype=float) for name in PARTS if name != "sync"}
    out["sync"] = np.maximum(np.asarray(seconds["call"], dtype=float) - timed, 0.0)
    return {name: out[name] for name in PARTS}


def efficiencies(parts: dict[str, np.ndarray]) -> dict[str, float]:
    """POP's load balance, communication and parallel efficiency of one window (module doc),
    and the share of the window the ranks spent producing their batches (``input_share``).

    NaN when the window holds no time at all (nothing to judge)."""
    useful = sum(np.asarray(parts[name], dtype=float) for name in USEFUL)
    total = sum(np.asarray(parts[name], dtype=float) for name in PARTS)
    T = float(np.max(total, initial=0.0))
    top = float(np.max(useful, initial=0.0))
    if T <= 0 or top <= 0:
        nan = float("nan")
        keys = ("load_balance", "comm_efficiency", "parallel_efficiency", "input_share")
        return dict.fromkeys(keys, nan)
    lb, comm = float(np.mean(useful)) / top, top / T
    return {
        "load_balance": lb,
        "comm_efficiency": comm,
        "parallel_efficiency": lb * comm,
        # not a POP factor: the input pipeline lesson's "the step waits X % for its data"
        "input_share": float(np.mean(np.asarray(parts["input"], dtype=float))) / T,
    }


def weak_scaling_factors(reference: dict, run: dict) -> dict[str, float]:
    """POP's factors of a weak-scaling efficiency, from two runs' time splits (``time_columns``:
    per-rank ``rank_<part>_ms`` per step) at the same per-rank batch: ``reference`` on fewer
    ranks (usually one), ``run`` on more. POP's global efficiency is parallel efficiency times
    computation scalability (Wagner et al. 2017; the POP metrics, pop-coe.eu)::

        computation scalability  CompScal = mean_r(useful_r | reference) / mean_r(useful_r | run)
        E = T_ref / T_run = LB x CommE x CompScal / PE_ref

    per step, with ``T`` the busiest rank's total (the split's own clock) and ``PE_ref`` the
    reference's parallel efficiency (below 1 even on one rank: the call's untimed rest). With
    equal work per rank, CompScal < 1 means each rank's own work got slower when more ranks ran
    at once (shared cores, memory bandwidth, caches): not communication, not imbalance. The
    factors multiply to ``efficiency`` exactly; a throughput-measured E(N) differs from it by
    what the split's clock does not see (evaluation, the first window)."""

    def parts(split: dict) -> dict[str, np.ndarray]:
        return {name: np.asarray(split[f"rank_{name}_ms"], dtype=float) for name in PARTS}

    ref, new = parts(reference), parts(run)
    useful = {k: sum(v[name] for name in USEFUL) for k, v in (("ref", ref), ("new", new))}
    pe_ref, pe = efficiencies(ref), efficiencies(new)
    comp = float(np.mean(useful["ref"])) / float(np.mean(useful["new"]))
    factors = {
        "load_balance": pe["load_balance"],
        "comm_efficiency": pe["comm_efficiency"],
        "computation_scalability": comp,
        "reference_parallel_efficiency": pe_ref["parallel_efficiency"],
    }
    factors["efficiency"] = (
        factors["load_balance"] * factors["comm_efficiency"] * comp / pe_ref["parallel_efficiency"]
    )
    return factors


def straggler_factor(slowdown_pct: float) -> float:
    """Extra compute time, as a fraction of the step's own, of a rank running at
    ``100 - slowdown_pct`` percent of its speed: 30 % slower speed means 1/0.7 = 1.43x the time,
    so 0.43 extra. (Two equal ranks, one at 70 % speed: LB = (1 + 1.43) / 2 / 1.43 = 0.85.)"""
    return 1.0 / (1.0 - slowdown_pct / 100.0) - 1.0


__all__ = [
    "PARTS",
    "STEP_PARTS",
    "USEFUL",
    "split",
    "efficiencies",
    "weak_scaling_factors",
    "straggler_factor",
]

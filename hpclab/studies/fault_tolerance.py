"""What fault tolerance costs, and a run that survives a lost rank: the numbers of notebook 11.

**Checkpoint cost.** A checkpoint costs ``C`` seconds (rank 0 writes the whole state while the
other ranks wait at the next allreduce); with failures arriving at a mean time between failures
``M`` (exponential), checkpointing every ``τ`` seconds of work loses, to first order, the writes
``C/τ`` plus, per failure, half an interval of work redone: ``(τ + C) / (2M)`` of the time
(:func:`waste`). Its minimum is Young's interval ``τ = sqrt(2 C M)`` (J. W. Young, "A first
order approximation to the optimum checkpoint interval", Communications of the ACM 17(9):530-531,
1974; :func:`young_interval`); Daly's higher-order estimate adds the terms that matter when
``C`` is not small against ``M`` (J. T. Daly, "A higher order estimate of the optimum
checkpoint interval for restart dumps", Future Generation Computer Systems 22(3):303-312, 2006;
:func:`daly_interval`). Both assume the failure rate of the whole job: ``N`` nodes of MTBF
``m`` each give ``M = m / N``, so the interval shrinks as ``1/sqrt(N)`` at scale.

:func:`cost_table` reads ``C`` and the step time from runs' own summaries (the rank-0
``checkpoints`` entry: written, seconds, bytes; the throughput, which excludes the writes).

**A lost rank.** :func:`lose_a_rank` trains a run with checkpoints, kills one rank (SIGKILL, as an
out-of-memory kill or a dead node would) once the run is past its first checkpoint, restarts the
lab on the ranks it has left, and resumes the run there by a rule of
:mod:`hpclab.cluster.resume` (keep the global batch, or keep each rank's batch and let the run's
LR rule follow); the record's ``resumed`` entry says which.
"""

from __future__ import annotations

import math
import os
import signal
import threading

import pandas as pd

from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError, RunFailed
from hpclab.records.store import load_run

TIMEOUT_S = 600.0


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young (1974): the checkpoint interval that minimises the first-order waste,
    ``sqrt(2 C M)`` seconds of work between checkpoints."""
    _check(cost_s, mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly (2006), eq. 37: ``sqrt(2CM)·[1 + sqrt(C/2M)/3 + (C/2M)/9] − C`` for ``C < 2M``,
    else ``M`` (checkpointing costs more than the work it saves)."""
    _check(cost_s, mtbf_s)
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    r = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - cost_s


def waste(interval_s: float, cost_s: float, mtbf_s: float) -> float:
    """The first-order fraction of a job's time lost to checkpoints and to work redone after
    failures, checkpointing every ``interval_s`` seconds of work (Young 1974)."""
    _check(cost_s, mtbf_s)
    if interval_s <= 0:
        raise ConfigError(f"interval_s must be > 0 seconds; you passed {interval_s!r}.")
    return cost_s / interval_s + (interval_s + cost_s) / (2.0 * mtbf_s)


def _check(cost_s: float, mtbf_s: float) -> None:
    for name, value in (("cost_s", cost_s), ("mtbf_s", mtbf_s)):
        if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ConfigError(
                f"{name} must be a finite number of seconds > 0; you passed {value!r}."
            )


def cost_table(runs) -> pd.DataFrame:
    """One row per run (a Run or RunRecord) with checkpoints, as recorded: model, workers,
    checkpoint size (MB), the mean rank-0 write (s), the step time (s; from the throughput,
    which leaves the writes out) and their ratio — how many steps one checkpoint costs."""
    rows = []
    for r in (load_run(run.path) for run in runs):
        s = r.summary
        ck = s.get("checkpoints") or {}
        if not ck.get("written") or not s.get("samples_per_sec"):
            continue
        global_batch = r.config["batch_per_worker"] * s["world_size"]
        step_s = global_batch / s["samples_per_sec"]
        write_s = ck["seconds"] / ck["written"]
        rows.append(
            {
                "model": r.config["model"],
                "workers": s["world_size"],
                "checkpoint_MB": ck["bytes"] / 1e6,
                "writes": ck["written"],
                "write_s": write_s,
                "step_s": step_s,
                "steps_per_write": write_s / step_s,
            }
        )
    return pd.DataFrame(rows)


def intervals(cost_s: float, mtbf_hours=(1, 24, 24 * 30, 24 * 365)) -> pd.DataFrame:
    """Young's and Daly's intervals and the waste at Young's, for a checkpoint of ``cost_s``
    seconds against job MTBFs from an hour (thousands of nodes) to a year (one node)."""
    rows = []
    for hours in mtbf_hours:
        mtbf = 3600.0 * hours
        young = young_interval(cost_s, mtbf)
        rows.append(
            {
                "job_mtbf_h": hours,
                "young_interval_s": young,
                "daly_interval_s": daly_interval(cost_s, mtbf),
                "waste_at_young": waste(young, cost_s, mtbf),
            }
        )
    return pd.DataFrame(rows)


def lose_a_rank(
    lab, cfg: RunConfig, rule: str = "keep_per_rank_batch", timeout: float = TIMEOUT_S
) -> tuple:
    """Train ``cfg`` (it must checkpoint) on ``lab``, kill its last rank once a history row past
    the first checkpoint arrives, restart the lab on one rank fewer and resume by ``rule``.
    Returns (the failed Run, the resumed Run), both ended; the lab is left on the smaller world
    (``lab.restart(workers=...)`` to grow it again)."""
    every = cfg.checkpoint_every
    if not every or lab.workers < 2:
        raise ConfigError(
            "lose_a_rank needs checkpoint_every > 0 and a lab of at least 2 workers; you "
            f"passed checkpoint_every={every} on {lab.workers} workers."
        )
    run = lab.run(cfg)
    past = threading.Event()
    run.on_update(lambda r: r.last_row is not None and r.last_row["step"] > every and past.set())
    if not past.wait(timeout):
        run.stop(timeout=30)
        raise RunFailed(f"run {run.run_id} sent no row past step {every} in {timeout:.0f} s.")
    os.kill(lab.ranks[-1]["pid"], signal.SIGKILL)  # an out-of-memory kill, a dead node
    run.wait(timeout, check=False)
    lab.restart(workers=lab.workers - 1)  # the ranks it has
    resumed = lab.run(resume=run, rescale=rule)
    resumed.wait(timeout)
    return run, resumed


__all__ = [
    "cost_table",
    "daly_interval",
    "intervals",
    "lose_a_rank",
    "waste",
    "young_interval",
]

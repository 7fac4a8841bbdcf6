"""What :func:`hpclab.plan` measures on a Lab, as :class:`Measurements` (JSON: ``save``/``load``).

The stages (about three minutes on 2 cores with the default model; :mod:`hpclab.studies.planner`
fits and plans from them):

* **communication**, on the lab's 2+ ranks: the bytes of the model's gradients, an allreduce
  size sweep that α and β are fitted to (each size cut into as many tensors as the model has
  gradients), and — held out of that fit, timed in the same rounds — one grouped allreduce of
  tensors shaped like the gradients (:mod:`hpclab.rank.probes.gradient_size`). The sweep
  allreduces as a training step does (grouped, averaged, inside a compiled function), not as
  :mod:`comm_probe` does (eager): on a busy machine the compiled call's hand-over to Horovod's
  background loop adds milliseconds the eager sweep never sees;
* **computation scalability**, on the same ranks: time-split runs at the time split's local
  batches (:func:`measure_scalability`); the ranks' mean compute there over the 1-rank compute
  at the same batch is the slowdown the model multiplies compute by at more than one rank. It is
  read from training steps, not from a probe: on 2 cores a training step with no allreduce ran
  as fast beside the other rank as alone (0.98-1.05x at local batch 16, 64, 256, measured),
  while the training step's compute slowed 1.2-1.6x once the ranks' Horovod loops run beside
  it; the model's 2-rank step is checked at local batches these runs never used
  (tests/test_planner.py);
* **the time split**, on one rank: the same short runs, each part of the step
  (:mod:`hpclab.core.pop`), the median of the run's steady telemetry windows; each run lasts
  until it has them (:func:`measure_splits`), not for a fixed number of steps;
* **steps to target**, on one rank (steps to a target do not depend on how many ranks compute
  the batch): a small grid of learning rates per global batch, each run stopped when its
  held-out accuracy first reaches the target;
* **the gradient noise scale** B_simple where a run first reaches the target, on the lab's own
  ranks (the estimator needs two or more), to set beside the fitted critical batch.
"""

from __future__ import annotations

import json
import math
import statistics as stats
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpclab.core.config import RunConfig
from hpclab.core.critical_batch import best_per_batch
from hpclab.core.errors import ConfigError, LabError
from hpclab.core.pop import PARTS, USEFUL

LOCAL_BATCHES = (16, 64, 256)  # the time split's local batches (rows of the affine fits)
SPLIT_WINDOWS = 8  # steady telemetry windows each time-split run measures (its median's sample)
SPLIT_PUBLISH_S = 0.2  # their length: a time-split run lasts ~2 x 8 x 0.2 s after its first call
SPLIT_TIMEOUT_S = 120.0  # a time-split run still short of them by then ends with what it has
SWEEP_BATCHES = (32, 64, 128, 256)  # global batches of the steps-to-target sweep
CRITICAL_BATCHES = (32, 64, 128, 256, 512, 1024)  # notebooks 02/05: past the bend, to the flat
LR_FACTORS = (1.0, 2.0, 4.0)  # × the square-root rule's LR at each batch: the per-batch grid
TARGET = 0.8  # held-out accuracy the default model reaches at every sweep batch
COMM_SIZES = tuple(2**k for k in range(10, 23, 2))  # 1 KiB .. 4 MiB: the α/β fit's sizes


@dataclass
class Measurements:
    """What :func:`measure` measured, as plain JSON-able values."""

    model: str
    target: float
    gradient: dict = field(default_factory=dict)  # bytes, tensors, parameters
    comm: list[dict] = field(default_factory=list)  # bytes, seconds, ranks (the α/β fit)
    gradient_allreduce: dict | None = None  # bytes, seconds, ranks: held out of the fit
    # workers, local_batch, step_ms, each part's ms: 1-rank rows fit compute and the rest; the
    # lab's multi-rank rows give the computation slowdown
    splits: list[dict] = field(default_factory=list)
    sweep: list[dict] = field(default_factory=list)  # global_batch, lr, steps (None: missed)
    b_simple: float | None = None  # the gradient noise scale where a run first reached the target
    b_simple_at: dict | None = None  # that run: global_batch, lr, step, workers
    seconds: dict = field(default_factory=dict)  # how long each stage took

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Measurements:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        # older measurements carry a forward/backward probe's timings, which the model no longer
        # reads (module doc: the slowdown comes from multi-rank time splits)
        data.pop("compute_share", None)
        return cls(**data)


# ---------------------------------------------------------------------------------------------
# measuring on a lab
# ---------------------------------------------------------------------------------------------


def _need_ranks(lab, at_least: int, what: str) -> None:
    if lab.workers < at_least:
        raise LabError(
            f"{what} needs a lab of at least {at_least} ranks; this one has {lab.workers} "
            f"(lab.restart(workers={at_least}))."
        )


def measure_comm(lab, cfg: RunConfig, m: Measurements, sizes=COMM_SIZES) -> None:
    """The gradient bytes, the allreduce sweep and the held-out gradient allreduce (≥ 2 ranks)."""
    from hpclab.rank.probes import gradient_size

    _need_ranks(lab, 2, "measuring communication")
    d, data_dir = cfg.to_dict(), str(lab.data_dir)
    m.gradient = lab.apply(gradient_size.gradient_layout, d, data_dir)[0]
    per_rank = lab.apply(gradient_size.allreduce_times, d, data_dir, [int(s) for s in sizes])
    ranks = per_rank[0]["ranks"]
    m.comm = [
        {
            "bytes": rows[0]["bytes"],
            "ranks": ranks,
            "seconds": stats.median(r["seconds"] for r in rows),
        }
        for rows in zip(*(r["sweep"] for r in per_rank), strict=True)
    ]
    m.gradient_allreduce = {
        "bytes": per_rank[0]["gradients"]["bytes"],
        "ranks": ranks,
        "seconds": stats.median(r["gradients"]["seconds"] for r in per_rank),
    }


def measure_scalability(lab, cfg: RunConfig, m: Measurements, local_batches=LOCAL_BATCHES):
    """Time-split runs on the lab's 2+ ranks at ``local_batches``, added to ``m.splits``: their
    compute over the 1-rank splits' at the same batch is the computation slowdown
    (:func:`hpclab.studies.planner.computation_slowdown`)."""
    _need_ranks(lab, 2, "measuring computation scalability")
    m.splits = [s for s in m.splits if s["workers"] != lab.workers]
    m.splits += measure_splits(lab, cfg, local_batches)


def split_config(cfg: RunConfig, local_batch: int) -> RunConfig:
    """A timing run: no evaluation, no noise scale, telemetry windows of SPLIT_PUBLISH_S; long
    enough for any machine (:func:`measure_splits` stops it once it has what it needs)."""
    return cfg.replace(
        batch_per_worker=int(local_batch),
        epochs=max(cfg.epochs, 1000),
        max_steps=200_000,  # (the timeout ends it first on any machine we know)
        eval_every=0,
        noise_scale=False,
        time_split=True,
        publish_every_s=SPLIT_PUBLISH_S,
        name=f"planner: time split, local batch {local_batch}",
    )


def second_half(history):
    """The telemetry rows of the run's second half by step: its steady part (the first steps pay
    for Horovod's first negotiations, warm caches and the host's side of the call warming up)."""
    return history[history["step"] >= history["step"].max() / 2]


def steady_split(history, summary: dict) -> dict[str, float]:
    """Each part of the step in ms over the run's second half: the median of the telemetry
    windows there (the first steps pay for Horovod's first negotiations and warm caches, and a
    busy machine's spikes stay out of a median), else the summary's whole-run means."""
    parts = ("step", *(p for p in PARTS))
    cols = [f"{p}_ms" for p in parts]
    if history is not None and len(history) and all(c in history for c in cols):
        late = second_half(history)[cols].astype(float).dropna()
        if len(late) >= 3:
            return {c: float(late[c].median()) for c in cols}
    split = summary.get("time_split") or {}
    return {c: float(split[c]) for c in cols}


def run_until_windows(lab, cfg: RunConfig, windows: int, timeout: float = SPLIT_TIMEOUT_S):
    """Run `cfg` until its second half holds `windows` telemetry windows (2 x windows + 1 rows:
    the first holds the traced first call), then stop it: a measurement sized by what it needs,
    so a faster machine gives the same windows sooner rather than too few. (A fixed step count
    gave 0.4-1.2 s runs here, one or two 0.5-s windows, and the whole-run means with the first
    steps in them: the 2-rank step at local batch 256 read 2.8 and 4.9 ms in two repeats.)
    Bounded by `timeout` s; returns (run, summary)."""
    run = lab.run(cfg)
    enough = threading.Event()
    rows_needed = 2 * windows + 1

    def check(r) -> None:
        # (rows_since returns the count of rows taken so far; from past the end it copies none)
        if r.done or r.rows_since(sys.maxsize)[1] >= rows_needed:
            enough.set()

    run.on_update(check)
    enough.wait(timeout)
    run.stop(timeout=60)
    return run, run.wait(timeout=120)


def measure_splits(lab, cfg: RunConfig, local_batches=LOCAL_BATCHES) -> list[dict]:
    """Timing runs on the lab's ranks, each until it has SPLIT_WINDOWS steady windows: each
    part of the step in ms (mean over ranks, :func:`steady_split`) and each rank's useful ms
    (for POP's load balance)."""
    out = []
    for b in local_batches:
        run, summary = run_until_windows(lab, split_config(cfg, b), SPLIT_WINDOWS)
        split = summary.get("time_split") or {}
        if not split:
            raise LabError(f"the time-split run {run.run_id} recorded no time split.")
        row = {"workers": lab.workers, "local_batch": int(b), "run_id": run.run_id}
        row.update(steady_split(run.history, summary))
        per_rank = [split[f"rank_{p}_ms"] for p in USEFUL]
        row["rank_useful_ms"] = [float(sum(v)) for v in zip(*per_rank, strict=True)]
        out.append(row)
    return out


def sweep_lr(global_batch: int, factor: float, base_lr: float, base_batch: int) -> float:
    """The grid's LR: ``factor`` × the square-root rule's LR at ``global_batch``."""
    return round(factor * base_lr * math.sqrt(global_batch / base_batch), 6)


def steps_to_reach(history, target: float) -> int | None:
    """The first evaluated step whose held-out accuracy ≥ target (None if never)."""
    if history is None or "eval_accuracy" not in history or "step" not in history:
        return None
    hit = history[history["eval_accuracy"].astype(float) >= target]
    return int(hit["step"].iloc[0]) if len(hit) else None


def _run_to_target(lab, cfg: RunConfig, target: float) -> tuple[int | None, str, str]:
    """Run ``cfg`` until its held-out accuracy first reaches ``target`` (then stop it)."""
    run = lab.run(cfg)
    while not run.done:
        if steps_to_reach(run.history, target) is not None:
            run.stop()
            break
        time.sleep(0.2)
    summary = run.wait(check=False)
    return steps_to_reach(run.history, target), str(summary.get("status")), run.run_id


def _middle_first(factors) -> list[float]:
    """The grid's factors, the one nearest its geometric middle first, then outwards."""
    mid = sum(math.log(f) for f in factors) / len(factors)
    return sorted(factors, key=lambda f: (abs(math.log(f) - mid), f))


def measure_sweep(
    lab,
    cfg: RunConfig,
    batches=SWEEP_BATCHES,
    factors=LR_FACTORS,
    target: float = TARGET,
    *,
    prune: bool = False,
) -> list[dict]:
    """Steps to ``target`` for each global batch and each LR of its grid, on the lab's ranks.

    With ``prune``, the grid's middle LR runs first and every later run at that batch is capped
    at the fewest steps any LR has needed there so far (``limit``): a run still short of the
    target by then cannot be the batch's best, so its steps are not needed (None, as for a
    miss) and the sweep costs about three best runs per batch instead of the slowest three."""
    rows = []
    for batch in batches:
        if batch % lab.workers:
            raise ConfigError(
                f"batches must divide evenly over the lab's {lab.workers} ranks; {batch} does not."
            )
        best = None
        for factor in _middle_first(factors) if prune else factors:
            lr = sweep_lr(batch, factor, cfg.base_lr, cfg.base_batch)
            run_cfg = cfg.replace(
                batch_per_worker=batch // lab.workers,
                base_lr=lr,
                base_batch=batch,
                lr_scaling="none",
                eval_every=10,
                noise_scale=False,
                name=f"planner: steps to {target:g}, batch {batch}, lr {lr:g}",
            )
            if prune and best is not None:
                run_cfg = run_cfg.replace(max_steps=best)
            steps, status, run_id = _run_to_target(lab, run_cfg, target)
            rows.append(
                {
                    "global_batch": batch,
                    "lr": lr,
                    "steps": steps,
                    "status": status,
                    "run_id": run_id,
                    "limit": run_cfg.max_steps or None,
                }
            )
            if steps is not None and (best is None or steps < best):
                best = steps
    if prune:
        rows.sort(key=lambda r: (r["global_batch"], r["lr"]))
    return rows


def sweep_path(runs_dir: str | Path, cfg: RunConfig, target: float = TARGET) -> Path:
    """Where notebooks 02 and 05 keep their per-batch LR sweep (one file per seed and target)."""
    return Path(runs_dir) / f"critical-batch-sweep-{cfg.model}-seed{cfg.seed}-{target:g}.json"


def sweep_or_load(
    lab, cfg: RunConfig, *, batches=CRITICAL_BATCHES, factors=LR_FACTORS, target=TARGET
) -> tuple[Measurements, str]:
    """The per-batch LR sweep (:func:`measure_sweep`, pruned) on ``lab``, saved beside its runs
    (:func:`sweep_path`), or the one saved there already for the same model, seed, target and
    batches: the Measurements and a sentence saying which."""
    path = sweep_path(lab.runs_dir, cfg, target)
    if path.exists():
        m = Measurements.load(path)
        if sorted({r["global_batch"] for r in m.sweep}) == sorted(batches):
            return m, f"reused the sweep saved in {path.name} ({len(m.sweep)} runs)"
    m = Measurements(model=cfg.model, target=float(target))
    t0 = time.monotonic()
    m.sweep = measure_sweep(lab, cfg, batches, factors, target, prune=True)
    m.seconds["sweep"] = time.monotonic() - t0
    m.save(path)
    return m, f"measured {len(m.sweep)} runs in {m.seconds['sweep']:.0f} s, saved to {path.name}"


def best_lr_table(m: Measurements, samples_per_sec=None):
    """Each batch's best LR from the sweep: steps and samples (B × steps) to the target, and,
    given ``samples_per_sec`` by global batch (short throughput runs), the time per step
    (B ÷ samples/s) and the time to target (steps × time per step)."""
    import pandas as pd

    best = best_per_batch((r["global_batch"], r["lr"], r["steps"]) for r in m.sweep)
    table = pd.DataFrame(
        {
            "global_batch": [b.batch for b in best],
            "best_lr": [b.lr for b in best],
            "lr_at_grid_edge": [b.at_edge for b in best],
            "steps": [b.steps for b in best],
            "samples": [b.batch * b.steps for b in best],
        }
    )
    if samples_per_sec is not None:
        rate = table["global_batch"].map(dict(samples_per_sec)).astype(float)
        table["step_ms"] = 1e3 * table["global_batch"] / rate
        table["time_to_target_s"] = table["steps"] * table["step_ms"] / 1e3
    return table


def measure(
    lab,
    cfg: RunConfig | None = None,
    *,
    target: float = TARGET,
    local_batches=LOCAL_BATCHES,
    sweep_batches=SWEEP_BATCHES,
    lr_factors=LR_FACTORS,
) -> Measurements:
    """The whole measurement on ``lab`` (≥ 2 ranks to start with; module doc). The lab is
    restarted on one rank for the time split and the sweep, then back on its own size."""
    cfg = cfg or RunConfig()
    _need_ranks(lab, 2, "the planner's measurement")
    m = Measurements(model=cfg.model, target=float(target))
    size = lab.workers
    t0 = time.monotonic()
    measure_comm(lab, cfg, m)
    m.seconds["communication"] = time.monotonic() - t0
    t0 = time.monotonic()
    measure_scalability(lab, cfg, m, local_batches)
    m.seconds["computation scalability"] = time.monotonic() - t0
    t0 = time.monotonic()
    lab.restart(workers=1)
    m.splits += measure_splits(lab, cfg, local_batches)
    m.seconds["time split"] = time.monotonic() - t0
    t0 = time.monotonic()
    m.sweep = measure_sweep(lab, cfg, sweep_batches, lr_factors, target)
    m.seconds["sweep"] = time.monotonic() - t0
    lab.restart(workers=size)
    t0 = time.monotonic()
    measure_b_simple(lab, cfg, m)
    m.seconds["noise scale"] = time.monotonic() - t0
    return m


def b_simple_at(history, step: int) -> float | None:
    """The gradient noise scale's running estimate at ``step`` (its last value at or before it)."""
    if history is None or "noise_scale" not in history or step is None:
        return None
    series = history.set_index("step")["noise_scale"].astype(float).dropna()
    series = series[series.index <= step]
    return float(series.iloc[-1]) if len(series) and series.iloc[-1] > 0 else None


def measure_b_simple(lab, cfg: RunConfig, m: Measurements) -> None:
    """B_simple = tr Σ / |G|² where a run first reaches the target (McCandlish et al. 2018 read it
    at the loss the steps are counted to). The estimator needs two or more ranks (each rank's
    gradient is the small batch, their mean the big one), so this one run is on the lab's own
    ranks, at the batch whose best LR reached the target in the median number of steps, with
    that LR. Left ``None`` (and said so by the plan) when the run does not reach the target."""
    best = best_per_batch((r["global_batch"], r["lr"], r["steps"]) for r in m.sweep)
    if not best or lab.workers < 2:
        return
    pick = sorted(best, key=lambda b: b.steps)[len(best) // 2]
    if pick.batch % lab.workers:
        return
    run_cfg = cfg.replace(
        batch_per_worker=pick.batch // lab.workers,
        base_lr=pick.lr,
        base_batch=pick.batch,
        lr_scaling="none",
        eval_every=10,
        noise_scale=True,
        name=f"planner: B_simple at {m.target:g}, batch {pick.batch}, lr {pick.lr:g}",
    )
    run = lab.run(run_cfg)
    while not run.done and steps_to_reach(run.history, m.target) is None:
        time.sleep(0.2)
    step = steps_to_reach(run.history, m.target)
    if not run.done:
        run.stop()
    run.wait(check=False)
    m.b_simple = b_simple_at(run.history, step)
    m.b_simple_at = {
        "global_batch": pick.batch,
        "lr": pick.lr,
        "step": step,
        "workers": lab.workers,
        "run_id": run.run_id,
    }

"""Bookkeeping of the training loop on a rank: telemetry windows, epochs, throughput, publishing.

NumPy only (no TensorFlow), so every number the dashboard and the run record show is computed by
code that is unit-tested in milliseconds (tests/test_meters.py). The trainer feeds the meters
two kinds of telemetry:

* every call, the vector :data:`REDUCED`, summed over ranks by the one small allreduce the call
  ends with (no collective at all with one rank): training sums, the sampled gradient norms, and
  rank 0's decisions (stop, publish, the next call's step count) — every rank sees the same sums,
  so every rank takes the same decisions;
* on publish calls only, the matrix ``[world, len(DETAIL)]`` that an allgather of each rank's own
  timings returns (per-rank detail costs O(world) only twice a second, never every call).
"""

from __future__ import annotations

import math
import time
from array import array
from collections import deque
from collections.abc import Callable

import numpy as np

from hpclab.core import pop
from hpclab.core.catalog import RATE_WINDOW_S
from hpclab.core.metrics import NoiseScale, throughput_stats

# Summed over ranks at the end of every call (rank 0 alone sets the decision entries).
REDUCED = (
    "loss_sum",  # sum over steps of the step-mean loss
    "correct",  # correctly classified training samples
    "count",  # training samples
    "small_sq",  # |G_local|² at the call's sampled step (before the allreduce)
    "big_sq",  # |G_global|² at the same step (after it; equal on every rank)
    "noise_samples",  # ranks that sampled the norms this call (0 or world)
    "grad_zeros",  # weight-gradient elements exactly 0 at the call's last step (before the
    # allreduce): weight gradients only, structural zeros included (step.Step._zeros)
    "grad_elems",  # gradient elements looked at (every rank, every call)
    "nonfinite",  # ranks whose loss was NaN or infinite
    "stop",  # rank 0 saw a stop request
    "publish",  # rank 0 asks every rank for its detail after this call
    "next_steps",  # rank 0's step count for the next call
)
R = {name: i for i, name in enumerate(REDUCED)}
DECISIONS = ("stop", "publish", "next_steps")  # rank 0's, passed into a call; REDUCED's tail

# Each rank's own timings since the previous publish, gathered on publish calls.
DETAIL = (
    "samples",  # training samples this rank processed
    "call_s",  # seconds inside compiled calls (compute, allreduce and the wait for peers)
    "host_s",  # seconds between calls (Python, telemetry, stop polling)
    "steps",  # optimizer steps
    # inside the calls, timed in the graph: "<part>_s" for each of hpclab.core.pop.STEP_PARTS
    # (loop, input, compute, allreduce including the wait for the slowest rank, apply)
    *(f"{part}_s" for part in pop.STEP_PARTS),
    "eval_s",  # held-out evaluation (outside training time)
    "wall_s",  # this rank's wall clock over the window (everything, evaluation included)
)
D = {name: i for i, name in enumerate(DETAIL)}


def training_seconds(detail: np.ndarray) -> np.ndarray:
    """Each rank's training seconds in a gathered detail matrix: in calls and between them
    (evaluation and checkpoints are timed apart). The denominator of every throughput here."""
    return detail[:, D["call_s"]] + detail[:, D["host_s"]]


class RateWindow:
    """The telemetry windows the throughput columns are computed over: at least ``min_s``.

    History rows end at every publish (``publish_every_s``), every held-out evaluation
    (``eval_every``) and every epoch end, so one row can cover a few steps and a few
    milliseconds; samples over such a window is a rate that timer resolution, one call's fixed
    cost and the operating system's scheduling swing by a factor of ten in a steady run. The
    throughput of a row is therefore taken over its own window and the ones just before it,
    the fewest that add up to ``min_s`` seconds of training (validation is never in them): a
    true rate, over a window long enough to read. The first window (the first call, where
    TensorFlow optimises the graph) stands alone and is never combined with later ones.
    """

    def __init__(self, min_s: float):
        self.min_s = float(min_s)
        self.parts: deque[np.ndarray] = deque()
        self.first = True

    @staticmethod
    def seconds(detail: np.ndarray) -> float:
        """Training seconds a gathered detail matrix covers (its busiest rank's)."""
        return float(training_seconds(detail).max(initial=0.0))

    def add(self, detail: np.ndarray) -> np.ndarray:
        """Add the newest window's detail; the summed detail the throughput is taken over."""
        if self.first:
            self.first = False
            return detail
        self.parts.append(detail)
        while len(self.parts) > 1 and self.seconds(sum(list(self.parts)[1:])) >= self.min_s:
            self.parts.popleft()
        return np.sum(self.parts, axis=0)


class WindowMeter:
    """Telemetry summed since the last history row; :meth:`row` emits one row and resets."""

    def __init__(
        self,
        batch_per_worker: int,
        world: int,
        steps_per_epoch: int,
        rate_window_s: float = RATE_WINDOW_S,
    ):
        self.B, self.world, self.steps_per_epoch = batch_per_worker, world, steps_per_epoch
        self.reset()
        self.total = np.zeros(len(REDUCED))  # over the whole run, never reset
        self.rate = RateWindow(rate_window_s)
        self.detail_total: np.ndarray | None = None  # every window's detail but the first

    def reset(self) -> None:
        self.sums = np.zeros(len(REDUCED))
        self.steps = 0

    def add(self, reduced: np.ndarray, steps: int) -> None:
        """One call's reduced telemetry, covering ``steps`` optimizer steps."""
        self.sums += reduced
        self.total += reduced
        self.steps += steps

    def run_split(self) -> dict:
        """:func:`time_columns` over the whole run but its first window (rank 0; {} elsewhere)."""
        return {} if self.detail_total is None else time_columns(self.detail_total)

    def run_ratio(self, num: str, den: str) -> float | None:
        """Sum of REDUCED entry ``num`` over the run divided by ``den``'s; None if ``den`` is 0."""
        d = self.total[R[den]]
        return float(self.total[R[num]] / d) if d else None

    def row(
        self,
        step: int,
        time_s: float,
        lr: float,
        detail: np.ndarray,
        noise: NoiseScale | None,
    ) -> dict:
        """The history row for the window ending at ``step`` (columns: docs/architecture.md).

        ``detail`` is the gathered ``[world, DETAIL]`` matrix of the same window; the throughput
        columns are over this window and the ones just before it (:class:`RateWindow`).
        """
        w = self.sums
        if self.detail_total is None:
            self.detail_total = np.zeros_like(detail)  # (the first window: graph optimisation)
        else:
            self.detail_total += detail
        rated = self.rate.add(detail)
        busy = training_seconds(rated)
        samples = rated[:, D["samples"]].tolist()
        rank_sps = [s / t if t > 0 else None for s, t in zip(samples, busy.tolist())]
        sampled = w[R["noise_samples"]]
        row = {
            "step": step,
            "epoch": step / self.steps_per_epoch,
            "samples": step * self.B * self.world,
            "time_s": time_s,
            "loss": float(w[R["loss_sum"]] / max(self.steps * self.world, 1)),
            "accuracy": float(w[R["correct"]] / max(w[R["count"]], 1.0)),
            "lr": lr,
            "samples_per_sec": float(sum(s for s in rank_sps if s)) if any(rank_sps) else None,
            "rank_samples_per_sec": rank_sps,
            "rate_window_s": float(busy.max()) if busy.size else 0.0,
            **time_columns(rated),
            "eval_ms": float(1000 * detail[:, D["eval_s"]].max(initial=0.0)),
            # NaN where no step was sampled (one rank, or noise_scale off): not a zero norm
            "grad_norm_small_sq": float(w[R["small_sq"]] / sampled) if sampled else float("nan"),
            "grad_norm_big_sq": float(w[R["big_sq"]] / sampled) if sampled else float("nan"),
            "noise_scale": noise.value if noise is not None else float("nan"),
            # float16 without loss scaling: small gradients flush to zero (Micikevicius et al.)
            "grad_zero_fraction": float(w[R["grad_zeros"]] / w[R["grad_elems"]])
            if w[R["grad_elems"]]
            else float("nan"),
        }
        self.reset()
        return row


def time_columns(detail: np.ndarray) -> dict:
    """Where a window's steps spent their time, from its summed ``[world, DETAIL]`` matrix.

    For every part of :data:`hpclab.core.pop.PARTS`: ``<part>_ms`` (per step, mean over ranks) and
    ``rank_<part>_ms`` (per step, one entry per rank); ``step_ms``, the busiest rank's wall clock
    per step with evaluation taken out (an independent clock the parts must add up to); and
    POP's ``load_balance``, ``comm_efficiency`` and ``parallel_efficiency``."""
    steps = np.maximum(detail[:, D["steps"]], 1.0)
    raw = {part: detail[:, D[f"{part}_s"]] for part in pop.STEP_PARTS}
    parts = pop.split({**raw, "call": detail[:, D["call_s"]], "host": detail[:, D["host_s"]]})
    cols: dict = {}
    for name, seconds in parts.items():
        per_step = 1000 * seconds / steps
        cols[f"{name}_ms"] = float(per_step.mean()) if per_step.size else float("nan")
        cols[f"rank_{name}_ms"] = np.asarray(per_step, dtype=float).tolist()
    wall = (detail[:, D["wall_s"]] - detail[:, D["eval_s"]]) / steps
    cols["step_ms"] = float(1000 * wall.max(initial=0.0))
    cols.update(pop.efficiencies(parts))
    return cols


def decisions(stop: bool = False, publish: bool = False, next_steps: int = 0) -> np.ndarray:
    """Rank 0's :data:`DECISIONS` as the vector a call sums (other ranks pass all zeros)."""
    decided = {"stop": float(stop), "publish": float(publish), "next_steps": float(next_steps)}
    return np.array([decided[name] for name in DECISIONS])


class RankClock:
    """This rank's own timings since the last publish: the vector it contributes to DETAIL."""

    def __init__(self, batch_per_worker: int, now: Callable[[], float] = time.perf_counter):
        self.B, self.now = batch_per_worker, now
        self.values = np.zeros(len(DETAIL))
        self.since = now()

    def add(self, steps: int, call_s: float, host_s: float, timed: dict | None = None) -> None:
        """One call: ``steps`` steps, its seconds, the host's before it, and its ``timed`` parts
        (part of :data:`hpclab.core.pop.STEP_PARTS` -> seconds summed over the call's steps
        inside the graph)."""
        added = {"samples": steps * self.B, "call_s": call_s, "host_s": host_s, "steps": steps}
        added.update({f"{part}_s": float(seconds) for part, seconds in (timed or {}).items()})
        for name, value in added.items():
            self.values[D[name]] += value

    def add_eval(self, seconds: float) -> None:
        self.values[D["eval_s"]] += seconds

    def take(self) -> np.ndarray:
        out, self.values = self.values, np.zeros(len(DETAIL))
        now = self.now()
        out[D["wall_s"]], self.since = now - self.since, now
        return out


class EpochMeter:
    """Training loss/accuracy and time over the current epoch; :meth:`close` emits its row."""

    KEEP = 64  # epoch rows kept in memory (a rollback reaches back less; all are on disk)

    def __init__(self, world: int):
        self.world = world
        self.sums = np.zeros(3)  # loss_sum, correct, count over the epoch (all ranks)
        self.steps = 0
        self.t0: float | None = None
        self.rows: list[dict] = []  # the newest KEEP closed epochs
        self.closed = 0  # epochs closed (rolled-back ones taken off)

    def add(self, reduced: np.ndarray, steps: int, t_call_start: float) -> None:
        if self.t0 is None:
            self.t0 = t_call_start
        self.sums += reduced[[R["loss_sum"], R["correct"], R["count"]]]
        self.steps += steps

    def close(
        self, step: int, now: float, time_s: float, lr: float, val: tuple[float, float]
    ) -> dict:
        """End the epoch at ``step``: ``now`` is the perf-counter clock, ``val`` (loss, accuracy)."""
        loss_sum, correct, count = self.sums
        elapsed = now - self.t0 if self.t0 is not None else 0.0
        row = {
            "epoch": self.closed + 1,
            "step": step,
            "time_s": time_s,
            "loss": loss_sum / max(1, self.steps * self.world),
            "accuracy": correct / max(1.0, count),
            "val_loss": val[0],
            "val_accuracy": val[1],
            "lr": lr,
            "samples_per_sec": count / elapsed if elapsed > 0 else None,
        }
        self.rows.append(row)
        self.closed += 1
        if len(self.rows) > 2 * self.KEEP:
            del self.rows[: -self.KEEP]
        self.sums[:] = 0
        self.steps = 0
        self.t0 = now
        return row

    def rollback(self, step: int) -> None:
        """Every rank restored its state before step ``step`` (hpclab.rank.features.sdc): the epochs
        closed after it are gone and the open one restarts its sums."""
        kept = sum(1 for r in self.rows if r["step"] <= step)
        self.closed -= len(self.rows) - kept
        del self.rows[kept:]
        self.sums[:] = 0
        self.steps = 0


class ThroughputLog:
    """Global rate per call and each rank's rate, over the same calls after the warm-up.

    The warm-up skipped is ``max(3, 10 %)`` of the calls, known only at the end. The per-call
    rates are kept (two floats a call). Each rank's rate is its samples over its training
    seconds (in calls and between them, evaluation excluded) summed over the windows after the
    warm-up: its own share of the same calls, so the ranks' rates add up to the global one, and a
    start-up transient (a rank waiting in an early call for its peer) is skipped for every rank
    as it is for the global rate. Those sums are kept cumulative, with a snapshot at a window's
    end whenever the calls have grown by :data:`SNAPSHOT_GROWTH` since the last one; the summary
    subtracts the first snapshot at or past the warm-up. Rank 0 thus keeps O(log calls)
    snapshots of 2 × world floats, not the world size times the run's length.
    """

    SNAPSHOT_GROWTH = 1.05  # the warm-up skipped per rank: at most 5 % (and a window) past 10 %

    def __init__(self):
        self.global_rates = array("d")
        self.seconds = array("d")
        self._rank_samples: np.ndarray | None = None  # cumulative over every window, per rank
        self._rank_busy: np.ndarray | None = None
        self._snapshots: list[tuple[int, np.ndarray, np.ndarray]] = []  # (calls, samples, busy)

    def add_call(self, samples: float, seconds: float) -> None:
        """One call of every rank: ``samples`` global, ``seconds`` from one call's start to the
        next's (ranks run in lockstep, so any rank's clock times the whole world's call)."""
        if seconds > 0:
            self.global_rates.append(samples / seconds)
            self.seconds.append(seconds)

    def add_window(self, detail: np.ndarray) -> None:
        """A telemetry window's gathered ``[world, DETAIL]`` matrix, after its calls were added."""
        samples = detail[:, D["samples"]].astype(float)  # (a copy, as training_seconds' sum)
        busy = training_seconds(detail)
        if self._rank_samples is None:
            self._rank_samples, self._rank_busy = samples, busy
        else:
            self._rank_samples += samples
            self._rank_busy += busy
        calls = len(self.global_rates)
        last = self._snapshots[-1][0] if self._snapshots else None
        if last is None or calls >= max(last + 1, math.ceil(last * self.SNAPSHOT_GROWTH)):
            self._snapshots.append((calls, self._rank_samples.copy(), self._rank_busy.copy()))

    def _rank_rates(self, skip: int) -> list[float | None]:
        """Each rank's samples over its training seconds after the first snapshot at or past
        ``skip`` calls; after the first window if the run was too short for that; the first
        window itself if there was only one."""
        if self._rank_samples is None:
            return []
        past_warm_up = [s for s in self._snapshots[1:] if s[0] >= skip][:1]
        for _, samples, busy in past_warm_up + self._snapshots[:1]:
            n, t = self._rank_samples - samples, self._rank_busy - busy
            if (t > 0).all():
                break
        else:  # one window: it is the whole run
            n, t = self._rank_samples, self._rank_busy
        return [float(a / b) if b > 0 else None for a, b in zip(n, t)]

    def summary(self) -> dict:
        """Mean ± 1.96σ after skipping the warm-up (max(3, 10 %) calls), and each rank's rate.

        Calls differ in length (auto-sizing, epoch ends), so each call's rate is weighted by its
        duration: the mean is then all samples over all seconds of the kept calls."""
        skip = max(3, int(0.1 * len(self.global_rates)))
        stats = throughput_stats(self.global_rates, skip=skip, weights=self.seconds)
        return {
            "samples_per_sec": stats.mean,
            "samples_per_sec_ci95": stats.ci95,
            "throughput_intervals": stats.n,
            "rank_samples_per_sec": self._rank_rates(skip),
        }


class CallSizer:
    """Rank 0's choice of steps per compiled call: about ``target_s`` seconds a call.

    Sized from a running estimate of seconds per step (the first call, which also lets TensorFlow
    optimise the graph, is not counted), growing at most twofold from one plan to the next, so
    one slow call cannot swing it and a short epoch-end call does not restart the ramp.
    ``fixed`` (RunConfig.steps_per_call > 0) turns sizing off.
    """

    def __init__(self, *, first: int, fixed: int, target_s: float, limit: int):
        self.first, self.fixed, self.target_s, self.limit = first, fixed, target_s, limit
        self.planned = first
        self.seconds_per_step: float | None = None
        self.calls = 0

    def observe(self, steps: int, seconds: float) -> None:
        self.calls += 1
        if self.calls == 1 or steps <= 0 or seconds <= 0:
            return
        per_step = seconds / steps
        if self.seconds_per_step is None:
            self.seconds_per_step = per_step
        else:  # weight by steps: long calls measure the per-step time best
            w = min(1.0, steps / max(self.planned, 1))
            self.seconds_per_step += 0.5 * w * (per_step - self.seconds_per_step)

    def plan(self) -> int:
        if self.fixed:
            return self.fixed
        if self.seconds_per_step is None:
            wanted = self.planned  # no timing yet: no growth (a big model's step can take seconds)
        else:
            wanted = self.target_s / self.seconds_per_step
        self.planned = int(max(1, min(self.limit, self.planned * 2, round(wanted))))
        return self.planned

"""One training run on one rank: data shard, model, optimizer, the compiled call, the loop.

Speed (hpclab issue 10): per-call Python overhead, not arithmetic, dominates the lab's small
models, so the hot path is one ``tf.function`` per call that runs a *tensor* number of optimizer
steps in a ``tf.while_loop`` — traced once per run, whatever the step count — over batches cut
inside the graph from the rank's resident shard (:mod:`hpclab.rank.feed`). Calls are sized to last
~0.15 s (``steps_per_call=0``), so a stop or a live row is never more than two calls away (rank
0 decides before a call; every rank acts after it). With one rank there is no collective at all;
with several, each step has its gradient allreduce and each call ends with one small allreduce
of the telemetry and rank 0's decisions (:mod:`.meters`).

Stopping is collective: a rank that left the loop alone would leave its peers blocked in the next
allreduce. Only rank 0 looks for the run's STOP file (once a call, not a metadata storm on a
shared file system); the call's telemetry allreduce tells every rank, so all leave after the same
step. Lines that exist only for distribution say so (`# Horovod: ...`), as in Horovod's examples.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path

from hpclab.core.catalog import MAX_ROLLBACKS, MAX_STEPS_PER_CALL
from hpclab.core.config import RunConfig
from hpclab.core.health import judge
from hpclab.core.metrics import NoiseScale
from hpclab.rank.meters import (
    DECISIONS,
    DETAIL,
    REDUCED,
    CallSizer,
    EpochMeter,
    Publisher,
    R,
    RankClock,
    ThroughputLog,
    WindowMeter,
    decisions,
)
from hpclab.rank.step import TIMES, Step
from hpclab.rank.timeline_window import TimelineWindow
from hpclab.rank.validation import Validation

CALL_TARGET_S = 0.15  # auto-sized calls last about this long
FIRST_CALL_STEPS = 4  # the first call also traces: keep it short


class Trainer:
    """Set up by :meth:`setup`, trained by :meth:`run`; kept alive by the engine between runs."""

    def __init__(self, cfg_dict: dict, run_dir: Path, data_dir: Path):
        self.cfg = RunConfig.from_dict(cfg_dict)
        self.cfg_dict = self.cfg.to_dict()
        self.run_dir, self.data_dir = run_dir, data_dir
        self.stop_file = run_dir / "STOP"

    # -- set-up ----------------------------------------------------------------------------
    def setup(self) -> None:
        import horovod.tensorflow as hvd
        import numpy as np
        import tensorflow as tf

        from hpclab.rank import models, optimizers
        from hpclab.rank.features import sdc

        cfg = self.cfg
        self.tf, self.hvd, self.np = tf, hvd, np
        self.rank, self.world = hvd.rank(), hvd.size()
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(cfg.seed)
        optimizers.set_precision(cfg.precision)
        self.steps_per_epoch = cfg.steps_per_epoch(self.world)
        self.total_steps = cfg.total_steps(self.world)
        self.batches = cfg.local_batches(self.world)  # each rank's batch (batch_skew)
        self.local_batch = self.batches[self.rank]
        self._build_data()

        self.model = models.build_model(cfg.model, self.input_shape, self.num_classes, cfg.seed)
        if cfg.dataset != "synthetic":
            self.val = Validation(
                self.model,
                *self.val_arrays,
                subset=cfg.eval_samples,
                batch=cfg.batch_per_worker,
                mode=cfg.validation,
            )
        self.eval_every = cfg.eval_interval(self.world) if self.val is not None else 0
        schedule = self.schedule = optimizers.TableSchedule.for_run(self.cfg_dict, self.world)
        self.lr_table = schedule.table  # the same numbers as RunConfig.lr_at(step, world)
        self.optimizer = optimizers.build_optimizer(self.cfg_dict, schedule)
        self.step = Step(
            cfg, model=self.model, optimizer=self.optimizer, world=self.world, rank=self.rank,
            share=self.local_batch * self.world / cfg.global_batch(self.world),
        )  # fmt: skip
        self.grad_elems = float(sum(v.shape.num_elements() for v in self.model.trainable_variables))
        inner = self.optimizer.inner_optimizer if self.step.loss_scaled else self.optimizer
        inner.build(self.model.trainable_variables)
        # the whole training state: weights, optimizer state, a central model (update="crossbow")
        state = [*self.model.variables, *inner.variables]
        state += self.step.state
        if self.world > 1:
            # Horovod: start every rank from rank 0's weights and optimizer state.
            hvd.broadcast_variables(state, root_rank=0)
        self.track_noise = self.step.track_noise
        self.watch = sdc.Watch(cfg, self.model, state, self.rank)  # bit flip, spike detector
        self.step.fault = self.watch.fault
        # Fixed signatures: one trace per run, whatever the call's step count or epoch.
        scalar = tf.TensorSpec([], tf.int32)
        self.train_call = tf.function(
            self._train_call,
            input_signature=[scalar, scalar, scalar, tf.TensorSpec([len(DECISIONS)], tf.float64),
                             tf.TensorSpec([3], tf.float32), scalar],
        )  # fmt: skip

    def _build_data(self) -> None:
        from hpclab.rank import data, feed

        cfg = self.cfg
        # Data: rank 0 generates/caches first so ranks never race on the cache file. If rank 0
        # fails, the barrier tells every rank, so all raise together and the engines stay usable.
        failure = None
        if self.rank == 0:
            try:
                arrays = data.load_arrays(self.cfg_dict, self.data_dir)
            except (OSError, ValueError, KeyError) as exc:
                failure = exc
        if self._barrier(failed=failure is not None):  # Horovod: wait for rank 0's cache
            if failure is not None:
                raise failure
            raise RuntimeError("rank 0 could not load the data set; its error names the cause")
        if self.rank != 0:
            arrays = data.load_arrays(self.cfg_dict, self.data_dir)
        self.num_classes, self.input_shape = arrays.num_classes, arrays.input_shape
        self.val = None  # a Validation, built with the model (synthetic data has no validation)
        if cfg.dataset == "synthetic":
            self.num_classes = cfg.synthetic_classes
        self.feed = feed.for_rank(cfg, arrays, self.rank, self.world)
        self.val_arrays = (arrays.x_val, arrays.y_val)

    def _barrier(self, failed: bool = False) -> bool:
        """Horovod: wait for every rank; True if any rank reports a failure."""
        flag = self.tf.constant(1.0 if failed else 0.0)
        if self.world > 1:
            flag = self.hvd.allreduce(flag, op=self.hvd.Sum, name="hpclab_barrier")
        return float(flag) > 0

    # -- the compiled call ---------------------------------------------------------------
    def _train_call(self, epoch, start, steps, decisions, guard, flip):
        """``steps`` optimizer steps from step ``start`` of ``epoch``; the reduced telemetry, this
        rank's time split and the spike detector's ``guard`` state (``flip``: the fault's mask)."""
        tf = self.tf
        order = self.feed.order(epoch)
        last = steps - 1  # (steps >= 1: the last step, traced apart, samples the gradients)
        batch = lambda i: lambda: self.feed.batch_at(order, start + i, epoch)  # noqa: E731 (input)

        check = self.watch.guard.check if self.watch.guard.on else lambda _, g, *__: g

        def body(i, sums, times, clock, guard):
            out, took, clock, loss = self.step(batch(i), clock)
            return i + 1, sums + out, times + took, clock, check(tf, guard, loss, i)

        _, sums, times, clock, guard = tf.while_loop(
            lambda i, *_: i < last,
            body,
            (tf.constant(0), tf.zeros(5), tf.zeros(len(TIMES)), self.step.start(), guard),
            parallel_iterations=1,
        )
        flip = flip if self.watch.in_call else None
        out, took, _, loss = self.step(batch(last), clock, sample=True, flip=flip)
        sums, times, guard = sums + out, times + took, check(tf, guard, loss, last)
        decided = tf.cast(decisions, tf.float32)
        entries = {  # this rank's share of meters.REDUCED, by name
            "loss_sum": sums[0],
            "correct": sums[1],
            "count": tf.cast(steps * self.local_batch, tf.float32),
            "small_sq": sums[2],
            "big_sq": sums[3],
            "noise_samples": tf.constant(1.0 if self.track_noise else 0.0),
            "grad_zeros": sums[4],
            "grad_elems": tf.constant(self.grad_elems, tf.float32),
            "nonfinite": 1.0 - tf.cast(tf.math.is_finite(sums[0]), tf.float32),
            **{name: decided[i] for i, name in enumerate(DECISIONS)},
        }
        mine = tf.stack([entries[name] for name in REDUCED])
        if self.world > 1:
            # Horovod: one small allreduce a call: every rank learns the sums and rank 0's decisions.
            mine = self.hvd.allreduce(mine, op=self.hvd.Sum, name="hpclab_telemetry")
        return mine, times, guard  # the times stay this rank's own (gathered on publish calls)

    def _gather_detail(self, mine):
        """Horovod: every rank's own timings, on publish calls only (O(world) twice a second)."""
        tf = self.tf
        vec = tf.constant(mine[None, :], dtype=tf.float64)
        if self.world == 1:
            return vec.numpy()
        return self.hvd.allgather(vec, name="hpclab_detail").numpy()

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        """Train to the end (or a collective stop / non-finite loss); this rank's summary."""
        wall0, t_setup = time.time(), time.perf_counter()
        self.setup()
        from ipyparallel.datapub import publish_data

        t_trace = time.perf_counter()
        self.train_call.get_concrete_function()  # trace now, so trace time is its own figure
        timing = {"setup_s": t_trace - t_setup, "trace_s": time.perf_counter() - t_trace}

        cfg, tf = self.cfg, self.tf
        B, world, spe = cfg.batch_per_worker, self.world, self.steps_per_epoch
        noise = NoiseScale(B, B * world) if self.track_noise else None
        window = WindowMeter(B, world, spe)
        epochs = EpochMeter(world)
        rates = ThroughputLog()
        clock = RankClock(self.local_batch)
        feed = Publisher(
            publish_data if self.rank == 0 else None, cfg.publish_every_s, self.total_steps
        )
        feed.epochs = epochs.rows
        sizer = CallSizer(
            first=cfg.steps_per_call or FIRST_CALL_STEPS,
            fixed=cfg.steps_per_call,
            target_s=CALL_TARGET_S,
            limit=MAX_STEPS_PER_CALL,
        )
        step, status, error = 0, "finished", None
        timeline = TimelineWindow(self.hvd, self.run_dir, cfg.timeline_steps, world)
        # Rank 0 decides (stop, publish, next_steps) before each call; the call's allreduce tells
        # every rank, so all act on the same decisions after the same step. next_steps sizes the
        # call after the one that carries it (rank 0 needs one timed call to size the next).
        k_plan = sizer.first
        decisions = self._decide(sizer, feed)

        t_start = t_prev = time.perf_counter()
        evaluating = 0.0  # seconds of held-out evaluation since the previous call ended
        feed.publish("running", step)  # tells the client the ranks reached the loop
        while step < self.total_steps:
            epoch, in_epoch = divmod(step, spe)
            k = int(min(k_plan, spe - in_epoch, self.total_steps - step, self._to_eval(step),
                        self.watch.fault.steps_to_cut(step)))  # fmt: skip
            self.watch.before_call(self.model, step, self.digest)
            guard, flip = self.watch.inputs(step, k)
            t0 = time.perf_counter()
            reduced, took, guard = self.train_call(
                tf.constant(epoch), tf.constant(in_epoch), tf.constant(k), tf.constant(decisions),
                tf.constant(guard), tf.constant(flip),
            )  # fmt: skip
            reduced, took = reduced.numpy(), took.numpy()  # syncs
            t1 = time.perf_counter()
            timing.setdefault("first_call_s", t1 - t0)  # graph optimisation happens here
            # host time: everything between two calls (Python, telemetry, publishing) but the
            # evaluation, which is timed apart and is not training time
            clock.add(k, t1 - t0, t0 - t_prev - evaluating, took)
            rates.add_call(k * B * world, t1 - t_prev - evaluating)
            t_prev, evaluating = t1, 0.0
            spike = self.watch.after_call(guard.numpy(), step, k, self.digest)
            if spike is not None and cfg.rollback:  # every rank: the same spike, the same state
                back = self.watch.guard.restore(spike, MAX_ROLLBACKS)
                if back is not None:
                    self.watch.guard.events[-1]["restored_step"] = step = back
                    epochs.rollback(back)
                    continue
            step += k
            timeline.after_call(step)
            window.add(reduced, k)
            epochs.add(reduced, k, t0)
            if noise is not None and reduced[R["noise_samples"]] > 0:
                n = reduced[R["noise_samples"]]
                noise.update(reduced[R["small_sq"]] / n, reduced[R["big_sq"]] / n)
            if spike is not None and cfg.rollback:
                status = "diverged"
                error = (
                    f"the loss spiked at step {spike} again after {MAX_ROLLBACKS} rollbacks to the "
                    "same state: the fault is not transient (or the spike factor too low)"
                )
            elif reduced[R["nonfinite"]] > 0:
                status = "diverged"
                error = (
                    f"the loss became NaN or infinite at step {step} "
                    f"(lr {self._lr(step):.4g}); lower base_lr, add warm-up, or use LARS"
                )
            elif reduced[R["stop"]] > 0 and step < self.total_steps:
                status = "stopped"  # (a stop that lands in the last call finds the run done)
            epoch_end = step % spe == 0 or step >= self.total_steps
            point = None  # a held-out evaluation ends a history row, outside training time
            due = self.eval_every and (step % self.eval_every == 0 or step >= self.total_steps)
            if status == "finished" and due:
                t_eval = time.perf_counter()
                with self._evaluated():
                    point = self.val.subset()
                evaluating += time.perf_counter() - t_eval
                clock.add_eval(time.perf_counter() - t_eval)
            if reduced[R["publish"]] > 0 or epoch_end or point or status != "finished":
                detail = self._gather_detail(clock.take())  # every rank, same calls
                if self.rank == 0:
                    row = window.row(
                        step, time.perf_counter() - t_start, self._lr(step), detail, noise
                    )
                    row["eval_loss"], row["eval_accuracy"] = point or (float("nan"),) * 2
                    rates.add_window(row["rank_samples_per_sec"])
                    feed.rows.append(row)
                else:
                    window.reset()
            if status != "finished":
                break
            if epoch_end:
                t_eval = time.perf_counter()
                with self._evaluated():
                    val = self.val.full_set() if self.val is not None else (float("nan"),) * 2
                t = time.perf_counter()
                clock.add_eval(t - t_eval)  # (lands in the next row's window)
                evaluating += t - t_eval
                epochs.close(step, t, t - t_start, self._lr(step), val)
            if reduced[R["publish"]] > 0 or epoch_end:
                feed.publish("running", step, time.perf_counter())
            k_plan = max(1, int(reduced[R["next_steps"]]))
            sizer.observe(k, t1 - t0)
            decisions = self._decide(sizer, feed)
        train_time = time.perf_counter() - t_start
        if self.val is not None:  # (synthetic data has random labels: chance is all it can do)
            status, error = judge(
                status, error, epochs.rows[-1] if epochs.rows else None,
                warmup_steps=cfg.warmup_steps(world), num_classes=self.num_classes,
                peak_lr=cfg.peak_lr(world),
            )  # fmt: skip
        feed.publish(status, step, time.perf_counter())  # final rows; every rank left the loop
        timeline.after_call(step, last=True)
        summary = self._summary(status, error, step, epochs, rates, noise, feed, window, wall0)
        if self.rank == 0 and timeline.summary is not None:
            summary["timeline"] = timeline.summary
        summary["train_time_s"] = train_time
        summary["augment_offline_s"] = getattr(self.feed, "offline_s", 0.0)  # before training
        # the rate a user waits on: validation and host time included (Amdahl's serial part)
        summary["overall_samples_per_sec"] = step * B * world / train_time if train_time else None
        return {**summary, **timing}

    def _to_eval(self, step: int) -> int:
        """Steps from `step` to the next held-out evaluation (calls end there); large if off."""
        return self.eval_every - step % self.eval_every if self.eval_every else self.total_steps

    def _decide(self, sizer: CallSizer, feed: Publisher):
        """Rank 0's decisions (meters.DECISIONS); the other ranks contribute zeros to the sums."""
        if self.rank != 0:
            return decisions()
        # only rank 0 touches the STOP file
        return decisions(self.stop_file.exists(), feed.due(time.perf_counter()), sizer.plan())

    def _summary(self, status, error, step, epochs, rates, noise, feed, window, wall0):
        cfg, world = self.cfg, self.world
        last_epoch = epochs.rows[-1] if epochs.rows else {}
        summary = {
            "status": status,
            "error": error,
            "rank": self.rank,
            "world_size": world,
            "steps": step,
            "epochs_done": step / self.steps_per_epoch,
            "global_batch": cfg.global_batch(world),
            "lr": cfg.peak_lr(world),
            "precision": cfg.precision,
            "val_accuracy": last_epoch.get("val_accuracy"),
            "val_loss": last_epoch.get("val_loss"),
            "train_accuracy": last_epoch.get("accuracy"),
            **rates.summary(),
            "noise_scale": noise.value if noise is not None else None,
            "grad_zero_fraction": window.run_ratio("grad_zeros", "grad_elems"),
            "weights_digest": self.digest(),
            "sdc": self.watch.summary() if self.watch.fault.on or self.watch.guard.on else None,
            # what the optimizer itself counted and used last (tests check them against steps)
            "optimizer_steps": int(self.optimizer.iterations.numpy()),
            "optimizer_last_lr": float(self.schedule(self.optimizer.iterations - 1)),
            "wall_time_s": time.time() - wall0,
        }
        if self.rank == 0:
            summary["time_split"] = window.run_split()
            summary["rows"] = feed.rows
            summary["epochs"] = epochs.rows
        return summary

    def _evaluated(self):
        """The weights held-out evaluation uses: the central model under Crossbow (its own
        evaluation), else this rank's."""
        central = getattr(self.step.averaging, "central", None)
        return central() if central else contextlib.nullcontext()

    def _lr(self, step: int) -> float:
        """The LR of the last step taken (``step`` steps done)."""
        return float(self.lr_table[max(step, 1) - 1])

    def digest(self) -> str:
        """A short hash of this rank's weights: equal on every rank when replicas agree."""
        h = hashlib.sha256()
        for w in self.model.get_weights():
            h.update(self.np.ascontiguousarray(w).tobytes())
        return h.hexdigest()[:16]


__all__ = ["Trainer", "REDUCED", "DETAIL"]

"""One training run on one rank: data shard, model, optimizer, the compiled call, the loop.

The run's steps go in compiled calls (:mod:`.compiled_call`) sized to last ~0.15 s
(``steps_per_call=0``), so a stop or a live row is never more than two calls away (rank 0
decides before a call; every rank acts after it).

Stopping is collective: a rank that left the loop alone would leave its peers blocked in the next
allreduce. Only rank 0 looks for the run's STOP file (once a call, not a metadata storm on a
shared file system); the call's telemetry allreduce tells every rank, so all leave after the same
step (rule 4 of :mod:`hpclab.rank.step`). Lines that exist only for distribution say so
(`# Horovod: ...`), as in Horovod's examples.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from hpclab.core.catalog import MAX_ROLLBACKS, MAX_STEPS_PER_CALL, RANK_LISTS_MAX, is_user_model
from hpclab.core.config import RunConfig
from hpclab.core.filedata import is_file_dataset
from hpclab.core.health import judge
from hpclab.core.metrics import NoiseScale
from hpclab.core.plan import RunPlan
from hpclab.rank import checkpoint as ckpt
from hpclab.rank.compiled_call import CompiledCall
from hpclab.rank.heartbeat import PROGRESS
from hpclab.rank.meters import (
    CallSizer,
    EpochMeter,
    R,
    RankClock,
    ThroughputLog,
    WindowMeter,
    decisions,
)
from hpclab.rank.publisher import Publisher
from hpclab.rank.step import Step
from hpclab.rank.timeline_window import TimelineWindow
from hpclab.rank.validation import Validation

CALL_TARGET_S = 0.15  # auto-sized calls last about this long
FIRST_CALL_STEPS = 4  # the first call also traces: keep it short


@dataclass
class LoopMeters:
    """The loop's bookkeeping on this rank (:mod:`hpclab.rank.meters`), and rank 0's
    ``publisher`` of live telemetry to the client (a no-op on the other ranks)."""

    window: WindowMeter
    epochs: EpochMeter
    rates: ThroughputLog
    clock: RankClock
    noise: NoiseScale | None
    publisher: Publisher
    sizer: CallSizer
    timeline: TimelineWindow

    def add(self, reduced, steps: int, t_call_start: float) -> None:
        """One call's reduced telemetry, ``steps`` steps that started at ``t_call_start``."""
        self.window.add(reduced, steps)
        self.epochs.add(reduced, steps, t_call_start)
        if self.noise is not None and reduced[R["noise_samples"]] > 0:
            n = reduced[R["noise_samples"]]
            self.noise.update(reduced[R["small_sq"]] / n, reduced[R["big_sq"]] / n)


class Trainer:
    """Set up by :meth:`setup`, trained by :meth:`run`; kept alive by the engine between runs."""

    def __init__(
        self,
        cfg_dict: dict,
        plan_dict: dict,
        run_dir: Path,
        data_dir: Path,
        checkpoint: str | None = None,
        start_step: int | None = None,
    ):
        self.cfg = RunConfig.from_dict(cfg_dict)
        self.cfg_dict = self.cfg.to_dict()
        self.plan = RunPlan.from_dict(plan_dict)  # computed once, on the client
        self.run_dir, self.data_dir = run_dir, data_dir
        self.stop_file = run_dir / "STOP"
        self.resume_from = checkpoint  # a checkpoint's path: the run goes on from it
        self.rescaled_start = start_step  # on another world: the step it goes on from

    # -- set-up ----------------------------------------------------------------------------
    def setup(self) -> None:
        import horovod.tensorflow as hvd
        import numpy as np
        import tensorflow as tf

        from hpclab.rank import optimizers
        from hpclab.rank.keras2 import keras

        cfg = self.cfg
        self.tf, self.hvd, self.np = tf, hvd, np
        self.rank, self.world = hvd.rank(), hvd.size()
        if self.plan.workers != self.world:
            raise ValueError(
                f"the run was planned for {self.plan.workers} ranks and this world has "
                f"{self.world}; plan it with cfg.for_workers({self.world})"
            )
        keras.backend.clear_session()
        keras.utils.set_random_seed(cfg.seed)
        optimizers.set_precision(cfg.precision)
        if cfg.precision == "mixed_bfloat16" and not tf.config.list_logical_devices("GPU"):
            from hpclab.rank import bfloat16  # oneDNN below AVX-512: one sentence, not a crash

            bfloat16.check(tf, self.rank)
        self.steps_per_epoch = self.plan.steps_per_epoch
        self.total_steps = self.plan.total_steps
        self.local_batch = self.plan.local_batches[self.rank]  # (uneven under batch_skew)
        self._build_data()
        PROGRESS.enter("build")
        self._build_model()
        self._build_step()
        self.call = CompiledCall(
            self.step,
            self.train_input,
            self.watch,
            local_batch=self.local_batch,
            grad_elems=self.grad_elems,
            world=self.world,
        )
        self.train_call = self.call.function  # (a tf.function, traced once per run)

    def _build_data(self) -> None:
        from hpclab.rank import data, feed

        cfg = self.cfg
        self.input_info = None
        if is_file_dataset(cfg.dataset):  # your own files: resident or streamed (rank.stream)
            from hpclab.rank import stream

            local = self.hvd.local_rank()
            out = stream.for_rank(cfg, self.plan, self.rank, self.world, local, self._barrier)
            self.train_input, self.val_arrays, self.num_classes, self.input_shape = out[:4]
            self.input_info = out[4]
            return
        # Data: rank 0 generates/caches first so ranks never race on the cache file. If rank 0
        # fails, the barrier tells every rank, so all raise together and the engines stay usable.
        failure = None
        PROGRESS.enter("data" if self.rank == 0 else "data_wait")
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
            PROGRESS.enter("data")
            arrays = data.load_arrays(self.cfg_dict, self.data_dir)
        self.num_classes, self.input_shape = arrays.num_classes, arrays.input_shape
        if cfg.dataset == "synthetic":
            self.num_classes = cfg.synthetic_classes
        self.train_input = feed.for_rank(cfg, self.plan, arrays, self.rank)  # batches, in graph
        self.val_arrays = (arrays.x_val, arrays.y_val)

    def _build_model(self) -> None:
        """The model, its held-out evaluation (none on synthetic data), the LR schedule and the
        optimizer."""
        from hpclab.rank import models, optimizers

        cfg = self.cfg
        self.model = models.build_model(cfg.model, self.input_shape, self.num_classes, cfg.seed)
        self.val = None
        if cfg.dataset != "synthetic":
            self.val = Validation(
                self.model,
                *self.val_arrays,
                subset=cfg.eval_samples,
                batch=cfg.batch_per_worker,
                mode=cfg.validation,
                autograph=is_user_model(cfg.model),
            )
        self.eval_every = self.plan.eval_every if self.val is not None else 0
        # the LR as a function of the step: RunPlan.lr_at(step) in float32, no per-step table
        schedule = self.schedule = optimizers.StepSchedule(**self.plan.lr_params())
        self.optimizer = optimizers.build_optimizer(self.cfg_dict, schedule)

    def _build_step(self) -> None:
        """The step with its features, the whole training state (broadcast from rank 0) and the
        SDC watch over it."""
        from hpclab.rank.features import sdc

        cfg, hvd = self.cfg, self.hvd
        fault = sdc.Fault(cfg, self.model, self.rank)  # the planned bit flip (none: off)
        self.step = Step(
            cfg,
            model=self.model,
            optimizer=self.optimizer,
            world=self.world,
            rank=self.rank,
            share=self.local_batch * self.world / self.plan.global_batch,
            fault=fault,
        )
        self.grad_elems = float(sum(v.shape.num_elements() for v in self.model.trainable_variables))
        inner = self.optimizer.inner_optimizer if self.step.loss_scaled else self.optimizer
        inner.build(self.model.trainable_variables)
        self.inner = inner
        # the whole training state: weights, optimizer state, the features' own (a central
        # model), and mixed_float16's dynamic loss scale (its value and good-step counter)
        scale = getattr(self.optimizer, "_loss_scale", None) if self.step.loss_scaled else None
        scaling = [scale._current_loss_scale, scale._counter] if scale is not None else []
        state = [*self.model.variables, *inner.variables, *self.step.state, *scaling]
        self.state = state
        which = {"model": cfg.model, "dataset": cfg.dataset, "workers": self.world}
        self.ckpt = ckpt.Checkpointer(
            self.run_dir,
            cfg.checkpoint_every,
            self.rank,
            which,
            minutes=cfg.checkpoint_minutes,
            keep=cfg.checkpoint_keep,
        )
        self.start_step, self.host = self._resume(state, which)
        if self.world > 1:
            # Horovod: start every rank from rank 0's weights and optimizer state.
            hvd.broadcast_variables(state, root_rank=0)
        self.watch = sdc.Watch(cfg, fault, state, MAX_ROLLBACKS)  # bit flip, spike detector

    def _resume(self, state: list, which: dict) -> tuple[int, dict]:
        """(step, host state) of the checkpoint the run resumes from ((0, {}) for a fresh run);
        rank 0 loads its values before the broadcast hands them to every rank. A checkpoint
        rank 0 cannot load fails every rank together (the barrier), not in the broadcast."""
        if self.resume_from is None:
            return 0, {}
        failure = None
        if self.rescaled_start is not None:  # written by another world (the client checked)
            which = {k: v for k, v in which.items() if k != "workers"}
        try:
            out = ckpt.restore(self.resume_from, state, self.rank, which)
            if self.rescaled_start is not None:
                # the LR schedule reads the optimizer's step: the new world's step count
                self.inner.iterations.assign(self.rescaled_start)
                out = (self.rescaled_start, out[1])
        except (OSError, ValueError) as exc:
            failure = exc
        if self._barrier(failed=failure is not None):  # Horovod: every rank learns it
            if failure is not None:
                raise failure
            raise RuntimeError("rank 0 could not load the checkpoint; its error names the cause")
        return out

    def _barrier(self, failed: bool = False) -> bool:
        """Horovod: wait for every rank; True if any rank reports a failure."""
        flag = self.tf.constant(1.0 if failed else 0.0)
        if self.world > 1:
            flag = self.hvd.allreduce(flag, op=self.hvd.Sum, name="hpclab_barrier")
        return float(flag) > 0

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        """Train to the end (or a collective stop / non-finite loss); this rank's summary."""
        wall0, t_setup = time.time(), time.perf_counter()
        self.setup()
        t_trace = time.perf_counter()
        PROGRESS.enter("compile")  # until the first call returns: tracing, graph optimisation
        self.train_call.get_concrete_function()  # trace now, so trace time is its own figure
        timing = {"setup_s": t_trace - t_setup, "trace_s": time.perf_counter() - t_trace}
        m = self._meters()
        ckpt.restore_host(self.host, self.watch, m.noise, self.start_step)
        samples_per_step = self.cfg.batch_per_worker * self.world
        step, status, error = self.start_step, "finished", None
        # Rank 0 decides (stop, publish, next_steps) before each call; the call's allreduce tells
        # every rank, so all act on the same decisions after the same step. next_steps sizes the
        # call after the one that carries it (rank 0 needs one timed call to size the next).
        k_plan, decided = m.sizer.first, self._decide(m)
        t_start = t_prev = time.perf_counter()
        evaluating = 0.0  # seconds of held-out evaluation since the previous call ended
        m.publisher.publish("running", step)  # tells the client the ranks reached the loop
        while step < self.total_steps:
            k = self._call_steps(step, k_plan)
            t0 = time.perf_counter()
            reduced, took, guard = self._call(step, k, decided)
            t1 = time.perf_counter()
            self.call.took(k, t1 - t0)
            if "first_call_s" in timing:
                PROGRESS.call_took(t1 - t0)
            timing.setdefault("first_call_s", t1 - t0)  # graph optimisation happens here
            PROGRESS.enter("training", step + k)
            # host time: everything between two calls (Python, telemetry, publishing) but the
            # evaluation, which is timed apart and is not training time
            m.clock.add(k, t1 - t0, t0 - t_prev - evaluating, took)
            m.rates.add_call(k * samples_per_step, t1 - t_prev - evaluating)
            t_prev, evaluating = t1, 0.0
            spike = self.watch.after_call(guard, step, k, self.digest)
            back = self.watch.roll_back(spike) if spike is not None else None
            if back is not None:  # every rank: the same spike, the same state
                step = back
                m.epochs.rollback(back)
                continue
            step += k
            m.timeline.after_call(step)
            m.add(reduced, k, t0)
            status, error = self._outcome(reduced, step, spike)
            epoch_end = step % self.steps_per_epoch == 0 or step >= self.total_steps
            # an epoch end ends a row and publishes up to RANK_LISTS_MAX ranks (every lesson
            # reads rows at epoch ends); above, its row rides in the next due message
            epoch_row = epoch_end and self.world <= RANK_LISTS_MAX
            evaluating += self._window_end(m, reduced, step, epoch_row, status, t_start)
            if self.ckpt.due(step, status, self.total_steps):  # (not training time either)
                evaluating += self._checkpoint(step, m)
            if status != "finished":
                break
            if epoch_end:
                evaluating += self._epoch_end(m, step, t_start)
            if reduced[R["publish"]] > 0 or epoch_row:
                m.publisher.publish("running", step, time.perf_counter())
            k_plan = max(1, int(reduced[R["next_steps"]]))
            m.sizer.observe(k, t1 - t0)
            decided = self._decide(m)
        return {**self._finish(m, status, error, step, t_start, wall0), **timing}

    def _meters(self) -> LoopMeters:
        cfg, world = self.cfg, self.world
        B = cfg.batch_per_worker
        from ipyparallel.datapub import publish_data

        epochs = EpochMeter(world)
        publisher = Publisher(  # rank 0 also writes every row to the run folder
            publish_data if self.rank == 0 else None,
            cfg.publish_every_s,
            self.total_steps,
            folder=self.run_dir if self.rank == 0 else None,
            world=world,
        )
        return LoopMeters(
            window=WindowMeter(B, world, self.steps_per_epoch),
            epochs=epochs,
            rates=ThroughputLog(),
            clock=RankClock(self.local_batch),
            noise=NoiseScale(B, B * world) if self.step.track_noise else None,
            publisher=publisher,
            sizer=CallSizer(
                first=cfg.steps_per_call or FIRST_CALL_STEPS,
                fixed=cfg.steps_per_call,
                target_s=CALL_TARGET_S,
                limit=MAX_STEPS_PER_CALL,
            ),
            timeline=TimelineWindow(self.hvd, self.run_dir, cfg.timeline_steps, world),
        )

    def _call_steps(self, step: int, planned: int) -> int:
        """Steps of the call starting at ``step``: the plan, cut at the epoch's end, the run's
        end, the next held-out evaluation, the fault's step and the next checkpoint."""
        in_epoch = step % self.steps_per_epoch
        return int(
            min(
                planned,
                self.steps_per_epoch - in_epoch,
                self.total_steps - step,
                self._to_eval(step),
                self.watch.steps_to_cut(step),
                self.ckpt.steps_to(step, self.total_steps),
            )
        )

    def _call(self, step: int, k: int, decided):
        """One compiled call of ``k`` steps from ``step``: the reduced telemetry, this rank's
        seconds of each part of the step, the detector's state out."""
        tf = self.tf
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        self.watch.before_call(self.model, step, self.digest)
        guard, flip = self.watch.inputs(step, k)
        reduced, took, guard = self.call.next_function()(
            tf.constant(epoch),
            tf.constant(in_epoch),
            tf.constant(k),
            tf.constant(decided),
            tf.constant(guard),
            tf.constant(flip),
        )
        took = {part: float(seconds.numpy()) for part, seconds in took.items()}
        return reduced.numpy(), took, guard.numpy()  # (syncs)

    def _outcome(self, reduced, step: int, spike: int | None):
        """``(status, error)`` after the call that ended at ``step``: a spike no rollback could
        undo, a non-finite loss, rank 0's stop, or still running ("finished")."""
        if spike is not None and self.watch.rollback:
            return "diverged", (
                f"the loss spiked at step {spike} again after {MAX_ROLLBACKS} rollbacks to the "
                "same state: the fault is not transient (or the spike factor too low)"
            )
        if reduced[R["nonfinite"]] > 0:
            return "diverged", (
                f"the loss became NaN or infinite at step {step} "
                f"(lr {self._lr(step):.4g}); lower base_lr, add warm-up, or use LARS"
            )
        if reduced[R["stop"]] > 0 and step < self.total_steps:
            return "stopped", None  # (a stop that lands in the last call finds the run done)
        return "finished", None

    def _window_end(self, m, reduced, step, epoch_row, status, t_start) -> float:
        """A held-out evaluation if one is due, and the telemetry window's history row where one
        ends (every rank gathers its detail on the same calls); the seconds evaluated."""
        point, evaluated = None, 0.0  # a held-out evaluation ends a history row
        due = self.eval_every and (step % self.eval_every == 0 or step >= self.total_steps)
        if status == "finished" and due:
            t_eval = time.perf_counter()
            with self.step.evaluated(), PROGRESS.during("evaluation", step):
                point = self.val.subset()
            evaluated = time.perf_counter() - t_eval
            m.clock.add_eval(evaluated)
        # (above RANK_LISTS_MAX ranks not at every epoch end: at 64 ranks the default data
        # makes 8-step epochs, and a row and a publish at each cost rank 0 as much as its
        # steps, benchmarks/epoch_overhead.py)
        last = step >= self.total_steps or status != "finished"
        if reduced[R["publish"]] > 0 or epoch_row or point or last:
            detail = self.call.gather_detail(m.clock.take())  # every rank, same calls
            if self.rank == 0:
                row = m.window.row(
                    step, time.perf_counter() - t_start, self._lr(step), detail, m.noise
                )
                row["eval_loss"], row["eval_accuracy"] = point or (float("nan"),) * 2
                m.rates.add_window(detail)
                m.publisher.add_row(row)
            else:
                m.window.reset()
        return evaluated

    def _epoch_end(self, m, step: int, t_start: float) -> float:
        """The full held-out evaluation and the epoch's row; the seconds evaluated."""
        t_eval = time.perf_counter()
        with self.step.evaluated(), PROGRESS.during("evaluation", step):
            val = self.val.full_set() if self._full_eval_due(step) else (float("nan"),) * 2
        t = time.perf_counter()
        m.clock.add_eval(t - t_eval)  # (lands in the next row's window)
        row = m.epochs.close(step, t, t - t_start, self._lr(step), val)
        row["epoch"] = -(-step // self.steps_per_epoch)  # (a resumed run counts on)
        m.publisher.add_epoch(row)
        return t - t_eval

    def _full_eval_due(self, step: int) -> bool:
        """Whether the epoch ending at ``step`` evaluates the whole validation set
        (:meth:`hpclab.core.plan.RunPlan.full_eval_due`; never without one)."""
        return self.val is not None and self.plan.full_eval_due(step)

    def _checkpoint(self, step: int, m: LoopMeters) -> float:
        """Rank 0 writes the whole state at ``step``; the seconds it took."""
        if self.rank != 0:
            return 0.0
        with PROGRESS.during("checkpoint", step):
            values = [v.numpy() for v in self.state]
            return self.ckpt.save(step, values, ckpt.host_state(self.watch, m.noise))

    def _finish(self, m, status, error, step, t_start, wall0) -> dict:
        """After the loop: the run judged, the final rows published, this rank's summary."""
        PROGRESS.enter("finish", step)
        cfg, world = self.cfg, self.world
        train_time = time.perf_counter() - t_start
        if self.val is not None:  # (synthetic data has random labels: chance is all it can do)
            status, error = judge(
                status,
                error,
                m.epochs.rows[-1] if m.epochs.rows else None,
                warmup_steps=self.plan.warmup_steps,
                num_classes=self.num_classes,
                peak_lr=self.plan.peak_lr,
            )
        m.publisher.publish(status, step, time.perf_counter())  # every rank left the loop
        m.publisher.close()
        m.timeline.after_call(step, last=True)
        summary = self._summary(status, error, step, m, wall0)
        if self.rank == 0 and m.timeline.summary is not None:
            summary["timeline"] = m.timeline.summary
        if self.rank == 0:
            summary["checkpoints"] = self.ckpt.summary()
        if self.call.untimed is not None:  # (timed, untimed) s per step of adjacent calls
            summary["stamp_pairs"] = self.call.pairs
        summary["start_step"] = self.start_step
        summary["train_time_s"] = train_time
        summary["augment_offline_s"] = self.train_input.offline_s  # before training
        summary["input_pipeline"] = self.input_info  # a file dataset's reads (rank.stream)
        # the rate a user waits on: validation and host time included (Amdahl's serial part)
        samples = (step - self.start_step) * cfg.batch_per_worker * world
        summary["overall_samples_per_sec"] = samples / train_time if train_time else None
        return summary

    def _to_eval(self, step: int) -> int:
        """Steps from `step` to the next held-out evaluation (calls end there); large if off."""
        return self.eval_every - step % self.eval_every if self.eval_every else self.total_steps

    def _decide(self, m: LoopMeters):
        """Rank 0's decisions (meters.DECISIONS); the other ranks contribute zeros to the sums."""
        if self.rank != 0:
            return decisions()
        # only rank 0 touches the STOP file
        now = time.perf_counter()
        return decisions(self.stop_file.exists(), m.publisher.due(now), m.sizer.plan())

    def _summary(self, status, error, step, m: LoopMeters, wall0) -> dict:
        cfg, world = self.cfg, self.world
        last_epoch = m.epochs.rows[-1] if m.epochs.rows else {}
        summary = {
            "status": status,
            "error": error,
            "rank": self.rank,
            "world_size": world,
            "steps": step,
            "epochs_done": step / self.steps_per_epoch,
            "global_batch": self.plan.global_batch,
            "lr": self.plan.peak_lr,
            "precision": cfg.precision,
            "val_accuracy": last_epoch.get("val_accuracy"),
            "val_loss": last_epoch.get("val_loss"),
            "train_accuracy": last_epoch.get("accuracy"),
            **m.rates.summary(),
            "noise_scale": m.noise.value if m.noise is not None else None,
            "grad_zero_fraction": m.window.run_ratio("grad_zeros", "grad_elems"),
            "weights_digest": self.digest(),
            "sdc": self.watch.summary() if self.watch.on else None,
            # what the optimizer itself counted and used last (tests check them against steps)
            "optimizer_steps": int(self.optimizer.iterations.numpy()),
            "optimizer_last_lr": float(self.schedule(self.optimizer.iterations - 1)),
            "wall_time_s": time.time() - wall0,
        }
        if self.rank == 0:
            summary["time_split"] = m.window.run_split()
            if summary["time_split"]:  # which clock the parts were read from (core/devices.py)
                summary["time_split"]["method"] = self.step.stamp.method
            # the rows are in the run folder (hpclab.rank.publisher): their counts only
            summary["rows_total"] = m.publisher.row_count
            summary["epochs_total"] = m.publisher.epoch_count
        return summary

    def _lr(self, step: int) -> float:
        """The LR of the last step taken (``step`` steps done)."""
        last = min(max(step, 1), self.total_steps) - 1  # (the schedule's clamp)
        return float(self.np.float32(self.plan.lr_at(last)))  # the float32 the optimizer used

    def central_weights(self) -> list:
        """Crossbow's central average model as NumPy arrays ([] for other runs)."""
        return self.step.central_weights()

    def digest(self) -> str:
        """A short hash of this rank's weights: equal on every rank when replicas agree."""
        h = hashlib.sha256()
        for w in self.model.get_weights():
            h.update(self.np.ascontiguousarray(w).tobytes())
        return h.hexdigest()[:16]


__all__ = ["Trainer", "LoopMeters"]

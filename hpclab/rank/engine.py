"""The code that runs on every MPI rank: Horovod set-up and one training run.

Nothing here is called on the client. `hpclab.lab.Lab` calls :func:`init_worker` once per
engine process, then :func:`train` once per run, with plain dicts only. Lines that exist only
for distribution say so (`# Horovod: ...`), the way Horovod's own examples do.

Speed: a compiled custom loop, not `model.fit`. One `tf.function` call runs `steps_per_call`
optimizer steps over a group of batches the input pipeline has already stacked, then ends with a
single small allgather that carries every rank's telemetry and its stop/NaN flags. Per-call
Python overhead — not arithmetic — is what dominates small models, so it is paid once per group.

Stopping is collective: a rank that left the loop alone would leave its peers blocked in the next
allreduce. Each rank looks for the run's STOP file before every call and the allgather tells all
ranks, so they leave after the same step.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import time
from pathlib import Path

_STATE: dict = {}  # per engine process: what init_worker set up (threads can be set only once)

# Telemetry vector each rank contributes per call (one allgather carries them all).
_FIELDS = (
    "loss_sum",
    "correct",
    "count",
    "small_sq",
    "big_sq",
    "stop",
    "nonfinite",
    "prev_sps",
    "prev_input_s",
    "prev_compute_s",
    "prev_steps",
)
_F = {name: i for i, name in enumerate(_FIELDS)}


def init_worker(threads: int = 1) -> dict:
    """Once per engine: CPU threads, GPU pinning, `hvd.init()`. Returns this rank's identity."""
    if _STATE.get("initialised"):
        return dict(_STATE["identity"])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd
    import tensorflow as tf

    # Thread pools can only be sized before TensorFlow's runtime starts, hence here and once.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    hvd.init()  # Horovod: initialise (MPI controller under mpiexec)
    # Horovod: pin one GPU per process by local rank (GPU path follows the TF/Horovod docs; the
    # test machines have no GPU, so this branch is exercised only on clusters).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    identity = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "pid": os.getpid(),
        "host": platform.node(),
        "threads": threads,
        "gpus": len(gpus),
    }
    _STATE.update(initialised=True, identity=identity)
    return dict(identity)


def versions() -> dict:
    import horovod
    import keras
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "horovod": horovod.__version__,
        "numpy": np.__version__,
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
    }


def allreduce_check() -> dict:
    """Doctor helper: allreduce rank+1 over all ranks (expects n(n+1)/2 everywhere)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    t0 = time.perf_counter()
    total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)
    return {"rank": hvd.rank(), "value": float(total.numpy()), "seconds": time.perf_counter() - t0}


def train(cfg_dict: dict, run_dir: str, data_dir: str) -> dict:
    """Train one run on this rank and return this rank's summary (rank 0's also has the rows)."""
    _STATE.pop("last_trainer", None)  # free the previous run's model, graphs and pipeline now
    trainer = _Trainer(cfg_dict, Path(run_dir), Path(data_dir))
    summary = trainer.run()
    # Tearing down TF graphs and a tf.data iterator can take seconds on a busy machine; keep
    # the trainer alive until the next run so this rank's reply goes out at once.
    _STATE["last_trainer"] = trainer
    return summary


class _Trainer:
    def __init__(self, cfg_dict: dict, run_dir: Path, data_dir: Path):
        from hpclab.config import RunConfig

        self.cfg = RunConfig.from_dict(cfg_dict)
        self.cfg_dict = self.cfg.to_dict()
        self.run_dir, self.data_dir = run_dir, data_dir
        self.stop_file = run_dir / "STOP"

    # -- set-up ----------------------------------------------------------------------------
    def _setup(self) -> None:
        import horovod.tensorflow as hvd
        import numpy as np
        import tensorflow as tf

        from hpclab import scaling
        from hpclab.rank import data, models, optimizers

        cfg = self.cfg
        self.tf, self.hvd, self.np = tf, hvd, np
        self.rank, self.world = hvd.rank(), hvd.size()
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(cfg.seed)
        optimizers.set_precision(cfg.precision)

        # Data: rank 0 generates/caches first so ranks never race on the cache file.
        if self.rank == 0:
            arrays = data.load_arrays(self.cfg_dict, self.data_dir)
        self._barrier()  # Horovod: wait for rank 0's cache
        if self.rank != 0:
            arrays = data.load_arrays(self.cfg_dict, self.data_dir)
        self.num_classes, self.input_shape = arrays.num_classes, arrays.input_shape
        self.steps_per_epoch = cfg.steps_per_epoch(self.world)
        self.total_steps = cfg.total_steps(self.world)
        epochs_needed = math.ceil(self.total_steps / self.steps_per_epoch)
        B = cfg.batch_per_worker
        if cfg.dataset == "synthetic":
            self.train_ds = data.synthetic_train_dataset(
                image_shape=tuple(cfg.image_shape),
                num_classes=self.num_classes,
                batch=B,
                steps_per_epoch=self.steps_per_epoch,
                steps_per_call=cfg.steps_per_call,
                epochs=epochs_needed,
                seed=cfg.seed + self.rank,
            )
            self.val_ds = None
        else:
            # Horovod: each rank trains on its own shard of the training set.
            x, y = data.shard(arrays.x_train, arrays.y_train, self.rank, self.world)
            self.train_ds = data.train_dataset(
                x,
                y,
                batch=B,
                steps_per_epoch=self.steps_per_epoch,
                steps_per_call=cfg.steps_per_call,
                epochs=epochs_needed,
                seed=cfg.seed,
                rank=self.rank,
            )
            xv, yv = data.shard(arrays.x_val, arrays.y_val, self.rank, self.world)
            self.val_ds = data.eval_dataset(xv, yv, batch=max(B, 256))

        self.model = models.build_model(cfg.model, self.input_shape, self.num_classes, cfg.seed)
        lr_table = scaling.lr_schedule_array(
            self.total_steps,
            base_lr=cfg.base_lr,
            peak_lr=cfg.peak_lr(self.world),
            warmup_steps=cfg.warmup_steps(self.world),
            schedule=cfg.lr_schedule,
        )
        self.lr_table = lr_table
        self.optimizer = optimizers.build_optimizer(
            self.cfg_dict, optimizers.TableSchedule(lr_table)
        )
        self.loss_scaled = cfg.precision == "mixed_float16"
        self.inner_opt = self.optimizer.inner_optimizer if self.loss_scaled else self.optimizer
        self.inner_opt.build(self.model.trainable_variables)
        # Horovod: start every rank from rank 0's weights and optimizer state.
        hvd.broadcast_variables(self.model.variables, root_rank=0)
        hvd.broadcast_variables(self.inner_opt.variables, root_rank=0)
        self.compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
        self.loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        # The noise scale needs two batch sizes: with one rank there is only one, so skip the norms.
        self.track_noise = cfg.noise_scale and self.world > 1
        self.train_call = tf.function(self._train_call)
        self.eval_step = tf.function(self._eval_step)

    def _barrier(self) -> None:
        self.hvd.allreduce(self.tf.constant(0.0), op=self.hvd.Sum, name="hpclab_barrier")

    # -- compiled pieces ------------------------------------------------------------------
    def _train_call(self, xs, ys, host):
        """`k` optimizer steps (k = xs.shape[0], static), then one telemetry allgather."""
        tf, hvd = self.tf, self.hvd
        variables = self.model.trainable_variables
        zero = tf.constant(0.0)
        loss_sum, correct, small_sq, big_sq = zero, zero, zero, zero
        for i in range(xs.shape[0]):  # unrolled: k is small and static (2 traces: k and the tail)
            x, y = xs[i], ys[i]
            with tf.GradientTape() as tape:
                logits = tf.cast(self.model(x, training=True), tf.float32)
                loss = self.loss_fn(y, logits)
                target = self.optimizer.get_scaled_loss(loss) if self.loss_scaled else loss
            grads = tape.gradient(target, variables)
            if self.loss_scaled:
                grads = self.optimizer.get_unscaled_gradients(grads)
            if self.track_noise:
                small_sq += tf.square(tf.linalg.global_norm(grads))  # |G_small|², before allreduce
            # Horovod: average gradients over ranks (one fused, grouped allreduce).
            grads = hvd.grouped_allreduce(grads, op=hvd.Average, compression=self.compression)
            if self.track_noise:
                big_sq += tf.square(tf.linalg.global_norm(grads))  # |G_big|², after allreduce
            self.optimizer.apply_gradients(zip(grads, variables))
            loss_sum += loss
            pred = tf.argmax(logits, axis=-1, output_type=y.dtype)
            correct += tf.reduce_sum(tf.cast(tf.equal(pred, y), tf.float32))
        k = float(xs.shape[0])
        count = k * float(xs.shape[1])
        nonfinite = 1.0 - tf.cast(tf.math.is_finite(loss_sum), tf.float32)
        mine = tf.concat(
            [
                tf.stack(
                    [loss_sum, correct, tf.constant(count), small_sq, big_sq, host[0], nonfinite]
                ),
                host[1:],
            ],
            axis=0,
        )
        # Horovod: every rank learns every rank's telemetry and flags (same decisions everywhere).
        return hvd.allgather(mine[None, :], name="hpclab_telemetry")

    def _eval_step(self, x, y):
        tf = self.tf
        logits = tf.cast(self.model(x, training=False), tf.float32)
        loss = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        pred = tf.argmax(logits, axis=-1, output_type=y.dtype)
        correct = tf.reduce_sum(tf.cast(tf.equal(pred, y), tf.float32))
        return tf.reduce_sum(loss), correct, tf.cast(tf.shape(y)[0], tf.float32)

    def _validate(self) -> tuple[float, float]:
        if self.val_ds is None:
            return float("nan"), float("nan")
        tf = self.tf
        sums = tf.zeros(3)
        for x, y in self.val_ds:
            sums += tf.stack(self.eval_step(x, y))
        # Horovod: sum loss/correct/count over every rank's validation shard.
        total = self.hvd.allreduce(sums, op=self.hvd.Sum, name="hpclab_validation").numpy()
        return float(total[0] / total[2]), float(total[1] / total[2])

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        wall0 = time.time()
        self._setup()
        from ipyparallel.datapub import publish_data

        from hpclab.metrics import NoiseScale, throughput_stats

        tf, np, cfg = self.tf, self.np, self.cfg
        B, world = cfg.batch_per_worker, self.world
        publish = cfg.publish_every_s > 0 and self.rank == 0
        noise = NoiseScale(B, B * world) if (cfg.noise_scale and world > 1) else None
        rows, epochs, call_rates, rank_rates = [], [], [], []
        window = np.zeros(len(_FIELDS))
        window_rank_samples = np.zeros(world)
        window_rank_time = np.zeros(world)
        window_steps, window_t0 = 0, None
        epoch_acc = np.zeros(3)  # loss_sum, correct, count over the epoch (all ranks)
        epoch_t0 = None
        step, status, error = 0, "finished", None
        prev = np.zeros(4)  # prev_sps, prev_input_s, prev_compute_s, prev_steps
        last_publish = 0.0
        seq = 0

        def publish_now(state: str) -> None:
            nonlocal seq
            seq += 1
            publish_data(
                {
                    "hpclab": {
                        "seq": seq,
                        "state": state,
                        "rows": rows[-200:],
                        "epochs": epochs,
                        "step": step,
                        "total_steps": self.total_steps,
                    }
                }
            )

        t_start = time.perf_counter()
        iterator = self.iterator = iter(self.train_ds)  # kept: see train()
        if publish:
            publish_now("running")  # tells the client the ranks reached the training loop
        while step < self.total_steps:
            t0 = time.perf_counter()
            xs, ys = next(iterator)
            t1 = time.perf_counter()
            k = min(int(xs.shape[0]), self.total_steps - step)
            if k < xs.shape[0]:
                xs, ys = xs[:k], ys[:k]
            stop_flag = 1.0 if self.stop_file.exists() else 0.0
            host = tf.constant([stop_flag, *prev], dtype=tf.float32)
            gathered = self.train_call(xs, ys, host).numpy()  # [world, fields]; syncs
            t2 = time.perf_counter()
            step += k
            prev = np.array([k * B / (t2 - t0), t1 - t0, t2 - t1, k])
            if window_t0 is None:
                window_t0 = t0
                epoch_t0 = epoch_t0 or t0
            # Rank telemetry from the *previous* call arrives now; the first call has none.
            window += gathered.sum(axis=0)
            sps = gathered[:, _F["prev_sps"]]
            if sps.sum() > 0:
                call_rates.append(float(sps.sum()))
                rank_rates.append(sps)
            window_rank_samples += gathered[:, _F["prev_steps"]] * B
            window_rank_time += gathered[:, _F["prev_input_s"]] + gathered[:, _F["prev_compute_s"]]
            window_steps += k
            epoch_acc += gathered[:, [_F["loss_sum"], _F["correct"], _F["count"]]].sum(axis=0)
            if noise is not None:
                noise.update(gathered[:, _F["small_sq"]].mean() / k, gathered[0, _F["big_sq"]] / k)
            if gathered[:, _F["nonfinite"]].any():
                status, error = (
                    "diverged",
                    (
                        f"the loss became NaN or infinite at step {step} "
                        f"(lr {float(self.lr_table[step - 1]):.4g}); lower "
                        "base_lr, add warm-up, or use LARS"
                    ),
                )
            elif gathered[:, _F["stop"]].any():
                status = "stopped"
            epoch_end = step % self.steps_per_epoch == 0 or step >= self.total_steps
            now = time.perf_counter()
            if publish and (
                now - last_publish >= cfg.publish_every_s or epoch_end or status != "finished"
            ):
                rows.append(
                    self._row(
                        step,
                        now - t_start,
                        window,
                        window_steps,
                        window_rank_samples,
                        window_rank_time,
                        noise,
                    )
                )
                window[:] = 0
                window_rank_samples[:] = 0
                window_rank_time[:] = 0
                window_steps = 0
            if status != "finished":
                break
            if epoch_end:
                val_loss, val_acc = self._validate()
                epoch_time = time.perf_counter() - epoch_t0
                epochs.append(
                    {
                        "epoch": len(epochs) + 1,
                        "step": step,
                        "time_s": time.perf_counter() - t_start,
                        "loss": epoch_acc[0] / max(1.0, epoch_acc[2] / B),
                        "accuracy": epoch_acc[1] / max(1.0, epoch_acc[2]),
                        "val_loss": val_loss,
                        "val_accuracy": val_acc,
                        "lr": float(self.lr_table[step - 1]),
                        "samples_per_sec": epoch_acc[2] / epoch_time if epoch_time > 0 else None,
                    }
                )
                epoch_acc[:] = 0
                epoch_t0 = time.perf_counter()
            if publish and (now - last_publish >= cfg.publish_every_s or epoch_end):
                publish_now("running")
                last_publish = time.perf_counter()
        train_time = time.perf_counter() - t_start
        if publish:
            publish_now(status)  # the final rows, and word that every rank has left the loop

        skip = max(3, int(0.1 * len(call_rates)))
        stats = throughput_stats(call_rates, skip=skip)
        last_epoch = epochs[-1] if epochs else {}
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
            "samples_per_sec": stats.mean,
            "samples_per_sec_ci95": stats.ci95,
            "throughput_intervals": stats.n,
            "rank_samples_per_sec": [
                throughput_stats(col, skip=skip).mean for col in np.array(rank_rates).T
            ]
            if rank_rates
            else [],
            "noise_scale": noise.value if noise is not None else None,
            "weights_digest": self._digest(),
            "train_time_s": train_time,
            "wall_time_s": time.time() - wall0,
            "versions": versions(),
        }
        if self.rank == 0:
            summary["rows"] = rows
            summary["epochs"] = epochs
        return summary

    def _row(self, step, t, window, steps, rank_samples, rank_time, noise) -> dict:
        B, world = self.cfg.batch_per_worker, self.world
        count = max(window[_F["count"]], 1.0)
        rank_sps = [float(s / tt) if tt > 0 else None for s, tt in zip(rank_samples, rank_time)]
        prev_steps = max(window[_F["prev_steps"]], 1.0)
        return {
            "step": step,
            "epoch": step / self.steps_per_epoch,
            "samples": step * B * world,
            "time_s": t,
            "loss": float(window[_F["loss_sum"]] / max(steps * world, 1)),
            "accuracy": float(window[_F["correct"]] / count),
            "lr": float(self.lr_table[step - 1]),
            "samples_per_sec": float(sum(s for s in rank_sps if s)) if any(rank_sps) else None,
            "rank_samples_per_sec": rank_sps,
            "input_ms": float(1000 * window[_F["prev_input_s"]] / prev_steps),
            "compute_ms": float(1000 * window[_F["prev_compute_s"]] / prev_steps),
            "grad_norm_small_sq": float(window[_F["small_sq"]] / max(steps * world, 1)),
            "grad_norm_big_sq": float(window[_F["big_sq"]] / max(steps * world, 1)),
            "noise_scale": noise.value if noise is not None else float("nan"),
        }

    def _digest(self) -> str:
        h = hashlib.sha256()
        for w in self.model.get_weights():
            h.update(self.np.ascontiguousarray(w).tobytes())
        return h.hexdigest()[:16]

"""Baseline: plain Horovod + tf.keras `model.fit`, written the way Horovod's own example is.

Shape follows horovod/examples/tensorflow2/tensorflow2_keras_mnist.py (hvd.init, pin GPU, scale
the LR by the number of ranks, `hvd.DistributedOptimizer`, `BroadcastGlobalVariablesCallback`,
`MetricAverageCallback`, verbose only on rank 0), but on hpclab's model and data so that it can be
compared with the hpclab engine one for one:

* model: `hpclab.rank.models.build_model("cnn1d", ...)` (5,210 parameters, float32 logits);
* data: `hpclab.rank.data.load_arrays` MNIST-1D (default 40k samples, 20 % held out), each rank on its
  `hpclab.rank.data.shard` (contiguous 1/N slice), `steps_per_epoch = RunConfig.for_workers(N).steps_per_epoch`;
* batch per rank, SGD momentum 0.9, LR 0.05 x global_batch / 64 (hpclab's "linear" default);
* 1 intra-op thread (and 1 inter-op thread) per rank, as the Lab's engines use by default.

Throughput is measured the Horovod-benchmark way, with the same estimator the engine uses: a Keras
callback stamps the end of every batch; rates are taken over windows of `--interval` batches
(default 8, the hand-written loop's steps per call) inside an epoch, the first max(3, 10 %)
windows are dropped as warm-up, each window's rates are summed over ranks (= per rank x size),
then mean ± 1.96 σ weighted by the windows' seconds (all samples over all seconds of the kept
windows, as the engine's). It also reports the all-in wall rate of every epoch after the first.

Launch:  .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/plain_horovod_fit.py --batch 64
Rank 0 prints one JSON line (prefixed by nothing, starting with '{"benchmark"') at the end.

Optimizer compatibility (Horovod 0.28.1 + TF 2.15): `hvd.DistributedOptimizer` builds a class
from `optimizer.__class__` and overrides `compute_gradients`/`_compute_gradients` and
`apply_gradients`; with Keras 2.15's new optimizers `Model.train_step` calls
`optimizer.minimize(loss, vars, tape=tape)` -> `compute_gradients`, so the allreduce happens, and
`BroadcastGlobalVariablesCallback` reads `optimizer.variables()` through Horovod's `CallableList`
shim. Both `--optimizer keras` (tf.keras.optimizers.SGD) and `--optimizer legacy`
(tf.keras.optimizers.legacy.SGD) therefore run; the default is `legacy`, the optimizer family
Horovod 0.28.1 was written and tested against (see benchmarks/README.md for the measured check).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--num-samples", type=int, default=40000, help="MNIST-1D samples generated")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--base-lr", type=float, default=0.05, help="LR at global batch 64")
    p.add_argument(
        "--optimizer",
        choices=("legacy", "keras"),
        default="legacy",
        help="tf.keras.optimizers.legacy.SGD or the new tf.keras.optimizers.SGD",
    )
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--interval", type=int, default=8, help="batches per throughput window")
    p.add_argument(
        "--steps-per-execution",
        type=int,
        default=1,
        help="batches per compiled call (Keras compile(steps_per_execution=...)); a tuned fit",
    )
    p.add_argument("--verbose", type=int, default=1, help="Keras verbosity on rank 0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="default: hpclab.records.paths.data_dir()")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    # Same environment the Lab gives its engines: quiet TF, no hidden OpenMP threads.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    from hpclab.core.config import RunConfig
    from hpclab.core.metrics import throughput_stats
    from hpclab.rank import data, models
    from hpclab.records import paths

    # Thread pools are sized before TF's runtime starts (same rule as hpclab.rank.engine.init_worker).
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, args.threads)))

    # Horovod: initialize Horovod.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    # Horovod: pin GPU to be used to process local rank (one GPU per process).
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    tf.keras.utils.set_random_seed(args.seed)
    cfg = RunConfig(
        num_samples=args.num_samples,
        batch_per_worker=args.batch,
        epochs=args.epochs,
        seed=args.seed,
    )
    data_dir = args.data_dir or paths.data_dir()
    arrays = data.load_arrays(cfg.to_dict(), data_dir)  # flock-protected cache: ranks may race
    # Horovod: each rank trains on its own shard (the same contiguous slice as the engine).
    x, y = data.shard(arrays.x_train, arrays.y_train, rank, size)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = (
        dataset.repeat()
        .shuffle(10000, seed=args.seed + rank)
        .batch(args.batch)
        .prefetch(tf.data.AUTOTUNE)
    )  # prefetch: not in the example; fairer to fit
    steps_per_epoch = cfg.for_workers(
        size
    ).steps_per_epoch  # Horovod: steps shrink with the number of ranks

    model = models.build_model("cnn1d", arrays.input_shape, arrays.num_classes, args.seed)

    # Horovod: adjust learning rate based on number of ranks (linear scaling, global batch / 64).
    scaled_lr = args.base_lr * args.batch * size / 64
    if args.optimizer == "legacy":
        opt = tf.keras.optimizers.legacy.SGD(learning_rate=scaled_lr, momentum=0.9)
    else:
        opt = tf.keras.optimizers.SGD(learning_rate=scaled_lr, momentum=0.9)
    # Horovod: add Horovod DistributedOptimizer.
    opt = hvd.DistributedOptimizer(opt)

    # Horovod: Specify `experimental_run_tf_function=False` to ensure TensorFlow
    # uses hvd.DistributedOptimizer() to compute gradients.
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=opt,
        metrics=["accuracy"],
        experimental_run_tf_function=False,
        # batches per compiled call: Keras calls back once per call (a tuned fit sets it > 1)
        steps_per_execution=args.steps_per_execution,
    )

    timer = _BatchTimer()
    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),
        timer,
    ]
    # Horovod: write logs on worker 0.
    verbose = args.verbose if rank == 0 else 0

    t_fit = time.perf_counter()
    history = model.fit(
        dataset,
        steps_per_epoch=steps_per_epoch,
        epochs=args.epochs,
        callbacks=callbacks,
        verbose=verbose,
    )
    train_time = time.perf_counter() - t_fit

    # --- throughput: the engine's estimator (per-window rates summed over ranks) ------------------
    if args.interval % args.steps_per_execution:
        raise SystemExit(
            f"--interval ({args.interval}) must be a multiple of --steps-per-execution "
            f"({args.steps_per_execution}): Keras stamps a batch end once per call."
        )
    per_stamp = args.steps_per_execution  # batches between two stamps of the timer
    secs = np.asarray(timer.window_seconds(args.interval // per_stamp), dtype=np.float64)
    rates = args.interval * args.batch / secs
    # Horovod: every rank ran the same steps, so every rank has the same number of windows.
    all_rates = hvd_tf.allgather(tf.constant(rates[None, :])).numpy()  # [size, windows]
    all_secs = hvd_tf.allgather(tf.constant(secs[None, :])).numpy()
    global_rates, weights = all_rates.sum(axis=0), all_secs.mean(axis=0)
    skip = max(3, int(0.1 * len(global_rates)))
    # time-weighted like the engine's: the mean is all samples over all seconds of the kept windows
    stats = throughput_stats(global_rates, skip=skip, weights=weights)
    rank_means = [
        throughput_stats(r, skip=skip, weights=w).mean for r, w in zip(all_rates, all_secs)
    ]
    per_rank = throughput_stats(rates, skip=skip, weights=secs)
    epoch_rates = [args.batch * steps_per_epoch * size / dt for dt in timer.epoch_seconds()]
    # Horovod: the mean over ranks of the wall rate, so every rank agrees on one figure.
    epoch_rates = (
        hvd_tf.allreduce(tf.constant(epoch_rates, dtype=tf.float64), op=hvd_tf.Average)
        .numpy()
        .tolist()
    )
    steady = epoch_rates[1:] or epoch_rates
    # CPU time per sample of this rank in epochs 2..E: insensitive to other jobs on the machine
    # at 1 rank (at 2+ ranks, time spent spinning in MPI while a peer is descheduled counts too).
    cpu = timer.epoch_cpu_seconds()
    cpu_steady = cpu[1:] or cpu
    cpu_us = 1e6 * sum(cpu_steady) / (len(cpu_steady) * steps_per_epoch * args.batch)
    cpu_us = float(
        hvd_tf.allreduce(tf.constant(cpu_us, dtype=tf.float64), op=hvd_tf.Average).numpy()
    )

    if rank == 0:
        result = {
            "benchmark": "plain_horovod_fit",
            "ranks": size,
            "batch_per_rank": args.batch,
            "global_batch": args.batch * size,
            "threads_per_rank": args.threads,
            "epochs": args.epochs,
            "steps_per_epoch": steps_per_epoch,
            "interval_batches": args.interval,
            "steps_per_execution": args.steps_per_execution,
            "samples_per_sec": stats.mean,
            "samples_per_sec_ci95": stats.ci95,
            "intervals": stats.n,
            "per_rank_samples_per_sec": per_rank.mean,
            "rank_samples_per_sec": rank_means,
            "epoch_samples_per_sec": epoch_rates,
            "steady_epoch_samples_per_sec": float(np.mean(steady)),
            "cpu_us_per_sample_per_rank": cpu_us,
            "train_time_s": train_time,
            "optimizer": f"{type(opt).__module__}.{type(opt).__name__}",
            "accuracy": float(history.history["accuracy"][-1]),
            "loss": float(history.history["loss"][-1]),
            "horovod_env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
        }
        sys.stdout.write("\n" + json.dumps(result) + "\n")
        sys.stdout.flush()


class _BatchTimer:
    """Keras callback: a timestamp at the start of every epoch and the end of every batch."""

    def __new__(cls):
        import tensorflow as tf

        class BatchTimer(tf.keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.epochs: list[list[float]] = []  # per epoch: [begin, end of batch 1, ...]
                self.ends: list[float] = []
                self.cpu_begin: list[float] = []
                self.cpu_end: list[float] = []

            def on_epoch_begin(self, epoch, logs=None):
                self.cpu_begin.append(time.process_time())  # this process, all threads
                self.epochs.append([time.perf_counter()])

            def on_train_batch_end(self, batch, logs=None):
                self.epochs[-1].append(time.perf_counter())

            def on_epoch_end(self, epoch, logs=None):
                self.ends.append(time.perf_counter())
                self.cpu_end.append(time.process_time())

            def window_seconds(self, interval: int) -> list[float]:
                """Seconds of consecutive windows of `interval` batches within each epoch."""
                out = []
                for stamps in self.epochs:
                    for i in range(0, len(stamps) - interval, interval):
                        out.append(stamps[i + interval] - stamps[i])
                return out

            def epoch_cpu_seconds(self) -> list[float]:
                return [b - a for a, b in zip(self.cpu_begin, self.cpu_end)]

            def epoch_seconds(self) -> list[float]:
                return [end - stamps[0] for stamps, end in zip(self.epochs, self.ends)]

        return BatchTimer()


if __name__ == "__main__":
    main()

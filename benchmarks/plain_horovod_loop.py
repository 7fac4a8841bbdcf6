"""Reference C: a minimal hand-written compiled loop, the way Horovod's TF2 examples are written.

Shape follows horovod/examples/tensorflow2/tensorflow2_mnist.py (`hvd.DistributedGradientTape`,
a `tf.function` training step, variables broadcast from rank 0 after the first step, the LR scaled
by the number of ranks), with one change every fast TF2 loop makes: each `tf.function` call runs
K optimizer steps (default 8) over a repeated, shuffled, prefetched `tf.data` iterator, so Python
runs once per K steps. Nothing else: no telemetry, no validation, no callbacks. It is the stack's
own ceiling for hpclab's engine (arm C of `make bench`), on the same problem:

* model: `hpclab.rank.models.build_model("cnn1d", ...)` (the engine's model, same seed);
* data: `hpclab.rank.data.load_arrays` MNIST-1D (default 40k samples, 20 % held out), each rank on
  its `hpclab.rank.data.shard`, `steps_per_epoch = RunConfig.for_workers(N).steps_per_epoch`;
* batch per rank 64, momentum-0.9 SGD at LR 0.05 x global_batch / 64; one intra-op thread per rank.

With ``--input resident --num-groups 1`` (arm D of `make bench`) it is the fair ceiling instead:
each rank's shard stays in memory as tensors and each step gathers its batch in the graph from a
per-epoch permutation (as the engine's resident input does, no `tf.data` iterator in the loop), K
= 32 steps a call, and the gradients go in one grouped allreduce (``num_groups=1`` of
`hvd.DistributedGradientTape`, the engine's default ``grad_allreduce="grouped"``) instead of one
allreduce per tensor.

Throughput uses the estimator of plain_horovod_fit.py and of the engine: every call of K steps is
one window (time from the previous call's end, so host time between calls counts), the first
max(3, 10 %) windows are dropped, each window's rates are summed over ranks, mean ± 1.96 σ
weighted by the windows' seconds (all samples over all seconds, as the engine's).

Launch:  .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/plain_horovod_loop.py
Rank 0 prints one JSON line starting with '{"benchmark"' at the end (plain_horovod_fit.py's
protocol, so benchmarks/run.py reads both with one function).
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
    p.add_argument("--steps-per-call", type=int, default=8, help="K optimizer steps per call")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument(
        "--input",
        choices=("dataset", "resident"),
        default="dataset",
        help="a tf.data iterator (Horovod's examples) or batches gathered in the graph",
    )
    p.add_argument(
        "--num-groups", type=int, default=0, help="DistributedGradientTape groups (0: per tensor)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="default: hpclab.records.paths.data_dir()")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from hpclab.core.config import RunConfig
    from hpclab.core.metrics import throughput_stats
    from hpclab.rank import data, models
    from hpclab.records import paths

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
    cfg = RunConfig(num_samples=args.num_samples, batch_per_worker=args.batch, seed=args.seed)
    arrays = data.load_arrays(cfg.to_dict(), args.data_dir or paths.data_dir())
    # Horovod: each rank trains on its own shard (the same contiguous slice as the engine).
    x, y = data.shard(arrays.x_train, arrays.y_train, rank, size)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .shuffle(10000, seed=args.seed + rank)
        .batch(args.batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    steps_per_epoch = cfg.for_workers(size).steps_per_epoch
    if args.input == "resident":  # the shard in memory; a batch gathered in the graph per step
        xs, ys = tf.constant(x), tf.constant(y)
        n_used = steps_per_epoch * args.batch
        perm = tf.Variable(tf.range(n_used, dtype=tf.int32), trainable=False)
        position = tf.Variable(0, dtype=tf.int32, trainable=False)  # step within the epoch

        def reshuffle():
            perm.assign(tf.random.shuffle(tf.range(tf.shape(xs)[0], dtype=tf.int32))[:n_used])
            position.assign(0)

        class Resident:  # next(batches) -> (images, labels), traced into the while_loop
            def __next__(self):
                ids = perm[position * args.batch : (position + 1) * args.batch]
                position.assign_add(1)
                return tf.gather(xs, ids), tf.gather(ys, ids)

        batches = Resident()
        reshuffle()
    else:
        batches = iter(dataset)

    model = models.build_model("cnn1d", arrays.input_shape, arrays.num_classes, args.seed)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Horovod: adjust learning rate based on number of ranks (linear scaling, global batch / 64).
    opt = tf.keras.optimizers.SGD(args.base_lr * args.batch * size / 64, momentum=0.9)

    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        # Horovod: add Horovod Distributed GradientTape (num_groups=1: one grouped allreduce).
        groups = {"num_groups": args.num_groups} if args.num_groups else {}
        tape = hvd.DistributedGradientTape(tape, **groups)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def first_step(iterator):
        loss = step(*next(iterator))
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        # This is necessary to ensure consistent initialization of all workers when
        # training is started with random weights or restored from a checkpoint.
        # Done after the first step so that the optimizer's variables exist.
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    @tf.function
    def train_steps(iterator, k):
        loss = tf.constant(0.0)
        for _ in tf.range(k):  # AutoGraph: one while_loop, traced once for every k
            loss = step(*next(iterator))
        return loss

    k_full = args.steps_per_call
    t0 = time.perf_counter()
    first_step(batches).numpy()
    first_call_s = time.perf_counter() - t0
    done_in_epoch0 = 1  # the first step counts towards epoch 1

    secs, epoch_s, cpu_s = [], [], []
    t_fit = time.perf_counter()
    for epoch in range(args.epochs):
        cpu0, t_epoch = time.process_time(), time.perf_counter()
        left = steps_per_epoch - (done_in_epoch0 if epoch == 0 else 0)
        if args.input == "resident" and epoch > 0:
            reshuffle()
        t_prev = t_epoch
        while left > 0:
            k = min(k_full, left)
            train_steps(batches, tf.constant(k)).numpy()  # .numpy() syncs
            now = time.perf_counter()
            if k == k_full:
                secs.append(now - t_prev)
            t_prev = now
            left -= k
        epoch_s.append(time.perf_counter() - t_epoch)
        cpu_s.append(time.process_time() - cpu0)
    train_time = time.perf_counter() - t_fit

    secs = np.asarray(secs, dtype=np.float64)
    rates = k_full * args.batch / secs
    # Horovod: every rank ran the same calls, so every rank has the same number of windows.
    all_rates = hvd.allgather(tf.constant(rates[None, :])).numpy()  # [size, windows]
    all_secs = hvd.allgather(tf.constant(secs[None, :])).numpy()
    global_rates, weights = all_rates.sum(axis=0), all_secs.mean(axis=0)
    skip = max(3, int(0.1 * len(global_rates)))
    # time-weighted like the engine's: the mean is all samples over all seconds of the kept windows
    stats = throughput_stats(global_rates, skip=skip, weights=weights)
    rank_means = [
        throughput_stats(r, skip=skip, weights=w).mean for r, w in zip(all_rates, all_secs)
    ]
    epoch_rates = [args.batch * steps_per_epoch * size / s for s in epoch_s]
    epoch_rates = (
        hvd.allreduce(tf.constant(epoch_rates, dtype=tf.float64), op=hvd.Average).numpy().tolist()
    )
    steady = epoch_rates[1:] or epoch_rates
    cpu_steady = cpu_s[1:] or cpu_s
    cpu_us = 1e6 * sum(cpu_steady) / (len(cpu_steady) * steps_per_epoch * args.batch)
    cpu_us = float(hvd.allreduce(tf.constant(cpu_us, dtype=tf.float64), op=hvd.Average).numpy())

    if rank == 0:
        result = {
            "benchmark": "plain_horovod_loop",
            "input": args.input,
            "num_groups": args.num_groups,
            "ranks": size,
            "batch_per_rank": args.batch,
            "global_batch": args.batch * size,
            "threads_per_rank": args.threads,
            "epochs": args.epochs,
            "steps_per_epoch": steps_per_epoch,
            "steps_per_call": k_full,
            "interval_batches": k_full,
            "samples_per_sec": stats.mean,
            "samples_per_sec_ci95": stats.ci95,
            "intervals": stats.n,
            "rank_samples_per_sec": rank_means,
            "epoch_samples_per_sec": epoch_rates,
            "steady_epoch_samples_per_sec": float(np.mean(steady)),
            "cpu_us_per_sample_per_rank": cpu_us,
            "first_call_s": first_call_s,
            "train_time_s": train_time,
            "optimizer": f"{type(opt).__module__}.{type(opt).__name__}",
            "horovod_env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
        }
        sys.stdout.write("\n" + json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

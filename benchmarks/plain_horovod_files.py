"""Reference F: a plain tf.data + Horovod script reading a file dataset's TFRecords, written the
way Horovod's tensorflow2_mnist.py is (``hvd.DistributedGradientTape``, a ``tf.function`` step,
variables broadcast after the first step), with the tf.data performance guide's pipeline
(https://www.tensorflow.org/guide/data_performance): files sharded across ranks
(``Dataset.shard`` on the file list), read in parallel (``interleave``), shuffled, batched,
parsed in parallel on whole batches, prefetched; K steps per ``tf.function`` call.

Same problem as the engine's streamed arm of ``make bench`` (section ``files``): the same
folder and ``dataset.json`` (hpclab.core.filedata), the same model (a ``package.module:function``
on PYTHONPATH, e.g. examples/byo ``my_model:small_cnn``), batch, momentum SGD and ranks.
Throughput uses plain_horovod_loop.py's estimator (windows of one call, first max(3, 10 %)
dropped, rates summed over ranks, time-weighted mean).

Launch:  mpiexec -n 2 python benchmarks/plain_horovod_files.py --data DIR --model my_model:small_cnn
Rank 0 prints one JSON line starting with '{"benchmark"'.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a folder with dataset.json (TFRecord)")
    p.add_argument("--model", required=True, help="package.module:function")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--base-lr", type=float, default=0.05, help="LR at global batch 64")
    p.add_argument("--steps-per-call", type=int, default=8)
    p.add_argument("--buffer", type=int, default=4096, help="shuffle buffer (records)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from hpclab.core.metrics import throughput_stats

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, args.threads)))
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(args.seed)

    desc = json.loads(open(os.path.join(args.data, "dataset.json")).read())
    files = [os.path.join(args.data, e["file"]) for e in desc["train"]]
    records = sum(e["records"] for e in desc["train"])
    shape, kx, ky = desc["x"]["shape"], desc["x"]["key"], desc["y"]["key"]
    spec = {kx: tf.io.FixedLenFeature([], tf.string), ky: tf.io.FixedLenFeature([], tf.int64)}

    def parse(serialized):
        f = tf.io.parse_example(serialized, spec)
        x = tf.reshape(tf.io.decode_raw(f[kx], tf.float32), [-1, *shape])
        return x, tf.cast(f[ky], tf.int32)

    # Horovod: each rank reads its own files.
    dataset = (
        tf.data.Dataset.from_tensor_slices(files)
        .shard(size, rank)
        .repeat()
        .interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
        .shuffle(args.buffer, seed=args.seed + rank)
        .batch(args.batch, drop_remainder=True)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    batches = iter(dataset)
    steps_per_epoch = records // (args.batch * size)

    module, _, function = args.model.partition(":")
    model = getattr(importlib.import_module(module), function)(tuple(shape), desc["classes"])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Horovod: adjust learning rate based on number of ranks (linear scaling, global batch / 64).
    opt = tf.keras.optimizers.SGD(args.base_lr * args.batch * size / 64, momentum=0.9)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        # Horovod: add Horovod Distributed GradientTape.
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def first_step(iterator):
        loss = step(*next(iterator))
        # Horovod: broadcast initial variable states from rank 0 (after the first step, so the
        # optimizer's variables exist).
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    @tf.function
    def train_steps(iterator, k):
        loss = tf.constant(0.0)
        for _ in tf.range(k):
            loss = step(*next(iterator))
        return loss

    k_full = args.steps_per_call
    t0 = time.perf_counter()
    first_step(batches).numpy()
    first_call_s = time.perf_counter() - t0
    secs, epoch_s = [], []
    for epoch in range(args.epochs):
        t_epoch = t_prev = time.perf_counter()
        left = steps_per_epoch - (1 if epoch == 0 else 0)
        while left > 0:
            k = min(k_full, left)
            train_steps(batches, tf.constant(k)).numpy()
            now = time.perf_counter()
            if k == k_full:
                secs.append(now - t_prev)
            t_prev, left = now, left - k
        epoch_s.append(time.perf_counter() - t_epoch)

    secs = np.asarray(secs, dtype=np.float64)
    rates = k_full * args.batch / secs
    all_rates = hvd.allgather(tf.constant(rates[None, :])).numpy()
    all_secs = hvd.allgather(tf.constant(secs[None, :])).numpy()
    skip = max(3, int(0.1 * all_rates.shape[1]))
    stats = throughput_stats(all_rates.sum(axis=0), skip=skip, weights=all_secs.mean(axis=0))
    epoch_rates = [args.batch * steps_per_epoch * size / s for s in epoch_s]
    if rank == 0:
        steady = epoch_rates[1:] or epoch_rates
        result = {
            "benchmark": "plain_horovod_files",
            "ranks": size,
            "batch_per_rank": args.batch,
            "files": len(files),
            "steps_per_epoch": steps_per_epoch,
            "samples_per_sec": stats.mean,
            "samples_per_sec_ci95": stats.ci95,
            "intervals": stats.n,
            "epoch_samples_per_sec": epoch_rates,
            "steady_epoch_samples_per_sec": float(np.mean(steady)),
            "first_call_s": first_call_s,
        }
        sys.stdout.write("\n" + json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

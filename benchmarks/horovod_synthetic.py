"""Reference: the logic of Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark.py.

As in Horovod's script: `tf.keras.applications.ResNet50(weights=None)` (1000-class softmax head),
one random batch of 224x224x3 images and labels generated once and reused every step, plain SGD
0.01, `hvd.DistributedGradientTape` in a `tf.function` step, variables broadcast from rank 0 after
the first step; one first step and `--num-warmup-batches` untimed, then `--num-iters` timings of
`--num-batches-per-iter` steps each with `timeit`; img/sec per rank = mean ± 1.96 σ over the
iterations of rank 0, total = size x that. Added for the side-by-side with hpclab's engine:
`--threads` (one intra-op thread per rank, as the Lab's engines), `--image-size` and
`--num-classes`, and a JSON result line (plain_horovod_fit.py's protocol: rank 0 prints one line
starting with '{"benchmark"').

Launch:  .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/horovod_synthetic.py --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression in allreduce")
    p.add_argument("--model", default="ResNet50", help="model from tf.keras.applications")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size (per rank)")
    p.add_argument("--num-warmup-batches", type=int, default=10, help="warm-up batches, untimed")
    p.add_argument("--num-batches-per-iter", type=int, default=10, help="batches per timing")
    p.add_argument("--num-iters", type=int, default=10, help="number of timings")
    p.add_argument("--image-size", type=int, default=224, help="height = width of the images")
    p.add_argument("--num-classes", type=int, default=1000, help="classes of the head")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, args.threads)))

    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    device = "GPU" if gpus else "CPU"

    # Set up standard model.
    model = getattr(tf.keras.applications, args.model)(
        weights=None,
        input_shape=(args.image_size, args.image_size, 3),
        classes=args.num_classes,
    )
    opt = tf.optimizers.SGD(0.01)

    data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    target = tf.random.uniform(
        [args.batch_size, 1], minval=0, maxval=args.num_classes - 1, dtype=tf.int64
    )

    @tf.function
    def benchmark_step(first_batch):
        # Horovod: (optional) compression algorithm.
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

        # Horovod: use DistributedGradientTape
        with tf.GradientTape() as tape:
            probs = model(data, training=True)
            loss = tf.losses.sparse_categorical_crossentropy(target, probs)

        # Horovod: add Horovod Distributed GradientTape.
        tape = hvd.DistributedGradientTape(tape, compression=compression)

        gradients = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(gradients, model.trainable_variables))

        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        # This is necessary to ensure consistent initialization of all workers when
        # training is started with random weights or restored from a checkpoint.
        #
        # Note: broadcast should be done after the first gradient step to ensure optimizer
        # initialization.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device}s: {hvd.size()}")

    # Warm-up
    log("Running warmup...")
    first_s = timeit.timeit(lambda: benchmark_step(first_batch=True), number=1)
    warmup_s = timeit.timeit(
        lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches
    )

    # Benchmark
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(
            lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter
        )
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
        img_secs.append(img_sec)

    # Results
    img_sec_mean = float(np.mean(img_secs))
    img_sec_conf = float(1.96 * np.std(img_secs))
    log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(
        f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} "
        f"+-{hvd.size() * img_sec_conf:.1f}"
    )
    if hvd.rank() == 0:
        result = {
            "benchmark": "horovod_synthetic",
            "model": args.model,
            "ranks": hvd.size(),
            "batch_per_rank": args.batch_size,
            "image_size": args.image_size,
            "num_classes": args.num_classes,
            "threads_per_rank": args.threads,
            "num_warmup_batches": args.num_warmup_batches,
            "num_batches_per_iter": args.num_batches_per_iter,
            "num_iters": args.num_iters,
            "iter_img_per_sec": img_secs,
            "per_rank_mean": img_sec_mean,
            "per_rank_ci95": img_sec_conf,
            "total_mean": hvd.size() * img_sec_mean,
            "total_ci95": hvd.size() * img_sec_conf,
            # the common result fields of the plain scripts (run.py reads them all alike)
            "samples_per_sec": hvd.size() * img_sec_mean,
            "samples_per_sec_ci95": hvd.size() * img_sec_conf,
            "intervals": len(img_secs),
            "first_step_s": first_s,
            "warmup_s": warmup_s,
            "horovod_env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
        }
        sys.stdout.write("\n" + json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""What one allreduce costs by message size, on this rank: the curve behind Horovod's tensor
fusion.

Small messages are latency-bound (the time hardly depends on the size), large ones
bandwidth-bound (the time grows with it), which is why Horovod packs many small gradients into
one buffer (``HOROVOD_FUSION_THRESHOLD``, 64 MB by default; ``EngineSettings.fusion_mb``) before
reducing them. Bandwidths as nccl-tests defines them (NVIDIA nccl-tests, doc/PERFORMANCE.md):
``algbw = bytes / time``, and for an allreduce ``busbw = algbw × 2 (n − 1) / n`` — the rate each
link carries in a ring algorithm, comparable across rank counts.
"""

from __future__ import annotations

import time

import numpy as np


def allreduce_times(sizes_bytes: list[int], repeats: int = 10, warmup: int = 2) -> list[dict]:
    """On an engine (every rank calls it with the same sizes): the median seconds of ``repeats``
    float32 allreduces (Horovod, eager) of each size after ``warmup`` unmeasured ones."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    n = hvd.size()
    rows = []
    for size in sizes_bytes:
        x = tf.ones([max(int(size) // 4, 1)], tf.float32)
        took = []
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            out = hvd.allreduce(x, op=hvd.Sum, name=f"hpclab_sweep_{size}")
            out.numpy()  # wait for the result
            if i >= warmup:
                took.append(time.perf_counter() - t0)
        seconds = float(np.median(took))
        algbw = int(size) / seconds / 1e9
        rows.append(
            {
                "rank": hvd.rank(),
                "ranks": n,
                "bytes": int(size),
                "ms": 1000 * seconds,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2 * (n - 1) / n,
            }
        )
    return rows

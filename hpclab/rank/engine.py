"""The entry points the client calls on every MPI rank: set-up, versions, health check, train.

Nothing here is called on the client's own process. `hpclab.cluster.lab.Lab` calls :func:`init_worker`
once per engine process, then :func:`train` once per run, with plain dicts only; the run itself
is :class:`hpclab.rank.trainer.Trainer`. Lines that exist only for distribution say so
(`# Horovod: ...`), the way Horovod's own examples do.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from hpclab.rank.features import groups

_STATE: dict = {}  # per engine process: what init_worker set up (threads can be set only once)


def init_worker(threads: int = 1, probe: tuple[str, str] | None = None) -> dict:
    """Once per engine: CPU threads, GPU pinning, `hvd.init()`. Returns this rank's identity.

    `probe` is (path, nonce): the client wrote `nonce` into `path` in the runs folder; whether
    this rank reads it back is reported as `runs_dir_shared` (hpclab.cluster.world checks it)."""
    shared = _reads(probe) if probe else True
    if _STATE.get("initialised"):
        return dict(_STATE["identity"], runs_dir_shared=shared)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    t0 = time.perf_counter()
    import horovod.tensorflow as hvd
    import tensorflow as tf

    t1 = time.perf_counter()

    # Thread pools can only be sized before TensorFlow's runtime starts, hence here and once.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    # Horovod: initialise (MPI controller under mpiexec); HOROVOD_CYCLE_TIME and
    # HOROVOD_FUSION_THRESHOLD come from the engine environment the Lab set, and so do the
    # synchronous groups of hybrid runs, registered now as process sets (hpclab.rank.features.groups).
    from mpi4py import MPI

    hvd.init(process_sets=groups.at_init(hvd, MPI.COMM_WORLD.Get_size()))
    t2 = time.perf_counter()
    # Horovod: pin one GPU per process (hpclab.core.devices says which for each Slurm binding);
    # its index, UUID and name go into lab.ranks, and the client refuses a rank without one
    # when GPUs were asked for, or two ranks on one GPU under NCCL.
    from hpclab.rank.gpu import pin_gpu

    gpu = pin_gpu(tf, hvd)
    identity = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "pid": os.getpid(),
        "host": platform.node(),
        "threads": threads,
        **gpu,  # gpus (seen), gpu (index, uuid, name; {} on CPU), gpu_binding, gpu_memory, tf_cuda, horovod_nccl
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0,
        # where Slurm put this rank (absent outside Slurm); recorded in lab.ranks and config.json
        "node": os.environ.get("SLURMD_NODENAME", ""),
        "slurm_job": os.environ.get("SLURM_JOB_ID", ""),
        "slurm_step": os.environ.get("SLURM_STEP_ID", ""),
        "visible_gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        # which MPI library and thread level this rank got (hpclab.cluster.world checks both:
        # the srun plugin follows the library, Horovod needs MPI_THREAD_MULTIPLE)
        "mpi_library": " ".join(MPI.Get_library_version().splitlines()[0].split())[:160],
        "mpi_thread": thread_level(MPI),
        **memory(),
    }
    _STATE.update(initialised=True, identity=identity)
    return dict(identity, runs_dir_shared=shared, tf_import_s=t1 - t0, horovod_init_s=t2 - t1)


def thread_level(MPI) -> str:
    """MPI_Query_thread's answer by name (MPI standard 4.1, section 11.2.1): the thread support
    the MPI library gave this process when mpi4py initialised it."""
    names = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    return names.get(MPI.Query_thread(), "unknown")


def memory() -> dict:
    """This engine's resident memory now and at its peak, in MiB, from the process itself
    (``/proc/self/statm`` and ``getrusage``; ``ru_maxrss`` is in KiB on Linux). Recorded in
    ``lab.ranks``: what a node must hold per engine (a hub's ``req_memory``)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        now = pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):  # not Linux: the peak is the figure there is
        now = peak
    # ru_maxrss lags the pages just touched: the peak is at least what is resident now
    return {"rss_mib": round(now, 1), "peak_rss_mib": round(max(peak, now), 1)}


def _reads(probe: tuple[str, str]) -> bool:
    path, nonce = probe
    try:
        return Path(path).read_text() == nonce
    except OSError:
        return False


def versions() -> dict:
    import horovod
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    from hpclab.rank.keras2 import KERAS_VERSION

    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": KERAS_VERSION,  # the Keras tf.keras is (tf_keras on the py312 stack)
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


def train(
    cfg_dict: dict,
    plan_dict: dict,
    run_dir: str,
    data_dir: str,
    checkpoint: str | None = None,
    start_step: int | None = None,
) -> dict:
    """Train one run on this rank and return this rank's summary (rank 0's also has the rows).
    ``checkpoint``: a checkpoint's path (hpclab.rank.checkpoint) the run resumes from;
    ``start_step``: the step it starts at when that is not the checkpoint's (a resume on another
    number of workers, hpclab.cluster.resume)."""
    from ipyparallel.datapub import publish_data

    from hpclab.rank.heartbeat import Heartbeat
    from hpclab.rank.trainer import Trainer

    _STATE.pop("last_trainer", None)  # free the previous run's model, graphs and pipeline now
    with Heartbeat(publish_data):  # the client's watchdog names a rank that stops beating
        trainer = Trainer(
            cfg_dict, plan_dict, Path(run_dir), Path(data_dir), checkpoint, start_step
        )
        summary = trainer.run()
    summary["versions"] = versions()
    # Tearing down TF graphs can take seconds on a busy machine; keep
    # the trainer alive until the next run so this rank's reply goes out at once.
    _STATE["last_trainer"] = trainer
    return summary


def last_weights(central: bool = False) -> list:
    """This rank's weights as the last run left them (NumPy arrays; [] before any run): to
    compare replicas, or two runs' models, to a tolerance (a digest only says equal or not).
    ``central``: Crossbow's central average model instead ([] for other runs)."""
    trainer = _STATE.get("last_trainer")
    if trainer is None:
        return []
    if central:
        return trainer.central_weights()
    return trainer.model.get_weights()

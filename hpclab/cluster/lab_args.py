"""The arguments of :class:`hpclab.cluster.lab.Lab`, checked before any engine starts."""

from __future__ import annotations

import os

from hpclab.cluster.launch import cpus_in_allocation
from hpclab.core.catalog import MAX_THREADS_PER_WORKER, MAX_WORKERS
from hpclab.core.engine_settings import EngineSettings
from hpclab.core.errors import ConfigError

# launcher= overrides the profile's launch mode (hpclab.cluster.profiles.MODES)
LAUNCHERS = {mode: mode for mode in ("auto", "mpiexec", "srun", "sbatch")}
#: Threads per worker on a GPU rank when none were asked for: the thread TensorFlow launches GPU
#: kernels from must not share one core with Horovod's background thread, which polls for
#: tensors to reduce every cycle_time_ms (docs/cluster.md, "GPU nodes").
GPU_THREADS = 2


def _is_count(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_args(
    workers, launcher, threads_per_worker, start_timeout, nodes, mpiexec, groups=1
) -> None:
    """Every argument of ``Lab(...)``: a ConfigError naming the first bad one, before any
    engine starts."""
    if not _is_count(workers, 1, MAX_WORKERS):
        raise ConfigError(
            f"Lab.workers must be an integer from 1 to {MAX_WORKERS}; "
            f"you passed workers={workers!r}."
        )
    if launcher is not None and launcher not in LAUNCHERS:
        raise ConfigError(
            "Lab.launcher must be one of 'auto', 'mpiexec' (this machine), 'srun' (inside a "
            "Slurm allocation) or 'sbatch' (engines as a Slurm job), or None to follow the "
            f"profile; you passed launcher={launcher!r}."
        )
    if threads_per_worker is not None and not _is_count(
        threads_per_worker, 1, MAX_THREADS_PER_WORKER
    ):
        raise ConfigError(
            "Lab.threads_per_worker must be an integer from 1 to "
            f"{MAX_THREADS_PER_WORKER}, or None (1, or {GPU_THREADS} on GPU ranks); "
            f"you passed threads_per_worker={threads_per_worker!r}."
        )
    if not _is_count(nodes, 0, MAX_WORKERS):
        raise ConfigError(
            f"Lab.nodes must be an integer from 0 (the launcher decides) to {MAX_WORKERS}; "
            f"you passed nodes={nodes!r}."
        )
    if start_timeout is not None and (
        isinstance(start_timeout, bool)
        or not isinstance(start_timeout, (int, float))
        or not 1 <= start_timeout <= 3600
    ):
        raise ConfigError(
            "Lab.start_timeout must be a number of seconds from 1 to 3600 (or None: the "
            f"profile's); you passed start_timeout={start_timeout!r}."
        )
    if mpiexec and os.path.basename(str(mpiexec)) == "srun":
        raise ConfigError(
            "Lab(mpiexec='srun') would start engines without an MPI plugin (each its own "
            "1-rank world under Slurm's default MpiDefault=none); use launcher='srun' or a "
            "profile, which pass --mpi=, -c and --overlap as needed."
        )
    check_groups(workers, groups)


def threads_for(
    asked: int | None, profile_threads: int, gpus: int, workers: int, cpus: int | None
) -> tuple[int, str]:
    """(threads per worker, why): the profile's ``node.threads_per_worker`` when it sets one (it
    wins, as in `hpclab.cluster.launch.plan_launch`); else what ``Lab(threads_per_worker=...)``
    asked; else :data:`GPU_THREADS` when the ranks use GPUs (`gpus` > 0: ``Lab(gpus=...)`` or
    the profile's ``node.gpus``), lowered to what `cpus` (the CPUs the `workers` may use
    together; None: unknown) allow; else 1."""
    if profile_threads:
        return profile_threads, "the profile's node.threads_per_worker"
    if asked is not None:
        return asked, "threads_per_worker as passed"
    if gpus <= 0:
        return 1, "the default on CPU ranks"
    threads = GPU_THREADS
    if cpus is not None and workers * threads > cpus:
        threads = max(1, cpus // workers)
        return threads, f"GPU ranks get {GPU_THREADS}, but {workers} workers share {cpus} CPUs"
    return threads, f"the default on GPU ranks ({GPU_THREADS}: TensorFlow's and Horovod's threads)"


def cpus_for(mode: str, env: dict[str, str], cpu_count: int | None) -> int | None:
    """The CPUs a lab's workers may use together: under ``srun`` the allocation's
    (``SLURM_JOB_CPUS_PER_NODE``), under ``mpiexec`` this machine's `cpu_count`, under
    ``sbatch`` unknown (the engines' job asks for its own)."""
    if mode == "srun":
        return cpus_in_allocation(env)
    return cpu_count if mode == "mpiexec" else None


def check_groups(workers: int, groups) -> None:
    """The lab's synchronous groups divide its workers (hpclab.rank.features.groups)."""
    if not _is_count(groups, 1, MAX_WORKERS) or workers % groups:
        raise ConfigError(
            f"Lab.groups must be a divisor of workers ({workers}): the synchronous groups of "
            f"hybrid runs, registered at start; you passed groups={groups!r}."
        )


def settings_of(engine_settings, groups: int) -> EngineSettings:
    """The lab's settings from ``Lab(engine_settings=..., groups=...)`` (``groups`` checked by
    :func:`check_args`): ``groups=G`` is a shortcut for ``EngineSettings(groups=G)``, and two
    different groups are refused, not chosen between."""
    if engine_settings is None:
        return EngineSettings(groups=groups)
    if not isinstance(engine_settings, EngineSettings):
        raise ConfigError(
            "Lab.engine_settings must be an EngineSettings (hpclab.core.engine_settings) or "
            f"None; you passed {type(engine_settings).__name__}."
        )
    if groups not in (1, engine_settings.groups):
        raise ConfigError(
            f"Lab.groups must be 1 or engine_settings.groups ({engine_settings.groups}): give "
            f"the groups once; you passed groups={groups!r}."
        )
    return engine_settings


__all__ = [
    "GPU_THREADS",
    "LAUNCHERS",
    "check_args",
    "check_groups",
    "cpus_for",
    "settings_of",
    "threads_for",
]

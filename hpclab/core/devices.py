"""Which GPU each rank uses, and the checks that no rank trains on the wrong device in silence.

Pure functions (no TensorFlow): `hpclab.rank.engine.init_worker` asks :func:`pick_gpu` which of
the GPUs TensorFlow lists this rank pins, and :func:`gpu_identity` what that GPU is; the client
checks every rank's answer with :func:`check_gpus` before the lab is ready.

How Slurm hands out GPUs decides what a rank sees (Slurm ``srun``/``sbatch`` manuals:
``--gpus-per-task``, ``--gpus-per-node``, ``--gpu-bind``; ``SLURM_LOCALID``):

- ``--gpus-per-node=G --gpu-bind=none`` (profile ``gpu_binding = "local_rank"``): every rank of
  a node sees all G GPUs and takes the one at its local rank (Horovod's examples:
  ``gpus[hvd.local_rank()]``).
- ``--gpus-per-task=1`` (``"per_task"``) or ``--gpu-bind=single:1``/``map_gpu``: Slurm sets
  ``CUDA_VISIBLE_DEVICES`` per task, so each rank sees one GPU and takes index 0.
- Fewer visible GPUs than ranks on a node: ``local_rank % n`` would put two ranks on one GPU.
  With an NCCL build that fails inside NCCL ("Duplicate GPU detected", Horovod issues #3929 and
  #3949), so it is refused here before any run; with MPI/Gloo GPU operations it is a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpclab.core.errors import ConfigError


@dataclass(frozen=True)
class GpuChoice:
    """The GPU a rank pins: ``index`` into the GPUs TensorFlow lists (None: none), and why."""

    index: int | None
    how: str  # "none", "local_rank", "per_task", "shared"


def visible_devices(environ: Mapping[str, str]) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as a list of ids (indices, ``GPU-...`` UUIDs or ``MIG-...``);
    None when it is unset (all GPUs visible), [] when it is set empty or to ``-1`` (none)."""
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    ids = [part.strip() for part in raw.split(",") if part.strip()]
    # CUDA stops at the first invalid entry; "-1" is the documented way to hide every GPU
    out = []
    for part in ids:
        if part.startswith("-"):
            break
        out.append(part)
    return out


def local_rank_of(horovod_local_rank: int, environ: Mapping[str, str]) -> int:
    """This rank's index on its node: Slurm's ``SLURM_LOCALID`` when srun set it (it is what
    Slurm bound GPUs by), else Horovod's local rank (mpiexec)."""
    value = environ.get("SLURM_LOCALID", "")
    return int(value) if value.isdigit() else horovod_local_rank


def pick_gpu(
    local_rank: int, local_size: int, n_visible: int, environ: Mapping[str, str]
) -> GpuChoice:
    """Which of the `n_visible` GPUs (as TensorFlow lists them) the rank at `local_rank` of
    `local_size` ranks on its node pins; see the module docstring for the binding modes."""
    if n_visible <= 0:
        return GpuChoice(None, "none")
    bound = environ.get("SLURM_GPUS_PER_TASK") or "single" in environ.get("SLURM_GPU_BIND", "")
    if n_visible == 1 and (bound or local_size == 1):
        return GpuChoice(0, "per_task")  # Slurm gave this task its own GPU (or one rank here)
    if n_visible >= local_size:
        return GpuChoice(local_rank, "local_rank")
    return GpuChoice(local_rank % n_visible, "shared")


def gpu_identity(
    choice: GpuChoice,
    environ: Mapping[str, str],
    smi_rows: Sequence[Mapping[str, str]],
    tf_name: str = "",
) -> dict:
    """{"index", "uuid", "name"} of the chosen GPU ({} on CPU). `smi_rows` are
    ``nvidia-smi --query-gpu=index,uuid,name`` rows (may be empty); `tf_name` is the name
    TensorFlow reports, used when nvidia-smi is missing. The index is the node's (physical) one:
    TensorFlow's index counts only the ``CUDA_VISIBLE_DEVICES`` it was given."""
    if choice.index is None:
        return {}
    visible = visible_devices(environ)
    physical = (
        visible[choice.index] if visible and choice.index < len(visible) else str(choice.index)
    )
    row = next(
        (r for r in smi_rows if physical in (r.get("index"), r.get("uuid"))),
        None,
    )
    if row is None:
        return {
            "index": physical,
            "uuid": physical if physical.startswith(("GPU-", "MIG-")) else "",
            "name": tf_name,
        }
    return {
        "index": row.get("index", physical),
        "uuid": row.get("uuid", ""),
        "name": row.get("name") or tf_name,
    }


def parse_smi(text: str) -> list[dict]:
    """Rows of ``nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader``."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) == 3 and parts[0].isdigit():
            rows.append({"index": parts[0], "uuid": parts[1], "name": parts[2]})
    return rows


#: The engines' variable that caps the GPU memory TensorFlow may take on each rank (MiB).
GPU_MEMORY_VAR = "HPCLAB_GPU_MEMORY_MIB"


def gpu_memory_limit(environ: Mapping[str, str]) -> int | None:
    """The rank's GPU memory cap in MiB from ``HPCLAB_GPU_MEMORY_MIB`` (None: unset, memory growth).

    TensorFlow's allocator reserves nearly all of a GPU's memory at the first op unless memory
    growth is on (``tf.config.experimental.set_memory_growth``; ``TF_FORCE_GPU_ALLOW_GROWTH=true``
    does the same) or a logical device has a ``memory_limit``
    (``tf.config.set_logical_device_configuration``); the two cannot both be set on one GPU.
    hpclab turns growth on, or sets this cap where the profile's ``environment.vars`` gives one:
    two ranks sharing a GPU, or a bound the job's GPU memory must keep."""
    raw = environ.get(GPU_MEMORY_VAR, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 256:
        raise ConfigError(
            f"{GPU_MEMORY_VAR}={raw!r} must be a whole number of MiB, at least 256 (e.g. 20000 for "
            "20000 MiB of GPU memory per rank), or unset for TensorFlow's memory growth."
        )
    return int(raw)


#: The run knob ``time_sync``: which clock the time split reads (see :func:`split_method`).
TIME_SYNCS = ("auto", "device", "host")
#: What each method means, for the dashboard's label and the docs.
SPLIT_METHODS = {
    "host_clock": "host clock (on a CPU an op has finished when it returns)",
    "device_sync": "device-synced clock (each split point waits for the GPU's queued work)",
    "off": "not timed",
}


def split_method(time_sync: str, has_gpu: bool, on: bool = True) -> str:
    """The time split's method on a rank: ``device_sync``, ``host_clock`` or ``off``.

    ``tf.timestamp`` is a host op: on a GPU it runs once the ops it depends on were *queued*
    (TensorFlow's GPU kernels return at enqueue; Horovod's allreduce op completes only after
    its input is ready on the device), so with the host clock a GPU's compute would read as
    dispatch time and be booked to the allreduce wait. ``auto`` therefore syncs with the
    device at each split point where the rank has a GPU (a one-element copy to the host of
    what the point waits for) and reads the plain host clock on CPU, where the two agree;
    ``device`` forces the sync (to measure its cost), ``host`` never syncs."""
    if not on:
        return "off"
    if time_sync not in TIME_SYNCS:
        raise ConfigError(f"time_sync must be one of {', '.join(TIME_SYNCS)}; it is {time_sync!r}.")
    sync = time_sync == "device" or (time_sync == "auto" and has_gpu)
    return "device_sync" if sync else "host_clock"


def check_gpus_arg(gpus) -> int:
    """`Lab(gpus=...)` checked: an integer from 0 to 64 (GPUs per node the ranks expect)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= 64:
        raise ConfigError(
            f"Lab.gpus must be an integer from 0 (CPU) to 64, or None for the profile's node.gpus; "
            f"you passed gpus={gpus!r}."
        )
    return gpus


def check_gpus(identities: Sequence[Mapping], expected: bool) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the ranks' GPUs, from what each rank reported at start.

    `expected`: the lab was asked for GPUs (``Lab(gpus=...)`` or the profile's ``node.gpus``);
    then a rank that sees none is an error naming it and what it sees. Two ranks on one GPU
    (same host and GPU) are an error under an NCCL build of Horovod and a warning otherwise."""
    errors: list[str] = []
    warnings: list[str] = []
    if expected:
        for ident in identities:
            if ident.get("gpu"):
                continue
            sees = ident.get("gpus", 0)
            errors.append(
                f"rank {ident['rank']} on {ident.get('node') or ident.get('host', '?')} was to use a GPU "
                f"but sees {sees} (TensorFlow built with CUDA: {ident.get('tf_cuda', False)}, "
                f"CUDA_VISIBLE_DEVICES={ident.get('visible_gpus', '')!r}); install the GPU stack "
                "(`make gpu-build`) and request GPUs for the ranks (the profile's node.gpus), or "
                "pass Lab(gpus=0) to train on CPU."
            )
    by_gpu: dict[tuple, list[int]] = {}
    for ident in identities:
        gpu = ident.get("gpu") or {}
        if gpu:
            key = (ident.get("host", ""), gpu.get("uuid") or gpu.get("index"))
            by_gpu.setdefault(key, []).append(ident["rank"])
    for (host, gpu_id), ranks in sorted(by_gpu.items()):
        if len(ranks) < 2:
            continue
        nccl = any(ident.get("horovod_nccl", False) for ident in identities)
        text = f"ranks {sorted(ranks)} on {host} share GPU {gpu_id}"
        if nccl:
            errors.append(
                f'{text}, which NCCL refuses ("Duplicate GPU detected"); give each rank its own GPU '
                '(node.gpus >= ranks per node, or node.gpu_binding = "per_task") or start fewer ranks per node.'
            )
        else:
            warnings.append(
                f"{text}; they will take turns on it (one GPU per rank is the usual layout)."
            )
    return errors, warnings


__all__ = [
    "SPLIT_METHODS",
    "TIME_SYNCS",
    "GpuChoice",
    "check_gpus",
    "check_gpus_arg",
    "gpu_identity",
    "gpu_memory_limit",
    "local_rank_of",
    "parse_smi",
    "pick_gpu",
    "split_method",
    "visible_devices",
]

"""Which GPU variables a kernel inherited from its own Slurm job must not reach the engines'
launch, so that the engines' step gets exactly the GPUs the profile asks for. Pure: the caller
passes the environment, nothing is read or changed here.

A kernel started by JupyterHub's batchspawner runs in a Slurm job step; when that job asked for
GPUs, the kernel's environment holds what Slurm set for it (``SLURM_GPUS_PER_NODE``,
``SLURM_GPUS_PER_TASK``, ``SLURM_TRES_PER_TASK``, ``SLURM_GPU_BIND``, ``CUDA_VISIBLE_DEVICES``,
...). ipyparallel starts ``srun``/``sbatch`` with that environment, and two kinds of variables
behave differently there (Slurm 22.05 srun(1), INPUT and OUTPUT ENVIRONMENT VARIABLES; the
``env_vars`` table of srun's ``opt.c``):

- **Requests** (:data:`GPU_REQUESTS`): sbatch sets them in the job for its own GPU options
  (sbatch(1) OUTPUT ENVIRONMENT VARIABLES), and srun reads the very same names as if they were
  options ("Same as --gpus-per-task"). The command line overrides only the *same* option, so a hub job's
  ``SLURM_GPUS_PER_TASK=1`` is added to a profile's ``--gpus-per-node=4 --gpu-bind=none``
  (another binding than the profile's), and ``SLURM_TRES_PER_TASK``/``SLURM_NTASKS_PER_GPU``
  make srun stop ("SLURM_TRES_PER_TASK is mutually exclusive with --ntasks-per-gpu",
  snakemake-executor-plugin-slurm issue 373; "cpus_per_task set by two different environment
  variables", FairRootGroup/DDS issue 490). They are dropped in every mode: the profile's own
  options (``--gpus-per-node``/``--gpus-per-task``, ``-c``) say what the step asks, and a step
  that asks for no GPU gets the job's (srun(1) ``--gres``: "by default, a job step is allocated
  all of the generic resources that have been requested by the job"). ``SLURM_GRES`` and
  ``SLURM_STEP_GRES`` are dropped only when they name a GPU (other GRES stay the job's). They
  are also what `hpclab.core.devices.pick_gpu` reads as the binding, which must be the
  engines' own.
- **Devices** (:data:`DEVICE_VARS`): what Slurm set for the kernel's own step
  (``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS``, ``GPU_DEVICE_ORDINAL``, ...); srun never reads
  them. Under ``srun`` (the same allocation) they are kept: slurmd sets them again for each task
  of a step that has GPUs, and for a step without a GPU request they still name the job's GPUs.
  Under ``mpiexec`` the engines run beside the kernel and these are the GPUs they may use. Under
  ``sbatch`` the engines are another job, often on other nodes, where the kernel's device list
  means nothing: dropped.

``SLURM_GPU_FREQ`` (a clock setting, not a request) is kept.
"""

from __future__ import annotations

from collections.abc import Mapping

#: srun input variables that ask for GPUs or bind them (srun(1) 22.05 INPUT ENVIRONMENT
#: VARIABLES; ``SLURM_TRES_PER_TASK`` and ``SLURM_TRES_BIND`` from Slurm 23.11 on).
GPU_REQUESTS = (
    "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE",
    "SLURM_GPUS_PER_SOCKET",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GPU_BIND",
    "SLURM_CPUS_PER_GPU",
    "SLURM_MEM_PER_GPU",
    "SLURM_NTASKS_PER_GPU",
    "SLURM_GRES_FLAGS",
    "SLURM_TRES_PER_TASK",  # "cpu=N,gres/gpu=M": -c is always on the engines' command line
    "SLURM_TRES_BIND",
)
#: srun input variables for any generic resource: dropped when their value names a GPU.
GRES_REQUESTS = ("SLURM_GRES", "SLURM_STEP_GRES")
#: What Slurm sets for a job's or step's devices (srun(1) OUTPUT ENVIRONMENT VARIABLES and the
#: gres/gpu plugin); srun does not read them.
DEVICE_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "SLURM_GPUS_ON_NODE",
)


def inherited_gpu_vars(
    env: Mapping[str, str], mode: str, keep: Mapping[str, str] = None
) -> tuple[str, ...]:
    """Names of the variables in `env` to remove from the environment of the command that
    starts the engines (``mode``: ``srun``, ``sbatch`` or ``mpiexec``), in a stable order.

    `keep`: variables the plan sets for the engines itself (its ``engine_env``): never removed,
    since they are the profile's own values."""
    keep = keep or {}
    names = [name for name in GPU_REQUESTS if name in env]
    names += [name for name in GRES_REQUESTS if "gpu" in env.get(name, "").lower()]
    if mode == "sbatch":
        names += [name for name in DEVICE_VARS if name in env]
    return tuple(name for name in names if name not in keep)


def dropped_note(env: Mapping[str, str], names: tuple[str, ...]) -> str:
    """One line naming what was dropped and why ("" when nothing was)."""
    if not names:
        return ""
    shown = ", ".join(f"{name}={env.get(name, '')}" for name in names)
    return (
        f"engines' launch without the kernel's inherited {shown}: srun reads such variables as "
        "options, and the engines' step asks for what the profile says (its -c and GPU options)"
    )


def unset_prefix(names: tuple[str, ...]) -> list[str]:
    """``env -u NAME ...`` (coreutils env(1)) to put before a command so it starts without
    `names`; [] when there is nothing to remove. ipyparallel launches with a copy of the
    kernel's environment plus additions, so removal has to happen in the command itself."""
    if not names:
        return []
    out = ["env"]
    for name in names:
        out += ["-u", name]
    return out


__all__ = [
    "DEVICE_VARS",
    "GPU_REQUESTS",
    "GRES_REQUESTS",
    "dropped_note",
    "inherited_gpu_vars",
    "unset_prefix",
]

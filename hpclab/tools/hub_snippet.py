"""``hpclab profiles NAME --hub-snippet``: one JupyterHub choice for a profile, sized from measurements.

The snippet adds one entry to wrapspawner's ``ProfilesSpawner.profiles`` (display name, key,
``batchspawner.SlurmSpawner``, its settings; wrapspawner 1.0, ``ProfilesSpawner.profiles``) with
``.append``, so a hub's own spawner class and its other choices stay as they are; traitlets turns
the append into a lazy value merged with whatever the hub set before or after. The job asks for:

- CPUs (``req_nprocs``, SlurmSpawner's ``--cpus-per-task``): workers x threads for the engines
  plus one for JupyterLab, the kernel and the ipyparallel controller; threads per worker by the
  Lab's own rule (:func:`job_threads`: the profile's, else the one asked, else 2 on GPU nodes,
  else 1);
- memory (``req_memory``, ``--mem``): per engine, the largest ``peak_rss_mib`` that engines of the
  newest run in the runs folder reported (``lab.ranks``, measured by each engine process at
  start, hpclab/rank/engine.py:memory) times ENGINE_GROWTH, else DEFAULT_ENGINE_MIB; plus
  CONTROLLER_MIB and JUPYTER_MIB.
- on a GPU profile (``node.gpus > 0``) only runs whose ranks had a GPU count: a GPU engine
  holds TensorFlow's CUDA libraries (cuDNN, cuBLAS, ...) and the CUDA context in host memory,
  which a CPU run's figure does not show; without such a run, DEFAULT_GPU_ENGINE_MIB, an
  estimate (unverified: no GPU run on this project's machines; ``scripts/gpu-check.sh`` records
  the real figure in ``lab.ranks``). TensorFlow also keeps a pool of pinned (page-locked) host
  memory for copies to and from the GPU, grown on demand up to ``TF_GPU_HOST_MEM_LIMIT_IN_MB``
  (TensorFlow's ``gpu_process_state.cc``: 65536 MiB by default); a profile that sets it in
  ``environment.vars`` bounds it, and that bound is added to each engine. GPU memory is not host
  memory: hpclab turns TensorFlow's memory growth on (it would otherwise reserve nearly the
  whole GPU at the first op), and ``HPCLAB_GPU_MEMORY_MIB`` caps it (hpclab/rank/gpu.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from hpclab.cluster.lab_args import threads_for
from hpclab.cluster.profiles import Profile

#: The JupyterLab step of a batchspawner job: one task, and --overlap so the engines' srun step
#: can use the job's CPUs (batchspawner starts the single-user server as `{req_srun} {cmd}`).
HUB_SRUN = "srun --ntasks=1 --nodes=1 --overlap"
#: An engine's memory grows after its start (TensorFlow's graphs, the data): 492 MiB at start and
#: 604 MiB after a 2-worker MNIST-1D run (issue 26; benchmarks/README.md: 486-492 MiB at start).
ENGINE_GROWTH = 1.5
DEFAULT_ENGINE_MIB = 492  # an engine at start, TensorFlow 2.15 + Horovod 0.28 (when no run says)
#: A GPU engine at start when no GPU run says: the CPU figure plus TensorFlow's CUDA libraries
#: and context in host memory. An estimate, not measured here (no GPU); a GPU run's figure wins.
DEFAULT_GPU_ENGINE_MIB = 3072
#: TensorFlow's bound on its pinned host memory pool (MiB), and its default when unset.
HOST_LIMIT_VAR = "TF_GPU_HOST_MEM_LIMIT_IN_MB"
TF_HOST_LIMIT_DEFAULT_MIB = 65536
#: Measured with a 1-worker lab: the controller's process tree (controller, schedulers, heart
#: monitor: 9 processes) held 398 MiB; an idle JupyterLab server 87 MiB and a kernel with the
#: lab's client about 90 MiB, more with charts.
CONTROLLER_MIB = 400
JUPYTER_MIB = 300
SPARE_CPUS = 1  # JupyterLab, the kernel and the controller (the engines get workers x threads)
NEWEST_RUNS = 200  # run folders read at most, newest first


def job_threads(
    profile: Profile, workers: int, threads: int | None, cpus: int | None = None
) -> int:
    """Threads per worker a Lab of `workers` under `profile` would use (hpclab.cluster.lab_args
    .threads_for: the profile's node.threads_per_worker, else `threads`, else 2 when the profile
    asks for GPUs, lowered to what `cpus` allow, else 1). `cpus` None: the job asks for its own."""
    return threads_for(threads, profile.node.threads_per_worker, profile.node.gpus, workers, cpus)[
        0
    ]


def engine_memory(runs_dir: Path | None, gpu: bool = False) -> tuple[float, str]:
    """(MiB per engine at start, where the figure comes from): the largest `peak_rss_mib` in
    `lab.ranks` of the newest run under `runs_dir` that has one (with `gpu`, of ranks that had
    a GPU), else DEFAULT_ENGINE_MIB (DEFAULT_GPU_ENGINE_MIB)."""
    configs = []
    if runs_dir is not None and runs_dir.is_dir():
        for path in runs_dir.glob("*/config.json"):
            try:
                configs.append((path.stat().st_mtime, path))
            except OSError:
                continue
    for _, path in sorted(configs, reverse=True)[:NEWEST_RUNS]:
        try:
            ranks = json.loads(path.read_text()).get("lab", {}).get("ranks", [])
        except (OSError, ValueError, AttributeError):
            continue
        peaks = [
            r["peak_rss_mib"]
            for r in ranks
            if isinstance(r, dict) and "peak_rss_mib" in r and (r.get("gpu") or not gpu)
        ]
        if peaks:
            return max(peaks), f"the {max(peaks):.0f} MiB peak of run {path.parent.name}"
    if gpu:
        return DEFAULT_GPU_ENGINE_MIB, (
            f"no GPU run in {runs_dir} recorded it, so {DEFAULT_GPU_ENGINE_MIB} MiB, an estimate "
            "for TensorFlow's CUDA libraries not yet measured on a GPU"
        )
    return DEFAULT_ENGINE_MIB, f"no run in {runs_dir} recorded it, so {DEFAULT_ENGINE_MIB} MiB"


def pinned_host_mib(profile: Profile) -> int:
    """The pinned host memory each GPU engine may add: the profile's TF_GPU_HOST_MEM_LIMIT_IN_MB
    (0 when it sets none: TensorFlow's own 64 GiB bound is then not counted, and said)."""
    raw = str(profile.environment.vars.get(HOST_LIMIT_VAR, "")).strip()
    return int(raw) if raw.isdigit() and profile.node.gpus else 0


def job_memory_mib(workers: int, engine_mib: float, pinned_mib: int = 0) -> int:
    """`--mem` in MiB for `workers` engines of `engine_mib` at start (each with up to
    `pinned_mib` of TensorFlow's pinned host memory), plus the rest of the job, rounded up to
    256 MiB."""
    total = workers * (engine_mib * ENGINE_GROWTH + pinned_mib) + CONTROLLER_MIB + JUPYTER_MIB
    return int(math.ceil(total / 256) * 256)


def hub_snippet(
    profile: Profile,
    workers: int,
    threads: int | None,
    selector: str,
    engine_mib: float = DEFAULT_ENGINE_MIB,
    memory_source: str = "",
) -> str:
    """The `jupyterhub_config.py` lines (see the module docstring) for `workers` engines."""
    t = job_threads(profile, workers, threads)
    s = profile.slurm
    # SlurmSpawner's default batch_script uses neither {account} nor {qos}: pass them as options
    options = [f"--{k}={v}" for k, v in (("account", s.account), ("qos", s.qos)) if v]
    options += list(s.extra_sbatch)
    pinned = pinned_host_mib(profile)
    memory = job_memory_mib(workers, engine_mib, pinned)
    settings = {
        "req_partition": s.partition,
        "req_account": s.account,  # also in req_options: the default script ignores it
        "req_qos": s.qos,
        "req_runtime": s.time,
        "req_nprocs": str(workers * t + SPARE_CPUS),
        "req_memory": f"{memory}M",
    }
    if profile.node.gpus:
        settings["req_ngpus"] = str(profile.node.gpus)  # for custom scripts; the default: req_gres
        settings["req_gres"] = f"gpu:{profile.node.gpus}"
    settings["req_options"] = " ".join(options)
    settings["req_srun"] = HUB_SRUN  # JupyterLab: one task; the engines use srun --overlap
    if profile.environment.setup:
        settings["req_prologue"] = "\n".join(profile.environment.setup)
    settings = {k: v for k, v in settings.items() if v}
    settings["environment"] = {"HPCLAB_PROFILE": selector}
    entry = (
        f"hpclab {profile.name}: {workers} engine(s) x {t} thread(s)",
        f"hpclab-{profile.name}",
        "batchspawner.SlurmSpawner",
        settings,
    )
    body = json.dumps(list(entry), indent=4)
    return "\n".join(
        [
            f"# JupyterHub choice for hpclab profile {profile.name!r}, from `hpclab profiles "
            f"{selector} --hub-snippet` (batchspawner 1.3, wrapspawner 1.0).",
            "# It adds one entry to ProfilesSpawner's list and keeps the hub's spawner class and "
            "other entries; a hub without one sets, once:",
            '#   c.JupyterHub.spawner_class = "wrapspawner.ProfilesSpawner"',
            f"# CPUs: {workers} x {t} for the engines + {SPARE_CPUS} for JupyterLab, the kernel "
            "and the controller.",
            f"# Memory: {workers} engine(s) x {engine_mib:.0f} MiB at start ({memory_source or 'given'}) "
            f"x {ENGINE_GROWTH:g}{f' + {pinned} MiB pinned' if pinned else ''} + "
            f"{CONTROLLER_MIB + JUPYTER_MIB} MiB for the rest = {memory} MiB.",
            *gpu_memory_lines(profile, pinned),
            f"c.ProfilesSpawner.profiles.append(tuple({body}))",
        ]
    )


def gpu_memory_lines(profile: Profile, pinned: int) -> list[str]:
    """The snippet's comment on what TensorFlow reserves on a GPU node ([] on a CPU profile)."""
    if not profile.node.gpus:
        return []
    bound = (
        f"{pinned} MiB per engine, from the profile's {HOST_LIMIT_VAR}"
        if pinned
        else f"up to {TF_HOST_LIMIT_DEFAULT_MIB} MiB per engine, not counted above: set "
        f"{HOST_LIMIT_VAR} in the profile's environment.vars to bound it"
    )
    return [
        f"# GPU engines: TensorFlow's pinned host memory grows on demand, {bound}; GPU memory "
        "grows as needed (HPCLAB_GPU_MEMORY_MIB caps it per rank).",
    ]


__all__ = [
    "hub_snippet",
    "engine_memory",
    "job_memory_mib",
    "job_threads",
    "pinned_host_mib",
    "HUB_SRUN",
]

"""Threads per worker follow the device (hpclab.cluster.lab_args.threads_for): 1 on CPU ranks, 2
on GPU ranks when nothing was asked, as far as the CPUs allow; what was asked, and above all the
profile's node.threads_per_worker, win."""

from __future__ import annotations

import pytest

from hpclab.cluster.lab_args import GPU_THREADS, check_args, cpus_for, threads_for
from hpclab.cluster.launch import plan_launch
from hpclab.cluster.profiles import parse
from hpclab.core.errors import ConfigError

GPU_PROFILE = parse('[launch]\nmode = "srun"\n[node]\ngpus = 4\n', source="gpu.toml", env={})


@pytest.mark.parametrize(
    ("asked", "profile_threads", "gpus", "workers", "cpus", "expected"),
    [
        (None, 0, 0, 2, 8, 1),  # CPU ranks: 1
        (None, 0, 4, 4, 32, GPU_THREADS),  # GPU ranks with CPUs to spare
        (None, 0, 4, 4, None, GPU_THREADS),  # CPUs unknown (sbatch): the job asks for them
        (None, 0, 4, 4, 6, 6 // 4),  # 4 workers on 6 CPUs: what fits
        (None, 0, 4, 4, 2, 1),  # never below 1 (the launch then names the shortfall)
        (3, 0, 4, 2, 2, 3),  # asked: kept (the launch refuses it with the maximum)
        (1, 0, 4, 2, 8, 1),  # asked 1 on a GPU: the user's choice
        (None, 16, 4, 4, None, 16),  # the profile's value wins over the GPU default
        (1, 16, 0, 4, None, 16),  # ... and over what was passed, as plan_launch does
    ],
)
def test_threads_follow_the_device(asked, profile_threads, gpus, workers, cpus, expected):
    threads, why = threads_for(asked, profile_threads, gpus, workers, cpus)
    assert threads == expected and why


def test_the_gpu_default_always_fits_the_allocation():
    for cpus in range(1, 17):
        for workers in range(1, cpus + 1):
            threads, _ = threads_for(None, 0, 4, workers, cpus)
            env = {"SLURM_JOB_ID": "1", "SLURM_JOB_CPUS_PER_NODE": str(cpus)}
            p = plan_launch(GPU_PROFILE, workers, threads, 0, env, cluster_id="c", state_root="/s")
            assert p.threads == threads and f"--cpus-per-task={threads}" in p.launch_args


def test_the_cpus_a_lab_may_use_depend_on_the_launch_mode():
    assert cpus_for("srun", {"SLURM_JOB_CPUS_PER_NODE": "4(x2),2"}, 64) == 10
    assert cpus_for("srun", {}, 64) is None
    assert cpus_for("mpiexec", {"SLURM_JOB_CPUS_PER_NODE": "4"}, 2) == 2
    assert cpus_for("sbatch", {"SLURM_JOB_CPUS_PER_NODE": "4"}, 2) is None


def test_lab_accepts_none_and_names_the_default_when_refusing():
    check_args(2, None, None, None, 0, None)
    with pytest.raises(ConfigError, match=r"threads_per_worker.*or None \(1, or 2 on GPU ranks\)"):
        check_args(2, None, 0, None, 0, None)

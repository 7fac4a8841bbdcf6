"""Inherited Slurm GPU variables (hpclab.cluster.gpu_env) over realistic environments: a
JupyterHub job that asked for GPUs, a plain CPU job, an allocation with --gpus-per-task=1; the
plan drops them from the launch command, and a stand-in srun on PATH shows it starts without
them while the engines' own variables and the devices stay."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpclab.cluster import gpu_env
from hpclab.cluster.launch import plan_launch
from hpclab.cluster.profiles import BUILTIN, parse

# A batchspawner job (NERSC-style: --ntasks=1 -c 32 --gpus-per-task=4 --gpu-bind=closest), the
# kernel inside its JupyterLab step (`srun jupyterhub-singleuser`), Slurm 23.11 names.
HUB_GPU_JOB = {
    "SLURM_JOB_ID": "812",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_JOB_CPUS_PER_NODE": "32",
    "SLURM_CPUS_PER_TASK": "32",
    "SLURM_TRES_PER_TASK": "cpu=32,gres/gpu=4",
    "SLURM_GPUS_PER_TASK": "4",
    "SLURM_GPU_BIND": "closest",
    "SLURM_GPUS_ON_NODE": "4",
    "SLURM_JOB_GPUS": "0,1,2,3",
    "SLURM_STEP_GPUS": "0,1,2,3",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    "GPU_DEVICE_ORDINAL": "0,1,2,3",
    "SLURM_GPU_FREQ": "high",
}
# sbatch -n 2 -c 2 (no GPU)
CPU_JOB = {
    "SLURM_JOB_ID": "813",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_JOB_CPUS_PER_NODE": "4",
    "SLURM_NTASKS": "2",
    "SLURM_CPUS_PER_TASK": "2",
    "SLURM_TRES_PER_TASK": "cpu=2",
}
# salloc -n 2 -c 4 --gpus-per-task=1 (the shell on the login node: no device variables)
PER_TASK_ALLOC = {
    "SLURM_JOB_ID": "814",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_JOB_CPUS_PER_NODE": "8",
    "SLURM_NTASKS": "2",
    "SLURM_CPUS_PER_TASK": "4",
    "SLURM_GPUS_PER_TASK": "1",
    "SLURM_TRES_PER_TASK": "cpu=4,gres/gpu=1",
}


def profile(text: str):
    return parse(text, source="site.toml", env={})


GPU_NODE = profile('[launch]\nmode = "srun"\n[node]\ngpus = 4\n')
GPU_PER_TASK = profile('[launch]\nmode = "srun"\n[node]\ngpus = 2\ngpu_binding = "per_task"\n')


def plan(prof, env, workers=2, threads=1):
    return plan_launch(
        prof, workers, threads, 0, env, cluster_id="c1", state_root="/s", mpiexec="/v/mpiexec"
    )


def test_a_hub_gpu_job_gives_the_engines_step_only_the_profiles_gpu_options():
    p = plan(GPU_NODE, HUB_GPU_JOB)
    assert p.env_unset == (
        "SLURM_GPUS_PER_TASK",
        "SLURM_GPU_BIND",
        "SLURM_TRES_PER_TASK",
    )
    # kept: the devices (slurmd sets them again for the step's tasks), the clock setting
    assert not set(p.env_unset) & {*gpu_env.DEVICE_VARS, "SLURM_GPU_FREQ", "SLURM_CPUS_PER_TASK"}
    assert {"--gpus-per-node=4", "--gpu-bind=none", "--overlap"} <= set(p.launch_args)
    note = next(n for n in p.notes if "inherited" in n)
    assert "SLURM_GPUS_PER_TASK=4" in note and "SLURM_GPU_BIND=closest" in note
    assert p.record()["env_unset"] == list(p.env_unset)
    cfg = p.ipp_config()
    assert cfg.MPILauncher.mpi_cmd == [
        "env",
        "-u",
        "SLURM_GPUS_PER_TASK",
        "-u",
        "SLURM_GPU_BIND",
        "-u",
        "SLURM_TRES_PER_TASK",
        "srun",
    ]
    assert p.launch_cmd == ("srun",)  # what the record and the messages name


def test_a_cpu_profile_in_a_hub_gpu_job_drops_the_requests_too():
    p = plan(BUILTIN["slurm-allocation"], HUB_GPU_JOB)
    assert "SLURM_GPUS_PER_TASK" in p.env_unset and "CUDA_VISIBLE_DEVICES" not in p.env_unset
    assert not any(a.startswith("--gpus") for a in p.launch_args)


def test_a_plain_cpu_job_loses_only_the_per_task_tres_the_engines_c_replaces():
    p = plan(BUILTIN["slurm-allocation"], CPU_JOB, threads=2)
    assert p.env_unset == ("SLURM_TRES_PER_TASK",)
    assert "--cpus-per-task=2" in p.launch_args
    assert plan(BUILTIN["slurm-allocation"], {"SLURM_JOB_ID": "1"}).env_unset == ()
    assert not any("inherited" in n for n in plan(BUILTIN["local"], {}).notes)
    assert plan(BUILTIN["local"], {}).ipp_config().MPILauncher.mpi_cmd == ["/v/mpiexec"]


def test_a_gpus_per_task_allocation_under_both_profile_bindings():
    local = plan(GPU_PER_TASK, PER_TASK_ALLOC)
    assert local.env_unset == ("SLURM_TRES_PER_TASK",)  # per_task: the profile's own value
    assert local.engine_env["SLURM_GPUS_PER_TASK"] == "1"
    assert "--gpus-per-task=1" in local.launch_args
    per_node = plan(GPU_NODE, PER_TASK_ALLOC)
    assert per_node.env_unset == ("SLURM_GPUS_PER_TASK", "SLURM_TRES_PER_TASK")
    assert "SLURM_GPUS_PER_TASK" not in per_node.engine_env


@pytest.mark.parametrize(
    ("mode", "devices_dropped"), [("srun", False), ("mpiexec", False), ("sbatch", True)]
)
def test_device_variables_are_dropped_only_for_another_job(mode, devices_dropped):
    names = gpu_env.inherited_gpu_vars(HUB_GPU_JOB, mode)
    assert ("CUDA_VISIBLE_DEVICES" in names) is devices_dropped
    assert ("SLURM_STEP_GPUS" in names) is devices_dropped
    assert "SLURM_GPUS_PER_TASK" in names and "SLURM_GPU_FREQ" not in names


def test_gres_variables_go_only_when_they_name_a_gpu():
    env = {"SLURM_GRES": "gpu:a100:2,nvme:1", "SLURM_STEP_GRES": "none"}
    assert gpu_env.inherited_gpu_vars(env, "srun") == ("SLURM_GRES",)
    assert gpu_env.inherited_gpu_vars({"SLURM_GRES": "nvme:1"}, "srun") == ()


def test_sbatch_submission_starts_without_the_kernels_devices():
    sb = profile('[launch]\nmode = "sbatch"\n[node]\ngpus = 4\n')
    p = plan(sb, HUB_GPU_JOB)
    assert {"CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_GPUS_PER_TASK"} <= set(p.env_unset)
    submit = p.ipp_config().SlurmEngineSetLauncher.submit_command
    assert submit[0] == "env" and submit[-3:] == ["sbatch", "--parsable", "--export=ALL"]


def test_the_launch_command_really_starts_without_them(tmp_path):
    """A stand-in `srun` on PATH records the environment it was started with, the way
    ipyparallel starts it (a copy of the kernel's environment plus the plan's engine_env)."""
    dump = tmp_path / "env.json"
    fake = tmp_path / "srun"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'env': dict(os.environ), 'argv': sys.argv[1:]}}, open({str(dump)!r}, 'w'))\n"
    )
    fake.chmod(0o755)
    p = plan(GPU_PER_TASK, {**HUB_GPU_JOB, **PER_TASK_ALLOC})
    cfg = p.ipp_config()
    cmd = [*cfg.MPILauncher.mpi_cmd, "-n", "2", *cfg.MPILauncher.mpi_args, "true"]
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    env.update({**HUB_GPU_JOB, **PER_TASK_ALLOC})
    env.update(cfg.EngineLauncher.environment)
    subprocess.run(cmd, env=env, check=True, timeout=30)
    seen = json.loads(dump.read_text())
    assert not set(p.env_unset) & set(seen["env"])
    assert seen["env"]["SLURM_GPUS_PER_TASK"] == "1"  # the profile's, not the hub's 4
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == HUB_GPU_JOB["CUDA_VISIBLE_DEVICES"]
    assert "--gpus-per-task=1" in seen["argv"] and seen["argv"][:2] == ["-n", "2"]

"""Launch planning (hpclab.cluster.launch.plan_launch): every mode and profile field, without Slurm."""

from __future__ import annotations

import shlex

import pytest

from hpclab.cluster.launch import LOCAL_NETWORK, LOOPBACK, plan_launch
from hpclab.cluster.profiles import BUILTIN, parse
from hpclab.core.engine_settings import EngineSettings
from hpclab.core.errors import ConfigError
from hpclab.rank.features.groups import across_nodes, members

ALLOC = {"SLURM_JOB_ID": "42", "SLURM_JOB_CPUS_PER_NODE": "8", "SLURM_JOB_NUM_NODES": "1"}


def plan(profile=BUILTIN["local"], workers=2, threads=1, nodes=0, env=None, **kw):
    kw.setdefault("mpiexec", "/venv/bin/mpiexec")
    return plan_launch(
        profile, workers, threads, nodes, env or {}, cluster_id="c1", state_root="/s", **kw
    )


def profile(text: str):
    return parse(text, source="site.toml", env={"SCRATCH": "/scratch/u"})


def test_local_plan_runs_the_found_mpiexec_on_loopback():
    p = plan(threads=3)
    assert p.mode == "mpiexec" and p.launch_cmd == ("/venv/bin/mpiexec",)
    assert p.launch_args == () and p.controller_ip == "" and p.state_dir == "/s/ipp-c1"
    assert p.engine_env["OMP_NUM_THREADS"] == "3"
    kwargs = p.cluster_kwargs()
    assert kwargs["engines"] == "mpi" and kwargs["load_profile"] is False
    assert kwargs["profile_dir"] == "/s/ipp-c1" and "controller_ip" not in kwargs
    config = p.ipp_config()
    assert config.MPILauncher.mpi_cmd == ["/venv/bin/mpiexec"]


def test_a_profile_passes_its_mpiexec_arguments_and_names_any_pmix_version():
    p = plan(profile('[launch]\nmode = "mpiexec"\nmpiexec_args = ["--bind-to", "none"]\n'))
    assert p.launch_args == ("--bind-to", "none")
    assert p.ipp_config().MPILauncher.mpi_args == ["--bind-to", "none"]
    for plugin in ("pmix_v4", "pmix_v5"):  # Open MPI's PMIx, by version (`srun --mpi=list`)
        srun = plan(profile(f'[slurm]\nsrun_mpi = "{plugin}"\n'), env=ALLOC)
        assert f"--mpi={plugin}" in srun.launch_args


@pytest.mark.skipif(not LOOPBACK, reason="loopback settings are planned on Linux only")
def test_a_local_labs_mpi_layer_is_planned_on_loopback_and_a_profile_wins():
    """UCX and libfabric listen on loopback in a local lab (tests/test_faults.py checks the
    sockets); a profile's own value, a named interface and Slurm launches are left alone."""
    assert {k: plan().engine_env[k] for k in LOCAL_NETWORK} == dict.fromkeys(LOCAL_NETWORK, "lo")
    own = profile(
        '[launch]\nmode = "mpiexec"\n[environment]\nvars = { UCX_NET_DEVICES = "eth1" }\n'
    )
    assert plan(own).engine_env["UCX_NET_DEVICES"] == "eth1"
    assert plan(own).engine_env["FI_TCP_IFACE"] == "lo"
    named = profile('[launch]\nmode = "mpiexec"\n[network]\ninterface = "ib0"\n')
    assert not set(LOCAL_NETWORK) & set(plan(named, interfaces={"ib0": "10.0.0.5"}).engine_env)
    assert not set(LOCAL_NETWORK) & set(plan(env=ALLOC).engine_env)  # srun


def test_inside_an_allocation_auto_plans_srun_with_plugin_cpus_and_a_named_step():
    p = plan(BUILTIN["slurm-allocation"], workers=4, threads=2, env=ALLOC)
    assert p.mode == "srun" and p.launch_cmd == ("srun",)
    args = list(p.launch_args)
    for wanted in ("--mpi=pmi2", "--cpus-per-task=2", "--cpu-bind=cores", "--kill-on-bad-exit=1",
                   "--immediate=60", "--job-name=hpclab-c1"):  # fmt: skip
        assert wanted in args
    assert "--overlap" not in args  # no enclosing step: sbatch's batch shell or salloc
    assert p.record()["srun"].startswith("srun -n 4 --mpi=pmi2")
    assert plan(env=ALLOC).mode == "srun"  # auto under `local` too: SLURM_JOB_ID decides


def test_overlap_is_added_inside_a_job_step_unless_the_profile_says_no():
    env = {**ALLOC, "SLURM_STEP_ID": "0"}
    p = plan(BUILTIN["slurm-allocation"], env=env)
    assert "--overlap" in p.launch_args and any("--overlap" in n for n in p.notes)
    off = profile('[launch]\nmode = "srun"\n[slurm]\noverlap_inside_step = false\n')
    assert "--overlap" not in plan(off, env=env).launch_args


def test_more_cpus_than_the_allocation_is_refused_with_the_maximum():
    env = {**ALLOC, "SLURM_JOB_CPUS_PER_NODE": "2(x2),1"}  # 5 CPUs in all
    with pytest.raises(ConfigError, match=r"need 6 CPUs.*has 5.*at most 2 workers"):
        plan(BUILTIN["slurm-allocation"], workers=3, threads=2, env=env)
    assert plan(BUILTIN["slurm-allocation"], workers=5, threads=1, env=env).workers == 5


def test_srun_needs_an_allocation():
    with pytest.raises(ConfigError, match="SLURM_JOB_ID is not set"):
        plan(BUILTIN["slurm-allocation"], env={})


def test_nodes_shape_and_multi_node_controller_address():
    site = profile('[launch]\nmode = "srun"\n[network]\ninterface = "hsn0"\n')
    p = plan(
        site, workers=4, nodes=2, env=ALLOC, interfaces={"hsn0": "10.1.2.3", "lo": "127.0.0.1"}
    )
    assert {"--nodes=2", "--ntasks-per-node=2"} <= set(p.launch_args)
    assert p.controller_ip == p.controller_location == "10.1.2.3"
    assert p.cluster_kwargs()["controller_ip"] == "10.1.2.3"
    with pytest.raises(ConfigError, match=r"network.interface = 'ib0' has no IPv4.*hsn0"):
        plan(profile('[launch]\nmode = "srun"\n[network]\ninterface = "ib0"\n'), nodes=2,
             env=ALLOC, interfaces={"hsn0": "10.1.2.3"})  # fmt: skip
    with pytest.raises(ConfigError, match="nodes=3 does not divide workers=4"):
        plan(site, workers=4, nodes=3, env=ALLOC)
    # no interface named: bind everything, advertise the host name (ipyparallel's default)
    anywhere = plan(
        BUILTIN["slurm-allocation"], workers=2, env={**ALLOC, "SLURM_JOB_NUM_NODES": "2"}
    )
    assert anywhere.controller_ip == "*" and anywhere.controller_location == ""
    pinned = profile('[launch]\nmode = "srun"\n[network]\ncontroller_ip = "127.0.0.1"\n')
    assert plan(pinned, nodes=2, env=ALLOC).controller_ip == "127.0.0.1"


def test_gpu_binding_per_node_or_per_task():
    per_node = profile('[launch]\nmode = "srun"\n[node]\ngpus = 4\n')
    assert {"--gpus-per-node=4", "--gpu-bind=none"} <= set(plan(per_node, env=ALLOC).launch_args)
    per_task = profile('[launch]\nmode = "srun"\n[node]\ngpus = 4\ngpu_binding = "per_task"\n')
    args = plan(per_task, env=ALLOC).launch_args
    assert "--gpus-per-task=1" in args and not any(a.startswith("--gpus-per-node") for a in args)


def test_profile_threads_environment_prefix_python_ports_and_srun_extra():
    site = profile(
        '[launch]\nmode = "srun"\nengine_prefix = ["apptainer", "exec", "/sw/h.sif"]\n'
        'python = "/sw/py/bin/python"\n[slurm]\nsrun_mpi = "pmix"\nsrun_extra = ["--exclusive"]\n'
        "step_wait_s = 5\nregistration_timeout_s = 77\n[node]\nthreads_per_worker = 4\n"
        '[network]\nports = "50000-50100"\n[environment]\nvars = { FI_PROVIDER = "tcp" }\n'
    )
    p = plan(site, threads=1, env={**ALLOC, "SLURM_JOB_CPUS_PER_NODE": "64"})
    assert p.threads == 4 and p.engine_env["OMP_NUM_THREADS"] == "4"
    assert p.engine_env["FI_PROVIDER"] == "tcp"
    assert p.engine_cmd == ("apptainer", "exec", "/sw/h.sif", "/sw/py/bin/python", "-m",
                            "ipyparallel.engine")  # fmt: skip
    assert {"--mpi=pmix", "--exclusive", "--immediate=5", "--cpus-per-task=4"} <= set(p.launch_args)
    assert p.registration_timeout_s == 77
    assert p.ports == "50000-50100" and p.record()["ports"] == "50000-50100"
    args = p.cluster_kwargs([50003, 50004])["controller_args"]
    assert "--IPController.engine_ports=50003,50004" in args  # the free part cluster/ports.py chose
    assert plan(site, env=ALLOC, registration_timeout_s=9).registration_timeout_s == 9


def test_sbatch_plan_writes_a_complete_script_and_separates_queue_from_registration():
    site = profile(
        '[launch]\nmode = "sbatch"\n[slurm]\npartition = "gpu"\naccount = "${SCRATCH}"\n'
        'time = "00:30:00"\nextra_sbatch = ["--constraint=a100"]\nqueue_timeout_s = 600\n'
        '[network]\ninterface = "ib0"\n[environment]\nsetup = ["module load x/{1}"]\n'
    )
    p = plan(site, workers=4, threads=2, interfaces={"ib0": "10.0.0.5"})
    assert p.mode == "sbatch" and p.queue_timeout_s == 600 and p.registration_timeout_s == 300
    assert p.submit_command == ("sbatch", "--parsable", "--export=ALL")
    script = p.batch_script
    for line in ("#SBATCH --job-name=hpclab-c1", "#SBATCH --ntasks=4", "#SBATCH --cpus-per-task=2",
                 "#SBATCH --partition=gpu", "#SBATCH --account=/scratch/u",
                 "#SBATCH --time=00:30:00", "#SBATCH --constraint=a100",
                 "module load x/{{1}}", "export OMP_NUM_THREADS=2"):  # fmt: skip
        assert line in script.splitlines()
    assert "#SBATCH --qos" not in script  # empty options are left out: sbatch rejects them
    last = script.strip().splitlines()[-1]
    assert last.startswith("exec srun --mpi=pmi2 --cpus-per-task=2") and last.endswith(
        "{program_and_args}"
    )
    assert shlex.split(last)[-1] == "{program_and_args}"
    assert p.controller_ip == "10.0.0.5"  # never loopback: engines run on compute nodes
    config = p.ipp_config()
    assert config.SlurmEngineSetLauncher.batch_file_name == "/s/ipp-c1/engines.sbatch"
    assert "--mpi" in config.EngineLauncher.engine_args
    assert p.cluster_kwargs()["engines"] == "slurm"


def test_sbatch_script_renders_with_ipyparallels_formatter():
    from IPython.utils.text import EvalFormatter  # what ipyparallel renders with

    site = profile('[launch]\nmode = "sbatch"\n[environment]\nsetup = ["echo ${{HOME}} {x}"]\n')
    p = plan(site, interfaces={})
    text = EvalFormatter().format(p.batch_script, program_and_args="python -m ipyparallel.engine",
                                  output_file="/s/out.log")  # fmt: skip
    assert "echo ${{HOME}} {x}" in text and "#SBATCH --output=/s/out.log" in text
    assert text.rstrip().endswith("python -m ipyparallel.engine")


def test_group_members_are_consecutive_ranks():
    assert members(8, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_groups_that_span_nodes_are_named():
    """Block placement of 4 ranks per node keeps groups of 2 or 4 on one node; 3 ranks per
    node split the middle group of 3 groups of 2; round robin splits every group."""
    assert across_nodes(list("aaaabbbb"), 2) == across_nodes(list("aaaabbbb"), 4) == []
    assert across_nodes(list("aaabbb"), 3) == [[2, 3]]
    assert across_nodes(list("abab"), 2) == [[0, 1], [2, 3]]
    assert across_nodes(list("abab"), 1) == across_nodes(list("abab"), 4) == []  # no sets


def test_record_and_horovod_environment():
    horovod = EngineSettings(cycle_time_ms=0.5).env()
    p = plan(env=ALLOC, profile=BUILTIN["slurm-allocation"], horovod=horovod)
    assert p.engine_env["HOROVOD_CYCLE_TIME"] == "0.5"
    rec = p.record()
    assert rec["mode"] == "srun" and rec["profile"] == "slurm-allocation"
    assert rec["job_name"] == "hpclab-c1"

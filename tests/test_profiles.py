"""Cluster profiles: lookup order, `${VAR}` expansion, and a sentence for every bad field."""

from __future__ import annotations

import pytest

from hpclab.cluster import profiles
from hpclab.cluster.profiles import BUILTIN, Profile, parse, resolve
from hpclab.core.errors import ConfigError

FULL = """
[cluster]
name = "mycluster-gpu"
description = "4x A100 nodes"
[launch]
mode = "sbatch"
engine_prefix = ["apptainer", "exec", "/sw/h.sif"]
[slurm]
partition = "gpu"
account = "${ACCOUNT}"
time = "01:00:00"
srun_mpi = "pmix"
overlap_inside_step = false
queue_timeout_s = 900
[node]
gpus = 4
threads_per_worker = 16
gpu_binding = "per_task"
[network]
interface = "hsn0"
[paths]
runs = "${SCRATCH}/runs"
[environment]
setup = ["module load cray-mpich"]
vars = { FI_PROVIDER = "cxi" }
"""


def test_a_full_profile_parses_with_expansion():
    p = parse(FULL, source="/etc/x.toml", env={"ACCOUNT": "proj1", "SCRATCH": "/scratch/u"})
    assert p.name == "mycluster-gpu" and p.source == "/etc/x.toml"
    assert p.launch.mode == "sbatch" and p.launch.engine_prefix == (
        "apptainer",
        "exec",
        "/sw/h.sif",
    )
    assert p.slurm.account == "proj1" and p.slurm.srun_mpi == "pmix"
    assert p.slurm.overlap_inside_step is False and p.slurm.queue_timeout_s == 900
    assert p.node.gpus == 4 and p.node.gpu_binding == "per_task"
    assert p.paths.runs == "/scratch/u/runs" and p.environment.vars == {"FI_PROVIDER": "cxi"}
    assert p.slurm.step_wait_s == 60  # defaults fill what the file leaves out
    shown = profiles.describe(p)
    assert "[slurm]" in shown and "partition = 'gpu'" in shown


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('[launch]\nmode = "pbs"\n', "launch.mode = 'pbs' is not allowed"),
        ('[slurm]\nsrun_mpi = "none"\n', "slurm.srun_mpi = 'none' is not allowed"),
        ("[slurm]\nstep_wait_s = 0\n", "slurm.step_wait_s = 0 must be from 1"),
        ('[slurm]\nstep_wait_s = "5"\n', "slurm.step_wait_s = '5' must be an integer"),
        ("[slurm]\noverlap_inside_step = 1\n", "must be true or false"),
        ('[slurm]\nextra_sbatch = "--x"\n', "must be a list of strings"),
        ('[slurm]\nparition = "gpu"\n', "slurm.parition is not a known key"),
        ('[node]\ngpu_binding = "all"\n', "node.gpu_binding = 'all'"),
        ("[nodes]\ngpus = 1\n", "unknown key(s) nodes"),
        ('[cluster]\nsite = "x"\n', "cluster.site"),
        ('[paths]\nruns = "${NOPE}/runs"\n', "paths.runs uses ${NOPE}, which is not set"),
        ("[environment]\nvars = { A = 1 }\n", "must be a table of strings"),
        ("[launch\n", "is not valid TOML"),
        ("slurm = 3\n", "[slurm] must be a table"),
    ],
)
def test_bad_fields_name_the_file_the_key_and_the_rule(text, fragment):
    with pytest.raises(ConfigError) as info:
        parse(text, source="/etc/hpclab/profiles/site.toml", env={})
    message = str(info.value)
    assert fragment in message and "/etc/hpclab/profiles/site.toml" in message


def test_lookup_order_argument_then_environment_then_auto(tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "site.toml").write_text('[launch]\nmode = "sbatch"\n')
    env = {"HPCLAB_PROFILE_PATH": str(folder), "HOME": str(tmp_path)}
    assert resolve(None, env) == (BUILTIN["local"], "auto: default")
    assert resolve(None, {**env, "SLURM_JOB_ID": "7"})[0] is BUILTIN["slurm-allocation"]
    by_env, how = resolve(None, {**env, "HPCLAB_PROFILE": "site", "SLURM_JOB_ID": "7"})
    assert by_env.name == "site" and by_env.launch.mode == "sbatch" and how == "HPCLAB_PROFILE"
    chosen, how = resolve("local", {**env, "HPCLAB_PROFILE": "site"})
    assert chosen is BUILTIN["local"] and how == "Lab(profile=...)"
    assert resolve(str(folder / "site.toml"), {})[0].launch.mode == "sbatch"  # a path
    given = Profile(name="mine")
    assert resolve(given, env)[0] is given
    assert profiles.available(env)["site"] == str(folder / "site.toml")


def test_a_file_in_the_search_path_overrides_a_builtin_and_unknown_names_list_the_known(tmp_path):
    (tmp_path / "local.toml").write_text('[cluster]\ndescription = "site override"\n')
    env = {"HPCLAB_PROFILE_PATH": str(tmp_path), "HOME": str(tmp_path)}
    assert profiles.load("local", env).description == "site override"
    with pytest.raises(ConfigError, match=r"profile 'nope' was not found; known profiles: .*local"):
        profiles.load("nope", env)
    with pytest.raises(ConfigError, match="does not exist"):
        profiles.load(str(tmp_path / "missing.toml"), env)


@pytest.mark.parametrize("launcher", ["mpi", "slurm"])
def test_lab_launcher_takes_the_profile_modes_only(launcher):
    """`Lab(launcher=...)` overrides the profile's launch mode, so it takes exactly its modes."""
    from hpclab.cluster.lab import Lab
    from hpclab.cluster.lab_args import LAUNCHERS

    assert set(LAUNCHERS) == set(profiles.MODES)
    with pytest.raises(ConfigError, match=f"Lab.launcher must be one of .*launcher='{launcher}'"):
        Lab(workers=2, launcher=launcher)

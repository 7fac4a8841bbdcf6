"""No engines on a Slurm login node by accident (issue 26, item 2).

A login node is faked with what Slurm itself reads: a `sinfo`/`srun` on a PATH of the test's own
and a cluster configuration (`SLURM_CONF`, or a file of `host.SLURM_CONFS`) in tmp_path. Nothing
of hpclab is mocked; the refusal is shown through a real `Lab(...)`, which refuses before any
engine starts.
"""

from __future__ import annotations

import os
import time

import pytest

from hpclab import Lab
from hpclab.cluster import host, profiles
from hpclab.core.errors import ConfigError


def _client(folder, name="sinfo"):
    folder.mkdir(exist_ok=True)
    tool = folder / name
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return tool


@pytest.fixture
def login(tmp_path):
    """The environment of a login node: a Slurm client on PATH and a cluster's slurm.conf."""
    tool = _client(tmp_path / "bin")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=fake\nSlurmctldHost=ctl\n")
    env = {"PATH": str(tool.parent), "SLURM_CONF": str(conf), "HOME": str(tmp_path)}
    return env, tool, conf


def test_a_client_with_a_cluster_configuration_and_no_allocation_is_a_login_node(login, tmp_path):
    env, tool, conf = login
    assert host.slurm_login_node(env) == f"{tool} and {conf}"
    assert host.slurm_login_node({**env, "SLURM_JOB_ID": "42"}) == ""  # a compute node's job
    missing = tmp_path / "nope.conf"
    assert host.slurm_login_node({**env, "SLURM_CONF": str(missing)}) == ""
    assert host.slurm_login_node({**env, "PATH": str(tmp_path / "empty")}) == ""  # no client
    srun_only = _client(tmp_path / "srun-bin", "srun")
    assert host.slurm_login_node({**env, "PATH": str(srun_only.parent)}).startswith(str(srun_only))


def test_the_default_configuration_files_are_searched_without_slurm_conf(login, tmp_path):
    """Without SLURM_CONF: the compiled-in places (here a list in tmp_path); a Slurm client
    without any cluster configuration (a workstation with the packages) is no login node."""
    env, tool, conf = login
    del env["SLURM_CONF"]
    assert host.slurm_login_node(env, confs=(str(tmp_path / "none"), str(conf))) == (
        f"{tool} and {conf}"
    )
    assert host.slurm_login_node(env, confs=(str(tmp_path / "none"),)) == ""
    assert "/etc/slurm/slurm.conf" in host.SLURM_CONFS


def test_lab_refuses_auto_on_a_login_node_with_one_sentence(login, monkeypatch, tmp_path):
    env, tool, conf = login
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    for var in ("SLURM_JOB_ID", "HPCLAB_PROFILE", "HPCLAB_PROFILE_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no profile of the developer's own
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        Lab(workers=2, runs_dir=tmp_path / "runs", verbose=False)
    said = str(err.value)
    assert time.perf_counter() - t0 < 2  # refused before any engine starts
    assert said.count(". ") == 0 and said.endswith(".")  # one sentence
    assert "Slurm login node" in said and str(conf) in said and "SLURM_JOB_ID" in said
    assert "profile=" in said and "HPCLAB_PROFILE" in said and "'local' (auto: default)" in said


def test_what_someone_chose_is_allowed_on_a_login_node(login, tmp_path):
    """`local` by name (profile= or HPCLAB_PROFILE), launcher='mpiexec', a profile of mode
    mpiexec or sbatch, or one with launch.local_on_login = true; an auto profile is refused."""
    env, _, _ = login
    allowed = [
        profiles.resolve("local", env),
        profiles.resolve(None, {**env, "HPCLAB_PROFILE": "local"}),
        (profiles.parse('[launch]\nmode = "mpiexec"\n', source="m.toml", env=env), "x"),
        (profiles.parse('[launch]\nmode = "sbatch"\n', source="b.toml", env=env), "x"),
        (profiles.parse("[launch]\nlocal_on_login = true\n", source="l.toml", env=env), "x"),
    ]
    for profile, how in allowed:
        profiles.check_login_node(profile, how, env=env)
    auto, how = profiles.resolve(None, env)
    assert how == "auto: default"
    profiles.check_login_node(auto, how, launcher="mpiexec", env=env)
    for launcher in (None, "auto"):
        with pytest.raises(ConfigError, match="Slurm login node"):
            profiles.check_login_node(auto, how, launcher=launcher, env=env)
    site = profiles.parse("[cluster]\nname = 'gpu'\n", source="gpu.toml", env=env)
    with pytest.raises(ConfigError, match=r"profile 'gpu' \(Lab\(profile=...\)\)"):
        profiles.check_login_node(site, "Lab(profile=...)", env=env)
    inside = {**env, "SLURM_JOB_ID": "7"}  # inside an allocation: srun, nothing to refuse
    profiles.check_login_node(*profiles.resolve(None, inside), env=inside)


def test_local_on_login_must_be_a_boolean():
    with pytest.raises(ConfigError, match=r"launch.local_on_login = 'yes' must be true or false"):
        profiles.parse('[launch]\nlocal_on_login = "yes"\n', source="x.toml", env={})

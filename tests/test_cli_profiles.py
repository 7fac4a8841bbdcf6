"""`hpclab profiles` (list, show with the launch plan, hub snippet, job script) and the pure parts
of `hpclab doctor --profile` (fake `srun`/`sbatch` on PATH). Fast: no Slurm, no engines, no TF."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpclab.cluster.profiles import parse
from hpclab.core.errors import ConfigError, LabError
from hpclab.tools import cli, cli_profiles, doctor_profile

GPU = """
[cluster]
description = "4x A100 nodes"
[launch]
mode = "auto"
[slurm]
partition = "gpu"
account = "proj1"
qos = "high"
time = "01:00:00"
extra_sbatch = ["--constraint=a100"]
srun_mpi = "pmix"
[node]
gpus = 4
threads_per_worker = 8
[environment]
setup = ["module load cray-mpich", "source /sw/venv/bin/activate"]
"""
ALLOC = (
    '[cluster]\ndescription = "srun only"\n[launch]\nmode = "srun"\n[slurm]\nsrun_mpi = "pmix"\n'
)
BATCH = '[launch]\nmode = "sbatch"\n[slurm]\npartition = "long"\ntime = "02:00:00"\n'


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A profile folder on HPCLAB_PROFILE_PATH holding gpu, alloc and batch; a clean environment."""
    profiles_dir = tmp_path / "profiles"
    profiles_dir.mkdir()
    for name, text in (("gpu", GPU), ("alloc", ALLOC), ("batch", BATCH)):
        (profiles_dir / f"{name}.toml").write_text(text)
    monkeypatch.setenv("HPCLAB_PROFILE_PATH", str(profiles_dir))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HPCLAB_RUNS", str(tmp_path / "runs"))
    for var in ("HPCLAB_PROFILE", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_JOB_CPUS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)
    return profiles_dir


def hpclab(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def table(out: str) -> dict[str, str]:
    """The rows of `hpclab profiles` (before its blank line), by profile name."""
    return {line[2:].split()[0]: line for line in out.split("\n\n")[0].splitlines()}


def profile(text: str, name: str = "gpu"):
    return parse(text, source=f"/etc/hpclab/profiles/{name}.toml", env={})


# ---------------------------------------------------------------------------------------------
# hpclab profiles: the list
# ---------------------------------------------------------------------------------------------


def test_list_shows_builtins_folder_profiles_and_marks_the_default(folder, capsys):
    code, out, _ = hpclab(capsys, "profiles")
    assert code == 0
    rows = table(out)
    assert {"local", "slurm-allocation", "gpu", "alloc", "batch"} <= set(rows)
    assert "built-in" in rows["slurm-allocation"]
    assert str(folder / "gpu.toml") in rows["gpu"] and "4x A100 nodes" in rows["gpu"]
    assert rows["local"].startswith("* ") and not rows["gpu"].startswith("*")
    assert "used now: local (auto: default)" in out
    assert str(folder) in out  # the search path is shown


@pytest.mark.parametrize(
    "env, marked, why",
    [
        ({"HPCLAB_PROFILE": "gpu"}, "gpu", "HPCLAB_PROFILE"),
        ({"SLURM_JOB_ID": "42"}, "slurm-allocation", "auto: SLURM_JOB_ID is set"),
    ],
)
def test_list_marks_the_profile_used_now_and_why(folder, monkeypatch, capsys, env, marked, why):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, out, _ = hpclab(capsys, "profiles")
    assert code == 0
    assert [name for name, row in table(out).items() if row.startswith("* ")] == [marked]
    assert f"used now: {marked} ({why})" in out


def test_list_shows_a_path_profile_and_a_broken_one(folder, tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "site" / "mine.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text('[cluster]\ndescription = "by path"\n')
    (folder / "broken.toml").write_text('[launch]\nmode = "pbs"\n')
    monkeypatch.setenv("HPCLAB_PROFILE", str(elsewhere))
    code, out, _ = hpclab(capsys, "profiles")
    assert code == 0
    assert "* mine" in out and str(elsewhere) in out and "by path" in out
    assert "does not load" in out and "launch.mode = 'pbs' is not allowed" in out


def test_an_unknown_current_profile_is_one_sentence_and_exit_2(folder, monkeypatch, capsys):
    monkeypatch.setenv("HPCLAB_PROFILE", "nope")
    code, out, err = hpclab(capsys, "profiles")
    assert code == 2 and "local" in out  # the list is still shown
    assert err.startswith("hpclab profiles: HPCLAB_PROFILE='nope' does not resolve: profile 'nope'")
    assert len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# hpclab profiles NAME
# ---------------------------------------------------------------------------------------------


def test_a_named_profile_is_described_with_its_plan_as_inside_an_allocation(folder, capsys):
    code, out, _ = hpclab(capsys, "profiles", "alloc", "--workers", "3")
    assert code == 0
    assert out.startswith("# alloc: srun only") and f"# from {folder / 'alloc.toml'}" in out
    assert "[slurm]" in out and "srun_mpi = 'pmix'" in out
    assert "launch plan for 3 worker(s) x 1 thread(s):" in out
    assert "srun -n 3 --mpi=pmix --cpus-per-task=1" in out and "--job-name=hpclab-ID" in out
    assert "controller    127.0.0.1" in out
    assert f"shown as inside an allocation (SLURM_JOB_ID={cli_profiles.FAKE_JOB_ID})" in out


def test_an_sbatch_profile_shows_the_engines_job_script(folder, capsys):
    code, out, _ = hpclab(
        capsys, "profiles", "--workers", "4", "batch", "--threads-per-worker", "2"
    )
    assert code == 0
    assert "mode          sbatch" in out and "queue 1800 s" in out
    assert "    #SBATCH --partition=long" in out and "    #SBATCH --ntasks=4" in out
    assert "    exec srun --mpi=pmi2 --cpus-per-task=2" in out and "ipyparallel.engine" in out
    assert "{program_and_args}" not in out and "{output_file}" not in out


def test_the_profiles_threads_win_and_nodes_shape_the_plan(folder, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    code, out, _ = hpclab(capsys, "profiles", "gpu", "--workers", "4", "--nodes", "2")
    assert code == 0, out
    assert "4 worker(s) x 8 thread(s) on 2 node(s)" in out
    assert "--nodes=2 --ntasks-per-node=2 --gpus-per-node=4" in out
    assert "shown as inside" not in out  # a real allocation: the plan as it is


@pytest.mark.parametrize(
    "argv, words",
    [
        (["profiles", "nope"], ["profile 'nope' was not found", "known profiles", "gpu"]),
        (["profiles", "gpu", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["profiles", "gpu", "--workers", "0"], ["--workers", "'0'"]),
        (["profiles", "gpu", "--", "run"], ["only used with --job-script"]),
        (["profiles", "--hub-snippet"], ["need a profile NAME"]),
        (["profiles", "gpu", "--job-script"], ["needs the hpclab command after `--`"]),
        (["profiles", "batch", "--job-script", "--", "run"], ["would queue a second job"]),
        (
            ["profiles", "gpu", "--workers", "4", "--job-script", "--", "run", "--workers", "2"],
            ["give it once"],
        ),
    ],
)
def test_a_mistake_is_one_sentence_and_exit_2(folder, capsys, argv, words):
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's own errors (before the command runs)
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for word in words:
        assert word in err, err


# ---------------------------------------------------------------------------------------------
# --hub-snippet
# ---------------------------------------------------------------------------------------------


def _hub_entry(snippet: str, before: list | None = None):
    """Run a snippet as jupyterhub_config.py; (the hub's config, ProfilesSpawner.profiles as
    the hub would load them when it had `before` already)."""
    from traitlets.config import Config

    c = Config()
    exec(compile(snippet, "jupyterhub_config.py", "exec"), {"c": c})
    return c, c.ProfilesSpawner.profiles.get_value(list(before or []))


def _run_with_memory(runs: Path, run_id: str, peaks: list[float], gpu: bool = False) -> None:
    """A run folder whose config.json has `lab.ranks` with these measured peaks (MiB), of
    ranks that had a GPU or not."""
    import json

    (runs / run_id).mkdir(parents=True)
    ident = {"index": "0", "uuid": "GPU-1", "name": "NVIDIA A100"} if gpu else {}
    ranks = [
        {"rank": i, "peak_rss_mib": p, "rss_mib": p, "gpu": ident} for i, p in enumerate(peaks)
    ]
    (runs / run_id / "config.json").write_text(json.dumps({"lab": {"ranks": ranks}}))


def test_hub_snippet_adds_a_profile_entry_with_the_shape_and_measured_memory(folder, capsys):
    from hpclab.tools import hub_snippet as hs

    runs = folder.parent / "runs"
    _run_with_memory(runs, "20261126-1", [480.0, 470.5], gpu=True)
    _run_with_memory(runs, "20261126-2", [501.5, 497.0], gpu=True)  # the newest: its figure
    code, out, _ = hpclab(capsys, "profiles", "gpu", "--workers", "4", "--hub-snippet")
    assert code == 0
    hub_own = ("Local", "local", "jupyterhub.spawner.LocalProcessSpawner", {})
    c, entries = _hub_entry(out, before=[hub_own])
    assert "spawner_class" not in c.JupyterHub  # the hub's own class is left alone
    assert entries[0] == hub_own and len(entries) == 2  # one entry added after the hub's
    display, key, spawner, s = entries[1]
    assert (key, spawner) == ("hpclab-gpu", "batchspawner.SlurmSpawner") and "4 engine" in display
    assert (s["req_partition"], s["req_account"], s["req_qos"]) == ("gpu", "proj1", "high")
    assert s["req_runtime"] == "01:00:00"
    assert s["req_nprocs"] == str(4 * 8 + hs.SPARE_CPUS)  # 4 workers x the profile's 8 threads
    assert s["req_memory"] == f"{hs.job_memory_mib(4, 501.5)}M"
    assert "501 MiB peak of run 20261126-2" in out or "502 MiB peak of run 20261126-2" in out
    assert (s["req_ngpus"], s["req_gres"]) == ("4", "gpu:4")
    assert s["req_options"] == "--account=proj1 --qos=high --constraint=a100"
    assert s["req_srun"] == "srun --ntasks=1 --nodes=1 --overlap"
    assert s["environment"] == {"HPCLAB_PROFILE": "gpu"}
    assert s["req_prologue"] == "module load cray-mpich\nsource /sw/venv/bin/activate"
    batchspawner = pytest.importorskip("batchspawner")
    traits = set(batchspawner.SlurmSpawner.class_trait_names())
    assert set(s) <= traits, set(s) - traits
    code, out, _ = hpclab(capsys, "profiles", "gpu", "--hub-snippet", "--engine-mib", "2000")
    assert _hub_entry(out)[1][0][3]["req_memory"] == f"{hs.job_memory_mib(2, 2000)}M"


def test_hub_snippet_memory_grows_with_the_engines_and_has_a_default():
    from hpclab.tools import hub_snippet as hs

    assert hs.job_memory_mib(4, 500) > hs.job_memory_mib(2, 500) >= 2 * 500 + hs.CONTROLLER_MIB
    assert hs.job_memory_mib(2, 500) % 256 == 0
    mib, source = hs.engine_memory(None)
    assert mib == hs.DEFAULT_ENGINE_MIB and "no run" in source


def test_a_gpu_profile_is_not_sized_from_cpu_runs(folder, capsys):
    """GPU engines hold TensorFlow's CUDA libraries: a CPU run's figure does not size them."""
    from hpclab.tools import hub_snippet as hs

    runs = folder.parent / "runs"
    _run_with_memory(runs, "20261126-3", [480.0, 470.5])  # a CPU run
    mib, source = hs.engine_memory(runs, gpu=True)
    assert mib == hs.DEFAULT_GPU_ENGINE_MIB and source.startswith("no GPU run in")
    assert "not yet measured on a GPU" in source
    assert hs.engine_memory(runs)[0] == 480.0  # a CPU profile takes it
    code, out, _ = hpclab(capsys, "profiles", "gpu", "--workers", "2", "--hub-snippet")
    assert code == 0
    s = _hub_entry(out)[1][0][3]
    assert s["req_memory"] == f"{hs.job_memory_mib(2, hs.DEFAULT_GPU_ENGINE_MIB)}M"
    assert "TF_GPU_HOST_MEM_LIMIT_IN_MB in the profile's environment.vars to bound it" in out


def test_a_gpu_profiles_pinned_host_bound_is_counted_per_engine():
    from hpclab.tools import hub_snippet as hs

    gpu = profile(GPU + '[environment.vars]\nTF_GPU_HOST_MEM_LIMIT_IN_MB = "2048"\n')
    assert hs.pinned_host_mib(gpu) == 2048
    text = cli_profiles.hub_snippet(gpu, 2, None, "gpu", 3000, "a GPU run")
    assert _hub_entry(text)[1][0][3]["req_memory"] == f"{hs.job_memory_mib(2, 3000, 2048)}M"
    assert hs.job_memory_mib(2, 3000, 2048) - hs.job_memory_mib(2, 3000) >= 2 * 2048 - 256
    assert "+ 2048 MiB pinned" in text and "2048 MiB per engine, from the profile's" in text
    assert hs.pinned_host_mib(profile(ALLOC, "alloc")) == 0


def test_hub_snippet_leaves_out_what_the_profile_does_not_set():
    text = cli_profiles.hub_snippet(profile(ALLOC, "alloc"), 2, 3, "alloc")
    settings = _hub_entry(text)[1][0][3]
    assert settings["req_nprocs"] == "7"  # 2 x 3 + the spare CPU
    assert not {"req_partition", "req_gres", "req_options", "req_prologue"} & set(settings)


def test_a_gpu_profile_without_threads_sizes_the_hub_job_and_job_script_as_the_lab_does():
    from hpclab.cluster.lab_args import threads_for

    gpu = profile(GPU.replace("threads_per_worker = 8\n", ""))
    lab_rule = threads_for(None, 0, gpu.node.gpus, 4, None)[0]  # Lab(threads_per_worker=None)
    assert lab_rule > 1  # GPU ranks get more than one thread by default
    settings = _hub_entry(cli_profiles.hub_snippet(gpu, 4, None, "gpu"))[1][0][3]
    assert settings["req_nprocs"] == str(4 * lab_rule + 1)
    script = cli_profiles.job_script(gpu, 4, None, ["run"], python="py")
    assert f"#SBATCH --cpus-per-task={lab_rule}" in script.splitlines()
    assert script.endswith(f"--workers 4 --threads-per-worker {lab_rule}")
    asked = _hub_entry(cli_profiles.hub_snippet(gpu, 4, 1, "gpu"))[1][0][3]  # asked: kept
    assert asked["req_nprocs"] == "5"
    cpu = _hub_entry(cli_profiles.hub_snippet(profile(ALLOC, "alloc"), 2, None, "alloc"))
    assert cpu[1][0][3]["req_nprocs"] == "3"  # CPU ranks: one thread each


# ---------------------------------------------------------------------------------------------
# --job-script (mode c)
# ---------------------------------------------------------------------------------------------


def test_job_script_runs_hpclab_once_under_exec_with_the_walltime_signal():
    text = cli_profiles.job_script(
        profile(GPU), 4, None, ["run", "--epochs", "5"], python="/sw/venv/bin/python"
    )
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line.removeprefix("#SBATCH ") for line in lines if line.startswith("#SBATCH")]
    assert directives == [
        "--job-name=hpclab-run",
        "--ntasks=4",
        "--cpus-per-task=8",
        "--partition=gpu",
        "--account=proj1",
        "--qos=high",
        "--time=01:00:00",
        "--gpus-per-node=4",
        "--constraint=a100",
        "--signal=B:USR1@120",
        "--output=hpclab-%j.out",
    ]
    body = lines[len(directives) + 2 :]
    assert body[:4] == [
        "set -eo pipefail",
        "module load cray-mpich",
        "source /sw/venv/bin/activate",
        "export HPCLAB_PROFILE=gpu",
    ]
    assert lines[-1] == (
        "exec /sw/venv/bin/python -m hpclab.tools.cli run --epochs 5 --workers 4 "
        "--threads-per-worker 8"
    )
    assert "srun hpclab" not in text and "srun " not in lines[-1]


def test_job_script_takes_a_sweeps_largest_size_and_keeps_its_options():
    text = cli_profiles.job_script(
        profile(ALLOC, "alloc"),
        None,
        2,
        ["sweep", "--workers=1,4,2", "--nodes", "2", "--", "x"],
        selector="/site/my profile.toml",
        python="python3",
    )
    assert "#SBATCH --ntasks=4" in text and "#SBATCH --nodes=2" in text
    assert "#SBATCH --cpus-per-task=2" in text and "--partition" not in text
    assert "export HPCLAB_PROFILE='/site/my profile.toml'" in text
    assert text.splitlines()[-1] == (
        "exec python3 -m hpclab.tools.cli sweep --workers=1,4,2 --nodes 2 "
        "--threads-per-worker 2 -- x"
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (["doctor"], "one of run, sweep"),
        (["run", "--workers", "two"], "not a list of integers"),
        (["run", "--threads-per-worker", "3"], "give it once"),
    ],
)
def test_job_script_refuses_what_would_be_wrong(argv, words):
    with pytest.raises(ConfigError, match=words):
        cli_profiles.job_script(profile(GPU), None, 2, argv)


def test_job_script_from_the_command_line_is_valid_bash(folder, capsys):
    code, out, _ = hpclab(capsys, "profiles", "gpu", "--job-script", "--", "run", "--epochs", "5")
    assert code == 0
    assert f"exec {sys.executable} -m hpclab.tools.cli run --epochs 5 --workers 2" in out
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=out, text=True, check=True)


# ---------------------------------------------------------------------------------------------
# hpclab doctor --profile: the parts that need no Slurm
# ---------------------------------------------------------------------------------------------

SLURM_22_LIST = (
    "MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\n"
    "specific pmix plugin versions available: pmix_v4,pmix_v5\n"
)


def test_mpi_plugin_list_is_read_in_both_formats():
    found = doctor_profile.mpi_plugins(SLURM_22_LIST)
    assert found == {"pmix", "none", "cray_shasta", "pmi2", "pmix_v4", "pmix_v5"}
    old = "srun: MPI types are...\nsrun: none\nsrun: openmpi\nsrun: pmi2\n"
    assert doctor_profile.mpi_plugins(old) == {"none", "openmpi", "pmi2"}


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """A folder first on PATH; `fake_bin(name, script)` puts an executable shell script there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # only the fakes: this host may have real Slurm

    def make(name: str, body: str) -> Path:
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return path

    return make


def test_a_missing_srun_plugin_is_one_sentence_naming_the_fix(fake_bin):
    fake_bin("srun", "printf 'MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n'")
    check = doctor_profile.check_srun_mpi(profile(GPU))
    assert check.ok is False
    assert check.text.startswith("srun has no MPI plugin 'pmix' (slurm.srun_mpi in /etc/hpclab")
    assert "it offers pmi2:" in check.text and check.text.endswith(".")
    ok = doctor_profile.check_srun_mpi(profile(ALLOC.replace("pmix", "pmi2")))
    assert ok.ok is True and ok.text.startswith("pmi2 (srun offers none, pmi2)")


def test_a_broken_srun_or_a_refused_sbatch_test_is_a_sentence(fake_bin, tmp_path):
    fake_bin("srun", "echo 'srun: fatal: Could not establish a configuration source' >&2; exit 1")
    check = doctor_profile.check_srun_mpi(profile(GPU))
    assert check.ok is False and "exit 1: srun: fatal: Could not establish" in check.text
    seen = tmp_path / "sbatch-args"
    refuse = 'echo "sbatch: error: invalid partition specified: gpu" >&2; exit 1'
    fake_bin("sbatch", f'echo "$@" > {seen}; {refuse}')
    check = doctor_profile.check_sbatch(profile(GPU))
    assert check.ok is False
    assert "refused the profile's job (error: invalid partition specified: gpu); fix" in check.text
    assert (
        seen.read_text().split()
        == (
            "--test-only --ntasks=2 --cpus-per-task=8 --partition=gpu --account=proj1 --qos=high "
            "--time=01:00:00 --gpus-per-node=4 --constraint=a100 --wrap=true"
        ).split()
    )


def test_interface_and_folders(tmp_path):
    p = profile(GPU + '[network]\ninterface = "hsn0"\n')
    env: dict[str, str] = {}
    found = doctor_profile.check_network(p, "sbatch", env, {"lo": "127.0.0.1", "hsn0": "10.1.2.3"})
    assert found.ok is True and found.text == "hsn0 10.1.2.3"
    missing = doctor_profile.check_network(p, "sbatch", env, {"lo": "127.0.0.1"})
    assert missing.ok is False and "has no IPv4 address on this host" in missing.text
    assert "interfaces with one: lo" in missing.text
    assert doctor_profile.check_network(p, "srun", env, {}).ok is None  # the kernel runs elsewhere
    assert doctor_profile.check_folder("runs", tmp_path, "runs", "x").ok is True
    assert doctor_profile.check_folder("runs", tmp_path / "a" / "b", "runs", "x").ok is True
    (tmp_path / "file").write_text("")
    as_file = doctor_profile.check_folder("runs", tmp_path / "file", "runs", "x.toml")
    assert (
        as_file.ok is False and "is a file, not a folder; set paths.runs in x.toml" in as_file.text
    )


def test_doctor_profile_fails_with_the_plugin_sentence_and_exit_1(folder, fake_bin, capsys):
    fake_bin("srun", "printf 'MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n'")
    code, out, err = hpclab(capsys, "doctor", "--profile", "alloc")
    assert code == 1
    assert "MPI plugin    FAILED   srun has no MPI plugin 'pmix'" in out
    assert err.strip().startswith("hpclab doctor: srun has no MPI plugin 'pmix'")


def test_doctor_profile_skips_the_allreduce_outside_an_allocation(folder, fake_bin, capsys):
    fake_bin("srun", "printf 'MPI plugin types are...\\n\\tpmix\\n\\tpmi2\\n'")
    code, out, err = hpclab(capsys, "doctor", "--profile", "alloc")
    assert code == 0, out + err
    assert "engines by srun" in out and "runs folder   ok" in out
    assert (
        "skipped  srun needs an allocation: run `salloc -n2 hpclab doctor --profile alloc`" in out
    )
    assert "hpclab doctor: profile alloc OK (5 passed, 1 skipped)" in out


def test_doctor_profile_without_slurm_commands_names_them(folder, fake_bin, capsys):
    code, out, err = hpclab(capsys, "doctor", "--profile", "batch", "--quick")
    assert code == 1
    assert "srun is not on PATH" in err and "sbatch is not on PATH" in err
    code, _, err = hpclab(capsys, "doctor", "--profile", "nope")
    assert code == 2 and "profile 'nope' was not found" in err


class _FakeLab:
    """What `doctor_profile.check_allreduce` reads of a started Lab; `apply` answers as told."""

    workers, launcher, lost = 2, "mpiexec", None

    def __init__(self, answer):
        self.answer = answer
        self.ranks = [
            {"rank": r, "size": 2, "pid": 100 + r, "host": "n1", "local_rank": r} for r in (0, 1)
        ]

    def apply(self, fn, timeout):
        assert fn is doctor_profile.rank_allreduce
        if isinstance(self.answer, Exception):
            if "still ran" in str(self.answer):
                self.lost = str(self.answer)
            raise self.answer
        return self.answer


def _probe(rank, value):
    return {"rank": rank, "value": value, "controller": "MPI", "seconds": 0.001}


@pytest.mark.parametrize(
    "answer, ok, words",
    [
        ([_probe(0, 3.0), _probe(1, 3.0)], True, "all 2 ranks agree: 3 (mpiexec"),
        ([_probe(0, 3.0), _probe(1, 2.0)], False, "returned [3.0, 2.0] instead of 3 on every"),
        ([_probe(0, 1.0), _probe(0, 1.0)], False, "formed Horovod ranks [0] instead of one job"),
        (
            LabError("rank_allreduce failed on the lab's ranks: rank 1 raised X: y."),
            False,
            "failed on the engines (rank_allreduce failed on the lab's ranks: rank 1 raised X: y)",
        ),
        (
            LabError("rank(s) [1] still ran after 5 s; every rank was ended"),
            False,
            "did not finish on every rank within 5 s; the ranks are probably not in one MPI job",
        ),
    ],
)
def test_both_doctors_judge_the_allreduce_by_one_check(answer, ok, words):
    check = doctor_profile.check_allreduce(_FakeLab(answer), timeout=5)
    assert check.label == "allreduce" and check.ok is ok and words in check.text, check.text
    if isinstance(answer, list) and answer[1]["rank"] == 1:
        assert [label for label, _ in check.details] == ["rank 0/2", "rank 1/2"]
        assert (
            "pid 101 on n1, local rank 1, controller MPI: allreduce(sum of rank+1) = "
            in (check.details[1][1])
        )

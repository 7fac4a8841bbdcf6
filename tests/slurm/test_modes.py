"""A real Lab on the real (single-host, two emulated nodes) Slurm cluster, in every launch mode.

(a) inside an allocation: `salloc ... python inner_lab.py` → srun engines, trains on 2 ranks;
    the same inside a job step (batchspawner's shape) gets --overlap; 2 nodes; and a forced
    `--mpi=none` must fail before any step with the world-size sentence naming --mpi.
(b) by submission: from this process (the "login node") the engines go in as a batch job; a job
    held in the queue shows PENDING, then trains; stop cancels the job; a client killed while
    its job is pending leaves no job and no process (the reaper cancels it).
(c) headless: `sbatch --wait` a script running `hpclab run --json`; `scancel --signal=TERM`
    mid-run leaves a record that says `stopped`.
Each test ends with no engine, step or job left (checked by pid and squeue).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
PY = sys.executable
PROFILES = HERE / "profiles"


def inner(slurm, tmp_path, *launch, extra=(), timeout=240):
    """Run inner_lab.py under `launch` (salloc/srun args) and return its JSON line."""
    args = [*launch, PY, HERE / "inner_lab.py", "--runs-dir", tmp_path / "runs", *extra]
    r = slurm.run(args, timeout=timeout, cwd=HERE.parents[1])
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}\n{slurm.log_tails()}"
    return json.loads(lines[-1]), r


def assert_nothing_left(slurm):
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = [cmd for _, cmd in slurm.processes() if "ipyparallel" in cmd or "srun" in cmd]
        if not left and not slurm.jobs():
            return
        time.sleep(0.5)
    raise AssertionError(f"left behind: jobs {slurm.jobs()}, processes {left}")


def assert_trained_as_one_world(out):
    assert out.get("status") == "finished", out
    ranks = out["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["size"] for r in ranks} == {2}
    assert all(r["slurm_step"] != "" and r["slurm_job"] for r in ranks)
    digests = out["summary"]["weights_digest"]
    assert len(digests) == 2 and len(set(digests)) == 1  # one model, not two
    assert out["summary"]["world_size"] == 2


def test_a_inside_an_allocation_srun_engines_train_as_one_world(slurm, tmp_path):
    out, _ = inner(slurm, tmp_path, "salloc", "-p", "debug", "-N1", "-n2", "-c1")
    assert_trained_as_one_world(out)
    assert out["plan"]["mode"] == "srun" and out["plan"]["profile"] == "slurm-allocation"
    srun = out["plan"]["srun"]
    assert "--mpi=pmi2" in srun and "--cpus-per-task=1" in srun and "--overlap" not in srun
    assert all(r["threads"] == 1 for r in out["ranks"])
    record = json.loads(next((tmp_path / "runs").glob("*/config.json")).read_text())
    assert record["lab"]["launch"]["mode"] == "srun"
    assert {r["node"] for r in record["lab"]["ranks"]} <= {"n1", "n2"}
    assert_nothing_left(slurm)


def test_a_inside_a_job_step_adds_overlap(slurm, tmp_path):
    """batchspawner's shape: the kernel itself runs in a step holding the allocation's CPUs."""
    out, _ = inner(
        slurm, tmp_path, "salloc", "-p", "debug", "-N1", "-n2", "-c1",
        "srun", "-n1", "-c2", "--export=ALL",
    )  # fmt: skip
    assert out["slurm_step"] != ""
    assert "--overlap" in out["plan"]["srun"] and any("--overlap" in n for n in out["notes"])
    assert_trained_as_one_world(out)
    assert_nothing_left(slurm)


def test_a_forced_mpi_none_fails_before_training_naming_mpi(slurm, tmp_path):
    forced = tmp_path / "none.toml"
    forced.write_text(
        (PROFILES / "ci.toml").read_text().replace('srun_mpi = "pmi2"', 'srun_mpi = "pmi2"\n'
                                                   'srun_extra = ["--mpi=none"]')
    )  # fmt: skip
    t0 = time.monotonic()
    out, r = inner(
        slurm, tmp_path, "salloc", "-p", "debug", "-N1", "-n2", "-c1",
        extra=["--profile", str(forced)],
    )  # fmt: skip
    assert r.returncode == 3 and "error" in out, out
    assert "2 separate 1-rank MPI worlds" in out["error"] and "--mpi=pmi2" in out["error"]
    assert not list((tmp_path / "runs").glob("*/config.json"))  # nothing trained, nothing recorded
    print(f"--mpi=none refused in {time.monotonic() - t0:.1f} s")
    assert_nothing_left(slurm)


def test_a_two_nodes_one_rank_each(slurm, tmp_path):
    out, _ = inner(
        slurm, tmp_path, "salloc", "-p", "debug", "-N2", "-n2", "-c1",
        extra=["--nodes", "2", "--profile", str(PROFILES / "ci.toml"), "--epochs", "1"],
    )  # fmt: skip
    assert_trained_as_one_world(out)
    assert sorted(r["node"] for r in out["ranks"]) == ["n1", "n2"]
    assert "--nodes=2" in out["plan"]["srun"] and "--ntasks-per-node=1" in out["plan"]["srun"]
    assert_nothing_left(slurm)


def test_b_engines_submitted_from_the_login_node_wait_in_the_queue_then_train(
    slurm, tmp_path, monkeypatch, capsys
):
    from hpclab import Lab, RunConfig

    for key, value in slurm.env.items():
        if key.startswith("SLURM_CONF"):
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    held = tmp_path / "held.toml"
    held.write_text(
        (PROFILES / "ci-login.toml")
        .read_text()
        .replace('time = "00:10:00"', 'time = "00:10:00"\nextra_sbatch = ["--begin=now+6"]')
    )
    with Lab(workers=2, profile=str(held), runs_dir=tmp_path / "runs", start_timeout=60) as lab:
        said = capsys.readouterr().out
        assert "PENDING (BeginTime)" in said and "RUNNING" in said, said
        assert lab.launcher == "sbatch" and lab.startup_phases["queue_s"] >= 3
        job = lab._engines.job_id
        script = Path(lab.plan.batch_file).read_text()
        assert "--mpi=pmi2" in script and "#SBATCH --begin=now+6" in script
        run = lab.run(RunConfig(epochs=1, num_samples=4000))
        run.wait()
        assert run.status == "finished" and len(set(run.summary["weights_digest"])) == 1
        assert {r["slurm_job"] for r in lab.ranks} == {job}
    t0 = time.monotonic()
    while job in slurm.jobs() and time.monotonic() - t0 < 15:
        time.sleep(0.5)
    assert job not in slurm.jobs()
    assert_nothing_left(slurm)


def test_b_a_client_killed_while_its_job_is_pending_leaves_no_job_and_no_process(slurm, tmp_path):
    """The client (a kernel restarted, a closed laptop's OOM kill) dies with SIGKILL while its
    engines' job waits in the queue: the reaper, started before the controller, cancels the job
    by name and ends the controller, so nothing idles until the walltime."""
    import client_process

    held = tmp_path / "held.toml"
    held.write_text(
        (PROFILES / "ci-login.toml")
        .read_text()
        .replace('time = "00:10:00"', 'time = "00:10:00"\nextra_sbatch = ["--begin=now+600"]')
        .replace("queue_timeout_s = 60", "queue_timeout_s = 600")
    )
    code = (
        "from hpclab import Lab\nprint('START', flush=True)\n"
        f"Lab(workers=2, profile={str(held)!r}, runs_dir={str(tmp_path / 'runs')!r})\n"
    )
    proc = client_process.start(code, tmp_path, env=slurm.env)
    client_process.read_line(proc, "START", timeout=120)
    deadline = time.monotonic() + 120
    while not slurm.jobs() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # until the engines' job is in the queue
    jobs = slurm.jobs()
    assert jobs, proc.stderr.read() if proc.poll() is not None else "no job after 120 s"
    state = slurm.run(["squeue", "-h", "-o", "%T", "-j", jobs[0]], timeout=10).stdout.strip()
    assert state == "PENDING", state
    proc.kill()  # SIGKILL: no atexit hook, no handler runs
    proc.wait()
    t0 = time.monotonic()
    while slurm.jobs() and time.monotonic() - t0 < 20:
        time.sleep(0.2)
    print(
        f"\nthe pending job {jobs[0]} left the queue {time.monotonic() - t0:.1f} s after the kill"
    )
    assert not slurm.jobs(), f"the killed client's job {jobs} is still queued 20 s later"
    assert_nothing_left(slurm)
    while time.monotonic() - t0 < 30:  # the reaper itself ends once its lab is gone
        lab = [cmd for _, cmd in slurm.processes() if "reaper.py" in cmd or "ipyparallel" in cmd]
        if not lab:
            break
        time.sleep(0.2)
    assert not lab, lab


def test_c_headless_batch_job_runs_once_and_scancel_term_keeps_a_stopped_record(slurm, tmp_path):
    runs = tmp_path / "runs"

    def script(epochs):
        path = tmp_path / f"job-{epochs}.sh"
        path.write_text(
            "#!/bin/bash\n#SBATCH -p debug -n2 -c1\n#SBATCH --output=" + str(tmp_path / "%j.out")
            + f"\nexec {PY} -m hpclab.tools.cli run --json --no-progress --workers 2 "
            f"--num-samples 4000 --epochs {epochs} --runs-dir {runs}\n"
        )  # fmt: skip
        return path

    done = slurm.run(
        ["sbatch", "--wait", "--parsable", script(1)], timeout=240, cwd=HERE.parents[1]
    )
    job = done.stdout.strip().split(";")[0]
    log = (tmp_path / f"{job}.out").read_text()
    assert done.returncode == 0, log
    summary = json.loads(next(ln for ln in log.splitlines() if ln.startswith("{")))
    assert summary["status"] == "finished" and summary["world_size"] == 2

    long = slurm.run(["sbatch", "--parsable", script(200)], cwd=HERE.parents[1])
    job = long.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while len(list(runs.glob("*/metrics.jsonl"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)  # the second run is training
    assert slurm.run(["scancel", "--signal=TERM", "--batch", job]).returncode == 0
    while job in slurm.jobs() and time.monotonic() < deadline + 60:
        time.sleep(0.5)
    log = (tmp_path / f"{job}.out").read_text()
    assert "SIGTERM received" in log, log
    stopped = json.loads(next(ln for ln in log.splitlines() if ln.startswith("{")))
    assert stopped["status"] == "stopped"
    record = json.loads((Path(stopped["path"]) / "summary.json").read_text())
    assert record["status"] == "stopped"
    # a TERM to the batch shell alone leaves the job RUNNING: Slurm names no cause, nor do we
    assert record["stop_reason"] == "terminated", record
    assert_nothing_left(slurm)


def test_doctor_checks_a_profile_on_the_real_cluster(slurm):
    """`hpclab doctor --profile ci` inside an allocation: plugin offered, folders, and a real
    2-rank allreduce through the profile's srun plan."""
    env = {**slurm.env, "HPCLAB_PROFILE_PATH": str(PROFILES)}
    r = slurm.run(
        ["salloc", "-p", "debug", "-N1", "-n2", "-c1",
         PY, "-m", "hpclab.tools.cli", "doctor", "--profile", "ci"],
        env=env, timeout=180, cwd=HERE.parents[1],
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pmi2" in r.stdout and "allreduce" in r.stdout and "FAILED" not in r.stdout
    assert_nothing_left(slurm)

"""A job that resumes itself on the real test Slurm (issue 34): the script `hpclab profiles ci
--job-script -- run ... --checkpoint-every N` writes; SIGUSR1 to its batch shell (what
`--signal=B:USR1@120` sends before the time limit) makes hpclab write a checkpoint and stop the
run; the script submits its follow-up job (afterany dependency), which resumes the run from that
checkpoint in the same folder and finishes it. Nothing is left behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_modes import PROFILES, assert_nothing_left

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(what: str, ok, timeout: float, slurm):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = ok()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f} s\n{slurm.log_tails()}")


def test_sigusr1_checkpoints_and_stops_and_the_follow_up_job_resumes(slurm, tmp_path):
    runs = tmp_path / "runs"
    env = {**slurm.env, "HPCLAB_PROFILE_PATH": str(PROFILES)}
    command = [
        "run", "--no-progress", "--num-samples", "8192", "--epochs", "5", "--seed", "4",
        "--checkpoint-every", "20", "--runs-dir", str(runs),
    ]  # fmt: skip
    made = subprocess.run(
        [sys.executable, "-m", "hpclab.tools.cli", "profiles", "ci", "--job-script", "--", *command],
        env=env, capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    script = tmp_path / "job.sh"
    script.write_text(made.stdout + "\n")
    first = slurm.run(["sbatch", "--parsable", script], cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    job = first.stdout.strip().split(";")[0]

    # the run's first checkpoint on disk, then the time-limit warning to the batch shell
    ckpt = _wait_for(
        "no checkpoint", lambda: list(runs.glob("*/checkpoints/ckpt-*.npz")), 150, slurm
    )
    run_dir = ckpt[0].parents[1]
    assert slurm.run(["scancel", "--signal=USR1", "--batch", job]).returncode == 0
    log = tmp_path / f"hpclab-{job}.out"
    said = _wait_for(
        "the first job did not submit its follow-up",
        lambda: "resumes it" in (log.read_text() if log.exists() else ""),
        90,
        slurm,
    )
    assert said
    text = log.read_text()
    assert "SIGUSR1 received" in text, text
    stopped = json.loads((tmp_path / f"hpclab-{job}.json").read_text())
    assert stopped["status"] == "stopped" and stopped["stop_reason"] == "walltime", stopped
    assert Path(stopped["path"]) == run_dir
    at = stopped["steps"]
    assert stopped["checkpoints"]["last"].endswith(f"ckpt-{at:09d}.npz")  # written at the stop

    follow = text.split("job ")[-1].split()[0]
    out = _wait_for(
        "the follow-up job did not finish the run",
        lambda: (
            (tmp_path / f"hpclab-{follow}.json").exists()
            and follow not in slurm.jobs()
            and json.loads((tmp_path / f"hpclab-{follow}.json").read_text() or "{}")
        ),
        240,
        slurm,
    )
    assert out["status"] == "finished", (tmp_path / f"hpclab-{follow}.out").read_text()
    assert Path(out["path"]) == run_dir and out["start_step"] == at
    assert out["resumed"][-1]["from_step"] == at
    assert out["resumed"][-1]["stop_reason"] == "walltime"
    assert "resumes it" not in (tmp_path / f"hpclab-{follow}.out").read_text()
    assert_nothing_left(slurm)

"""The job script that resumes itself (hpclab.tools.job_chain, `hpclab profiles NAME
--job-script`): which commands get it, and that bash parses it. The real thing, a SIGUSR1 under
the test Slurm and the follow-up job, is tests/slurm/test_resume_job.py."""

from __future__ import annotations

import subprocess

import pytest

from hpclab.cluster import profiles
from hpclab.tools import job_chain
from hpclab.tools.cli_profiles import job_script


@pytest.mark.parametrize(
    "argv, on",
    [
        (["run", "--checkpoint-every", "50"], True),
        (["run", "--checkpoint-minutes=30"], True),
        (["run", "--checkpoint-every", "0"], False),
        (["run", "--epochs", "5"], False),
    ],
)
def test_only_a_checkpointing_command_resumes_itself(argv, on):
    assert job_chain.checkpoints_on(argv) is on


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_the_script_forwards_the_warning_and_submits_its_follow_up(command):
    profile = profiles.load("slurm-allocation", {})
    argv = [command, "--checkpoint-every", "50", "--epochs", "5"]
    text = job_script(profile, 2, 1, argv, python="/opt/py/bin/python")
    assert "#SBATCH --signal=B:USR1@120" in text and "\nexec " not in text
    assert "trap 'warned=1; kill -USR1 $child 2>/dev/null' USR1" in text
    assert '--dependency=afterany:"$SLURM_JOB_ID"' in text and '"$0"' in text
    assert f"-lt {job_chain.MAX_FOLLOW_UPS} ]" in text
    assert ("HPCLAB_RESUME=$run" in text) is (command == "run")  # a sweep resumes by itself
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    plain = job_script(profile, 2, 1, [command, "--epochs", "5"], python="/opt/py/bin/python")
    assert "\nexec /opt/py/bin/python -m hpclab.tools.cli " in plain and "trap" not in plain

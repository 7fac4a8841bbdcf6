"""The few Slurm commands a lab runs: where a job is in the queue, find and cancel a step.

Every call is bounded (`timeout=`), returns plain values and never raises for "not found": a
job that left the queue is `None`, a missing command is reported by the caller's sentence.
"""

from __future__ import annotations

import logging
import shutil
import subprocess

log = logging.getLogger(__name__)
COMMAND_TIMEOUT_S = 20


def _run(args: list[str]) -> str | None:
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s did not answer: %r", args[0], exc)
        return None
    if done.returncode != 0:
        log.debug("%s exited %s: %s", " ".join(args), done.returncode, done.stderr.strip())
        return None
    return done.stdout


def job_state(job_id: str) -> tuple[str, str, str] | None:
    """(state, reason, node list) of a job, e.g. ("PENDING", "Priority", ""); None once it left
    the queue (or squeue is not there)."""
    out = _run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r|%N"])
    if not out or not out.strip():
        return None
    state, reason, nodes = (out.strip().splitlines()[0].split("|") + ["", ""])[:3]
    return state, reason, nodes


def steps_named(job_id: str, name: str) -> list[str]:
    """Ids ("123.4") of the job's steps called `name` (srun --job-name names the step)."""
    out = _run(["squeue", "--steps", "-h", "-j", str(job_id), "-o", "%i %j"]) or ""
    return [line.split()[0] for line in out.splitlines() if line.split()[1:] == [name]]


def cancel(target: str, signal: str | None = None) -> bool:
    """`scancel [--signal=SIG] target` (a job id or "job.step"); True if scancel accepted it."""
    args = ["scancel", *([f"--signal={signal}"] if signal else []), str(target)]
    return _run(args) is not None


__all__ = ["job_state", "steps_named", "cancel"]

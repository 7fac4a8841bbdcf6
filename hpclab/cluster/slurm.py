"""The few Slurm commands a lab runs: where a job is in the queue, find and cancel a step, the
site's ``MpiDefault``.

Every call is bounded (`timeout=`), returns plain values and never raises for "not found": a
job that left the queue is `None`, a missing command is reported by the caller's sentence. A
failed `squeue` (slurmctld busy or restarting: "Socket timed out", "Unable to contact slurm
controller") is not an answer: it is asked again, :data:`SQUEUE_ATTEMPTS` times
:data:`RETRY_S` apart, and if it still fails the job's state is ``UNKNOWN`` (the caller waits on,
within its own timeout), never "left the queue".
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time

log = logging.getLogger(__name__)
COMMAND_TIMEOUT_S = 20
SQUEUE_ATTEMPTS = 4
RETRY_S = 2.0
#: What squeue(1) says of a job id slurmctld no longer knows (it left the queue long ago).
GONE = "Invalid job id"


class _Failed(str):
    """A command's failure, as text (its stderr, or why it did not answer)."""


def _run(args: list[str]) -> str | _Failed | None:
    """stdout of a successful command; _Failed(why) if it failed; None if it is not there."""
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s did not answer: %r", args[0], exc)
        return _Failed(f"{args[0]} did not answer ({exc})")
    if done.returncode != 0:
        log.debug("%s exited %s: %s", " ".join(args), done.returncode, done.stderr.strip())
        return _Failed(done.stderr.strip() or f"{args[0]} exited {done.returncode}")
    return done.stdout


def _squeue(args: list[str]) -> str | _Failed | None:
    """squeue, asked again after a failure that is not "no such job" (a busy slurmctld)."""
    for attempt in range(SQUEUE_ATTEMPTS):
        out = _run(args)
        if not isinstance(out, _Failed) or GONE in out:
            return out
        if attempt + 1 < SQUEUE_ATTEMPTS:
            log.info("squeue failed (%s); asking again in %g s", out, RETRY_S)
            time.sleep(RETRY_S)
    log.warning("squeue failed %d times in a row: %s", SQUEUE_ATTEMPTS, out)
    return out


def job_state(job_id: str) -> tuple[str, str, str] | None:
    """(state, reason, node list) of a job, e.g. ("PENDING", "Priority", ""); None once it left
    the queue (or squeue is not there); ("UNKNOWN", why, "") while squeue keeps failing."""
    out = _squeue(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r|%N"])
    if isinstance(out, _Failed):
        return None if GONE in out else ("UNKNOWN", f"squeue failed: {out[-200:]}", "")
    if not out or not out.strip():
        return None
    state, reason, nodes = (out.strip().splitlines()[0].split("|") + ["", ""])[:3]
    return state, reason, nodes


def steps_named(job_id: str, name: str) -> list[str]:
    """Ids ("123.4") of the job's steps called `name` (srun --job-name names the step)."""
    out = _squeue(["squeue", "--steps", "-h", "-j", str(job_id), "-o", "%i %j"])
    out = "" if isinstance(out, _Failed) or out is None else out
    return [line.split()[0] for line in out.splitlines() if line.split()[1:] == [name]]


def cancel(target: str, signal: str | None = None) -> bool:
    """`scancel [--signal=SIG] target` (a job id or "job.step"); True if scancel accepted it."""
    args = ["scancel", *([f"--signal={signal}"] if signal else []), str(target)]
    out = _run(args)
    return out is not None and not isinstance(out, _Failed)


def config_value(text: str, key: str) -> str:
    """The value of `key` in ``scontrol show config`` output (``MpiDefault = pmix_v4``), or ""."""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.strip()
    return ""


def mpi_default() -> str:
    """The site's ``MpiDefault`` (slurm.conf(5)) from ``scontrol show config``; "" if unknown."""
    out = _run(["scontrol", "show", "config"])
    return "" if out is None or isinstance(out, _Failed) else config_value(out, "MpiDefault")


__all__ = ["job_state", "steps_named", "cancel", "config_value", "mpi_default"]

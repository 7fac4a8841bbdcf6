"""The signals that stop a command the way Ctrl-C does, and what each one meant.

A batch system ends jobs with signals: Slurm sends the job's batch shell SIGUSR1 the time the
job script asked before its time limit (``sbatch --signal=B:USR1@120``, which the scripts
``hpclab profile`` writes carry), and SIGTERM at the limit itself, on ``scancel`` and on a
preemption; a closed terminal sends SIGHUP. While a command runs each becomes
``KeyboardInterrupt`` (the run is stopped on every rank after the same step and recorded), and
:func:`last_reason` says which it was, so the record reads ``walltime``, ``preempted``,
``cancelled`` or ``terminated`` instead of only ``stopped``.

What SIGTERM meant is asked of Slurm when the command runs in a job (``SLURM_JOB_ID``): squeue
shows a job being ended as ``COMPLETING`` with its reason (``TimeLimit`` at the time limit;
Slurm docs, "Job Reason Codes"), or ``PREEMPTED``. When Slurm does not say, the record says
"terminated" and names the candidates rather than guess.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable

#: Signals that stop a command the way Ctrl-C does: a batch system's walltime warning
#: (sbatch --signal=B:USR1@120), scancel, a preemption and a job's end (TERM), a closed
#: terminal (HUP).
STOP_SIGNALS = ("SIGTERM", "SIGHUP", "SIGUSR1")

_LAST: list[str | None] = [None]


@contextlib.contextmanager
def signals_stop_like_ctrl_c(say: Callable[[str], None]):
    """While a command runs, turn STOP_SIGNALS into KeyboardInterrupt (so the run is stopped
    collectively and recorded, and the engines shut down); the previous handlers come back
    after."""
    _LAST[0] = None
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (an embedding application's choice)
        return

    def handler(signum, frame):
        _LAST[0] = signal.Signals(signum).name
        say(f"\nhpclab: {_LAST[0]} received; stopping as for Ctrl-C.")
        raise KeyboardInterrupt

    before = {name: signal.signal(getattr(signal, name), handler) for name in STOP_SIGNALS}
    try:
        yield
    finally:
        for name, previous in before.items():
            signal.signal(getattr(signal, name), previous)


def last_reason(job_state: Callable[[str], tuple | None] | None = None) -> tuple[str, str]:
    """(reason, sentence) for the stop the last signal (or Ctrl-C) asked for. ``job_state``
    answers for a Slurm job id (default: :func:`hpclab.cluster.slurm.job_state`)."""
    name = _LAST[0]
    if name is None:
        return "interrupted", "interrupted (Ctrl-C)"
    if name == "SIGUSR1":
        return "walltime", (
            "SIGUSR1: the batch system's warning that the job's time limit is near "
            "(sbatch --signal=B:USR1@...)"
        )
    if name == "SIGHUP":
        return "hangup", "SIGHUP: the terminal closed"
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        if job_state is None:
            from hpclab.cluster.slurm import job_state
        state, why = (job_state(job) or ("", ""))[:2]
        if why == "TimeLimit" or state == "TIMEOUT":
            return "walltime", f"SIGTERM at job {job}'s time limit (squeue: {state}, {why})"
        if "PREEMPT" in state.upper() or "preempt" in why.lower():
            return "preempted", f"SIGTERM: job {job} was preempted (squeue: {state}, {why})"
        if state == "CANCELLED":
            return "cancelled", f"SIGTERM: job {job} was cancelled (scancel)"
    return "terminated", (
        "SIGTERM: scancel, a preemption, the job's time limit or the node's shutdown (the "
        "batch system did not say which)"
    )


__all__ = ["STOP_SIGNALS", "signals_stop_like_ctrl_c", "last_reason"]

"""What a stopping signal meant (hpclab/tools/stop_signals.py), with Slurm's answer given as
squeue gives it: the record of a stopped run says walltime, preempted, cancelled or terminated.
The signals themselves are sent for real in tests/test_cli.py (SIGTERM to `hpclab run`),
tests/slurm/test_resume_job.py (SIGUSR1 to a batch job's shell) and tests/slurm/test_modes.py
(scancel to a batch job)."""

import os
import signal

import pytest

from hpclab.tools import stop_signals


def _after(signame, monkeypatch, job=None):
    """The reason after `signame` arrived while a command ran (a real signal to this process)."""
    if job:
        monkeypatch.setenv("SLURM_JOB_ID", job)
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    said = []
    with pytest.raises(KeyboardInterrupt), stop_signals.signals_stop_like_ctrl_c(said.append):
        os.kill(os.getpid(), getattr(signal, signame))
        signal.sigtimedwait([], 5)  # (the handler raises before this returns)
    assert said == [f"\nhpclab: {signame} received; stopping as for Ctrl-C."]


@pytest.mark.parametrize(
    "squeue,reason",
    [
        (("COMPLETING", "TimeLimit", "n1"), "walltime"),
        (("PREEMPTED", "None", "n1"), "preempted"),
        (("CANCELLED", "None", "n1"), "cancelled"),
        (("COMPLETING", "None", "n1"), "terminated"),
        (None, "terminated"),  # the job left the queue, or squeue is not there
    ],
)
def test_sigterm_in_a_job_asks_slurm_what_it_meant(squeue, reason, monkeypatch):
    _after("SIGTERM", monkeypatch, job="42")
    asked = []
    got, sentence = stop_signals.last_reason(lambda job: asked.append(job) or squeue)
    assert (got, asked) == (reason, ["42"])
    assert sentence.startswith("SIGTERM")


def test_usr1_is_the_walltime_warning_and_hup_a_closed_terminal(monkeypatch):
    _after("SIGUSR1", monkeypatch)
    assert stop_signals.last_reason()[0] == "walltime"
    _after("SIGHUP", monkeypatch)
    assert stop_signals.last_reason()[0] == "hangup"
    _after("SIGTERM", monkeypatch)  # no job: nobody to ask
    assert stop_signals.last_reason(lambda job: pytest.fail("asked"))[0] == "terminated"


def test_ctrl_c_is_an_interruption_and_handlers_come_back(monkeypatch):
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals.signals_stop_like_ctrl_c(lambda s: None):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
    assert stop_signals.last_reason() == ("interrupted", "interrupted (Ctrl-C)")

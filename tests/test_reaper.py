"""hpclab.cluster.reaper on real processes (sleepers standing in for a client, a controller,
engines, a fake `scancel` standing in for Slurm's), and its process identity, which a clock step
cannot change (a clock step itself cannot be made safely here: psutil's clock is moved instead)."""

import os
import stat
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from hpclab.cluster import reaper


def _sleeper(*extra) -> psutil.Process:
    return psutil.Process(subprocess.Popen(["sleep", "60", *extra]).pid)


@pytest.mark.slow  # (the reaper's real SIGTERM grace: ~7 s)
def test_a_dead_client_takes_its_processes_with_it_even_one_that_ignores_sigterm():
    client = _sleeper()
    stubborn = psutil.Process(  # ignores SIGTERM, as a hung rank effectively does
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import signal, time; signal.signal(signal.SIGTERM, "
                "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)",
            ],
            stdout=subprocess.PIPE,
            text=True,
        ).pid  # fmt: skip
    )
    time.sleep(0.5)  # let it install the handler
    lab = [_sleeper(), stubborn]
    proc = subprocess.Popen(
        [sys.executable, reaper.__file__, reaper.spec(client), *map(reaper.spec, lab)],
        start_new_session=True,
    )
    time.sleep(1.5)
    assert proc.poll() is None and all(p.is_running() for p in lab)  # client alive: waits
    client.kill()
    client.wait()
    t0 = time.perf_counter()
    assert proc.wait(timeout=reaper.BOUND_S + 2) == 0
    _, alive = psutil.wait_procs(lab, timeout=1)
    assert not alive and time.perf_counter() - t0 <= reaper.BOUND_S


def test_it_leaves_when_the_lab_stopped_by_itself_and_never_touches_a_reused_pid():
    client, engine = _sleeper(), _sleeper()
    proc = subprocess.Popen(
        [sys.executable, reaper.__file__, reaper.spec(client), reaper.spec(engine)],
        start_new_session=True,
    )
    engine.kill()
    engine.wait()
    assert proc.wait(timeout=5) == 0  # nothing left to watch
    assert client.is_running()  # and the client was left alone
    # a spec whose start time does not match names no process (pid reuse)
    pid, ticks = reaper.spec(client).split(":")
    assert reaper._same(f"{pid}:{int(ticks) + 1}") is None
    assert reaper._same(reaper.spec(client)).pid == client.pid
    client.kill()


def test_identity_is_the_boot_relative_start_and_survives_a_clock_step(monkeypatch):
    """psutil's create_time() is boot time (from the wall clock) + start ticks: a clock step of
    an hour moves it by an hour. The spec reads the ticks themselves (proc(5), field 22)."""
    me = psutil.Process()
    token = reaper.spec(me)
    assert token == f"{me.pid}:{reaper.start_ticks(me.pid)}"
    clock_ticks = os.sysconf("SC_CLK_TCK")
    assert abs(psutil.boot_time() + reaper.start_ticks(me.pid) / clock_ticks - me.create_time()) < 1
    # what psutil reports after the wall clock stepped forward an hour (NTP, a resumed VM)
    stepped = me.create_time() + 3600.0
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: stepped)
    assert reaper._same(token).pid == me.pid  # still the same process


def test_start_ticks_reads_field_22_after_a_command_name_with_spaces_and_parentheses(tmp_path):
    odd = tmp_path / "a) b (c"
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "30"])
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            assert ") b (c)" in f.read()
        assert reaper.start_ticks(proc.pid) == reaper.start_ticks(proc.pid) > 0
        assert reaper._same(reaper.spec(proc.pid)).pid == proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert reaper.start_ticks(proc.pid) is None and reaper._same(reaper.spec(os.getpid()))


def _fake_scancel(tmp_path) -> tuple[dict, object]:
    """A `scancel` on PATH that writes its arguments to a file (no Slurm here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scancel.log"
    fake = bin_dir / "scancel"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


@pytest.mark.slow  # (the reaper's real SIGTERM grace: ~7 s)
def test_it_owns_a_lab_from_before_its_first_process_and_cancels_its_pending_job(tmp_path):
    """Started with only a lab id, the reaper finds the lab's processes by IPP_CLUSTER_ID in
    their environment, as they appear, with their descendants; the client's death ends them
    and cancels the engines' Slurm job by name (pending or not)."""
    env, log = _fake_scancel(tmp_path)
    lab_id = uuid.uuid4().hex
    client = _sleeper()
    proc = subprocess.Popen(
        [sys.executable, reaper.__file__, reaper.spec(client), "--lab", lab_id,
         "--slurm-name", f"hpclab-{lab_id}"],
        env=env,
        start_new_session=True,
    )  # fmt: skip
    time.sleep(reaper.POLL_S + 0.5)  # nothing of the lab yet: it waits
    assert proc.poll() is None
    # the lab's first process, and one it starts without the variable (a proxy, an engine)
    parent = subprocess.Popen(
        ["sh", "-c", "env -u IPP_CLUSTER_ID sleep 60 & wait"],
        env={**os.environ, "IPP_CLUSTER_ID": lab_id},
    )
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, "IPP_CLUSTER_ID": "another"})
    deadline = time.monotonic() + 5
    while len(psutil.Process(parent.pid).children()) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    child = psutil.Process(parent.pid).children()[0]
    assert set(reaper.lab_processes(lab_id)) == {reaper.spec(parent.pid), reaper.spec(child)}
    client.kill()
    client.wait()
    assert proc.wait(timeout=reaper.BOUND_S + 2) == 0
    _, alive = psutil.wait_procs([psutil.Process(parent.pid), child], timeout=2)
    assert not alive
    assert other.poll() is None  # another lab's process is not this lab's
    other.kill()
    assert f"--name=hpclab-{lab_id}" in log.read_text()


def test_a_transient_squeue_failure_is_asked_again_and_a_gone_job_is_not(tmp_path, monkeypatch):
    """A fake `squeue` fails twice as a busy slurmctld does, then answers: the job runs. One
    that says the job id is invalid is answered at once: the job left the queue."""
    from hpclab.cluster import slurm

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fake = bin_dir / "squeue"
    fake.write_text(
        "#!/bin/sh\n"
        f"echo x >> {calls}\n"
        f"n=$(wc -l < {calls})\n"
        'if [ "$SQUEUE_SAYS" = gone ]; then\n'
        '  echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; fi\n'
        'if [ "$n" -le 2 ]; then\n'
        '  echo "squeue: error: Socket timed out on send/recv operation" >&2; exit 1; fi\n'
        'echo "RUNNING|None|node1"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "RETRY_S", 0.05)
    assert slurm.job_state("7") == ("RUNNING", "None", "node1")
    assert len(calls.read_text().split()) == 3
    monkeypatch.setenv("SQUEUE_SAYS", "gone")
    calls.unlink()
    assert slurm.job_state("7") is None and len(calls.read_text().split()) == 1
    monkeypatch.delenv("SQUEUE_SAYS")
    calls.write_text("")
    monkeypatch.setattr(slurm, "SQUEUE_ATTEMPTS", 2)  # failing every time: UNKNOWN, not gone
    assert slurm.job_state("7")[0] == "UNKNOWN"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="/proc: Linux")
def test_a_lab_scan_costs_milliseconds():
    reaper.lab_processes("warm-up")
    t0 = time.perf_counter()
    reaper.lab_processes(uuid.uuid4().hex)
    assert time.perf_counter() - t0 < 0.5

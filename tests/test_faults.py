"""Faults at the edges of a lab's life, with real processes (issue 32, items 3-5).

- A client killed (SIGKILL) 0.5, 2 and 5 s into `Lab()` leaves no process of the lab: the reaper
  (hpclab/cluster/reaper.py) owns the lab from before its first process.
- Ctrl-C (SIGINT) 1 and 4 s into `Lab()` raises KeyboardInterrupt in the client, and by then
  nothing of the lab runs.
- A run whose compiled calls take ~6 s, stopped just as a call begins, ends 'stopped' and keeps
  its engines (the stop grace scales with the measured call length, cluster/run.py).
- Every listening socket of a local lab binds loopback (cluster/launch.py).

A lab's processes are found by a mark in the client's environment, which every process it
starts inherits (controller, mpiexec, Hydra's proxy, engines, the reaper), so none can hide from
the check, whatever its command line.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import client_process
import psutil
import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.own_lab]

ROOT = Path(__file__).resolve().parents[1]
MARK = "HPCLAB_FAULT_TEST"

CLIENT = """
import signal, sys
# Ctrl-C reaches Python as in a terminal or a kernel, even when this test runs as a background
# job (a shell without job control starts those with SIGINT ignored, and Python then keeps it so)
signal.signal(signal.SIGINT, signal.default_int_handler)
from hpclab import Lab
print("START", flush=True)
try:
    lab = Lab(workers=2, verbose=False)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    sys.stdin.readline()  # stays alive while the test looks for what the lab left
    sys.exit(0)
print("STARTED", flush=True)
sys.stdin.readline()
lab.stop()
"""


def _client(tmp_path, mark: str) -> subprocess.Popen:
    return client_process.start(CLIENT, tmp_path, {MARK: mark})


_line = client_process.read_line


def _marked(mark: str, but: tuple[int, ...] = ()) -> list[str]:
    """'pid name cmdline' of every live process whose environment carries the mark."""
    needle = f"\0{MARK}={mark}\0".encode()
    found = []
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        if p.pid in but or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":
                    found.append(f"{p.pid} {p.info['name']} {' '.join(p.info['cmdline'] or [])}")
        except OSError:
            continue
    return found


def _launched(cluster_id: str) -> list[int]:
    """Pids of the processes ipyparallel launched for a lab (it sets IPP_CLUSTER_ID for each)."""
    needle = f"\0IPP_CLUSTER_ID={cluster_id}\0".encode()
    found = []
    for p in psutil.process_iter():
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":
                    found.append(p.pid)
        except OSError:
            continue
    return found


def _left_after(mark: str, seconds: float, but: tuple[int, ...] = ()) -> tuple[list[str], float]:
    """What still carries the mark once none does or `seconds` passed; and how long it took."""
    t0 = time.monotonic()
    left = _marked(mark, but)
    while left and time.monotonic() - t0 < seconds:
        time.sleep(0.2)
        left = _marked(mark, but)
    return left, time.monotonic() - t0


@pytest.mark.parametrize("after_s", [0.5, 2.0, 5.0])
def test_a_client_killed_while_its_lab_starts_leaves_no_process(tmp_path, after_s):
    mark = uuid.uuid4().hex
    proc = _client(tmp_path, mark)
    _line(proc, ("START",), timeout=120)
    time.sleep(after_s)  # the fault's moment: this far into Lab()
    running = _marked(mark, but=(proc.pid,))
    proc.kill()  # SIGKILL: no atexit hook, no handler runs
    proc.wait()
    left, took = _left_after(mark, 15.0)
    print(
        f"\nkilled {after_s:g} s into Lab() with {len(running)} lab process(es) running; "
        f"{'all gone' if not left else f'{len(left)} left'} after {took:.1f} s"
    )
    assert not left, "the killed client's lab outlived it by 15 s:\n" + "\n".join(left)


@pytest.mark.parametrize("moment", [1.0, 4.0, "initialising"])
def test_ctrl_c_during_lab_start_raises_keyboardinterrupt_and_leaves_nothing(tmp_path, moment):
    """1 s (the controller starts), 4 s (engines start) and while the engines import TensorFlow
    and initialise Horovod (Lab writes its probe file just before, and removes it after)."""
    mark = uuid.uuid4().hex
    proc = _client(tmp_path, mark)
    try:
        _line(proc, ("START",), timeout=120)
        if moment == "initialising":
            deadline = time.monotonic() + 120
            while not list((tmp_path / "runs").glob(".probe-*")) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # inside the engines' imports
        else:
            time.sleep(moment)  # the fault's moment: this far into Lab()
        running = _marked(mark, but=(proc.pid,))
        os.kill(proc.pid, signal.SIGINT)
        said = _line(proc, ("INTERRUPTED", "STARTED"), timeout=120)
        assert said == "INTERRUPTED", "the lab started before the interrupt: the test's timing"
        # Lab() has returned by raising: what it started must be gone already (a moment for
        # processes it signalled to exit), not only once the client exits
        left, took = _left_after(mark, 5.0, but=(proc.pid,))
        print(
            f"\nCtrl-C at {moment} (s) into Lab() with {len(running)} lab process(es) running; "
            f"{'all gone' if not left else f'{len(left)} left'} {took:.1f} s after Lab() raised"
        )
        assert not left, "Lab() raised KeyboardInterrupt but left:\n" + "\n".join(left)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stop_during_long_calls_ends_stopped_and_keeps_the_engines(tmp_path):
    """Calls of 8 steps of which rank 1 takes 0.8 s each: ~6.4 s a call. Stopped just as a call
    begins (a row just arrived), the ranks leave the loop after that call and the next one:
    ~13 s, past the fixed 10 s grace this lab once had. Then the lab is stopped under a run whose
    ranks cannot stop within Lab.stop's 5 s: that run reads 'stopped', saying so."""
    from hpclab import Lab, RunConfig

    cfg = RunConfig(
        num_samples=8000,
        epochs=20,
        eval_samples=0,
        steps_per_call=8,
        straggler_rank=1,
        straggler_ms=800,
    )
    with Lab(workers=2, runs_dir=tmp_path, verbose=False) as lab:
        run = lab.run(cfg)
        deadline = time.monotonic() + 180
        while len(run.history) < 2 and not run.done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(run.history) >= 2, (run.status, run.error)
        t0 = time.monotonic()
        run.stop(timeout=120)
        took = time.monotonic() - t0
        summary = run.wait(timeout=60, check=False)
        print(
            f"\nstopped {took:.1f} s after the request (grace "
            f"{getattr(run, 'stop_grace_s', 10.0):.1f} s, rows "
            f"{run.history['time_s'].round(1).tolist()})"
        )
        assert run.status == "stopped", run.error
        assert summary["status"] == "stopped"
        assert lab.healthy, lab.lost
        # the lab stopped under a run that could not stop in time: stopped, not "rank … died"
        setting_up = lab.run(cfg)
        lab.stop()
    assert setting_up.wait(timeout=10, check=False)["status"] == "stopped", setting_up.error
    assert "the lab was stopped while the ranks were" in setting_up.error  # (setting up or
    # in their first long calls: Lab.stop waits 5 s for a run's stop, less than two calls)


def test_every_listening_socket_of_a_local_lab_binds_loopback(tmp_path):
    """The controller's and every engine's sockets, the MPI layer's included, bind loopback.
    Hydra's control port (mpiexec's, which its proxy and the engines inherit) cannot: Hydra
    binds it to every interface whatever its options (HYDU_sock_listen in MPICH's
    src/pm/hydra/lib/utils/sock.c; `-iface`/`-localhost` only change the address it
    advertises), so that part is an expected failure, named, until MPICH offers a setting."""
    from hpclab import Lab

    with Lab(workers=2, runs_dir=tmp_path, verbose=False) as lab:
        assert lab.plan.mode == "mpiexec"
        processes = {str(pid): psutil.Process(pid) for pid in _launched(lab.plan.cluster_id)}
        engines = lab._engines
        launcher = engines._engine_set.process.pid
        for pid in [engines.cluster.controller.process.pid, launcher] + [
            r["pid"] for r in lab.ranks
        ]:
            processes[str(pid)] = psutil.Process(pid)
            processes.update({str(c.pid): c for c in psutil.Process(pid).children(True)})
        listening = {}
        for p in processes.values():
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    listening[(c.laddr.ip, c.laddr.port, p.pid)] = p.name()
        hydra = {
            c.laddr.port
            for c in psutil.Process(launcher).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
    beyond = sorted({f"{ip}:{port} {who}" for (ip, port, _), who in listening.items()
                     if not ipaddress.ip_address(ip).is_loopback})  # fmt: skip
    print(f"\n{len(processes)} lab processes, {len(listening)} listening sockets; Hydra's "
          f"control port {sorted(hydra)}; beyond loopback: {beyond}")  # fmt: skip
    assert listening, "no listening socket found: the check looks at the wrong processes"

    def open_to_all(ports) -> dict:
        return {
            key: who
            for key, who in listening.items()
            if key[1] in ports and not ipaddress.ip_address(key[0]).is_loopback
        }

    others = {port for _, port, _ in listening} - hydra
    assert not open_to_all(others), f"listening beyond loopback: {open_to_all(others)}"
    if open_to_all(hydra):
        pytest.xfail(f"Hydra's control port binds every interface: {open_to_all(hydra)}")


def test_a_rank_blocked_reading_its_data_is_named_with_its_stage(tmp_path):
    """Rank 0's data file is a FIFO nobody writes: its read never returns, while its heartbeat
    thread beats on and rank 1 waits for it in a collective. The watchdog names rank 0 and what
    it was doing once the stage outlasts EngineSettings.stall_s (4 s here), rank 1 as waiting,
    and the run ends 'failed' with the engines cleaned up (a lab that stayed 'running' for ever
    is what this replaces: such a run was still running after 120 s)."""
    from hpclab import EngineSettings, Lab, RunConfig
    from hpclab.rank.data import mnist1d_cache_path

    cfg = RunConfig(epochs=1)
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(mnist1d_cache_path(cfg.num_samples, cfg.seed, data))
    settings = EngineSettings(stall_s=4)
    with Lab(
        workers=2,
        runs_dir=tmp_path / "runs",
        data_dir=data,
        engine_settings=settings,
        verbose=False,
    ) as lab:
        run = lab.run(cfg)
        t0 = time.monotonic()
        summary = run.wait(timeout=90, check=False)
        took = time.monotonic() - t0
        pids = [r["pid"] for r in lab.ranks]
    print(f"\nnamed after {took:.1f} s: {run.error}")
    assert run.status == "failed" and summary["status"] == "failed"
    assert "rank 0 (pid" in run.error and "has been reading its data for" in run.error, run.error
    assert "rank(s) 1 wait for it in a collective" in run.error, run.error
    assert not any(psutil.pid_exists(p) for p in pids), pids

"""hpclab.cluster.reaper on real processes (sleepers standing in for a client, a controller, engines)."""

import subprocess
import sys
import time

import psutil

from hpclab.cluster import reaper


def _sleeper(*extra) -> psutil.Process:
    return psutil.Process(subprocess.Popen(["sleep", "60", *extra]).pid)


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
    assert reaper._same(f"{client.pid}:{client.create_time() + 50:.3f}") is None
    assert reaper._same(reaper.spec(client)).pid == client.pid
    client.kill()

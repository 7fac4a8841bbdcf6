"""Thirty students on one node: an idle lab costs next to nothing (hpclab/cluster/idle.py).

An idle engine spins: Horovod's background thread negotiates every cycle and MPICH busy-polls
while it waits for the other rank (an idle 2-engine lab: 0.36-0.55 of a core per engine over
5 s, benchmarks/README.md). With ``idle_stop_s`` the lab stops its engines after that many idle
seconds and the next run starts them again. The lab's memory per engine is recorded in
``lab.ranks`` from each engine process itself.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

from hpclab.cluster.lab import Lab
from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError

WINDOW_S = 5.0
MAX_CORE_PER_ENGINE = 0.05


def lab_cpu_seconds() -> tuple[float, int]:
    """CPU seconds (user + system) used so far by every process this test process started (the
    lab's controller, launcher and engines, with their children), and how many there are."""
    total, count = 0.0, 0
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
        count += 1
    return total, count


def cores_over_window(seconds: float = WINDOW_S) -> float:
    """Cores the lab's processes used over a measured window (the window is the measurement)."""
    c0, _ = lab_cpu_seconds()
    t0 = time.perf_counter()
    time.sleep(seconds)
    c1, _ = lab_cpu_seconds()
    return (c1 - c0) / (time.perf_counter() - t0)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.own_lab
@pytest.mark.timing
def test_an_idle_lab_stops_its_engines_and_the_next_run_starts_them(tmp_path):
    """After one tiny run the lab idles; once `idle_stop_s` has passed (the `stopped` event),
    everything the lab started uses at most 0.05 of a core per engine over 5 s.

    Margin: the bound is 0.5 CPU-seconds for 2 engines over the window. The engines kept running
    used 0.36-0.55 of a core each (3.6-5.5 CPU-seconds: 7-11 times the bound); stopped, what is
    left is this test's own client, outside the measured tree. The next run then starts fresh
    engines and trains, and each rank reports its resident memory (more than 100 MiB: TensorFlow
    alone is more)."""
    cfg = RunConfig(num_samples=2000, epochs=1)
    lab = Lab(workers=2, runs_dir=tmp_path, idle_stop_s=2, verbose=False)
    try:
        for rank in lab.ranks:
            assert rank["rss_mib"] > 100 and rank["peak_rss_mib"] >= rank["rss_mib"]
            # the engine's own figure, read again from outside: it only grew since
            outside = psutil.Process(rank["pid"]).memory_info().rss / 2**20
            assert outside >= 0.9 * rank["rss_mib"]
        first_pids = [rank["pid"] for rank in lab.ranks]
        assert lab.run(cfg).wait()["status"] == "finished"

        assert lab._idle.stopped.wait(timeout=60), "the idle engines were not stopped"
        assert not lab.healthy and not any(psutil.pid_exists(pid) for pid in first_pids)
        cores = cores_over_window()
        assert cores / lab.workers <= MAX_CORE_PER_ENGINE, (
            f"the idle lab used {cores:.3f} cores ({cores / lab.workers:.3f} per engine)"
        )

        assert lab.run(cfg).wait()["status"] == "finished"  # started again, and trains
        assert lab.healthy and not lab._idle.stopped.is_set()
        assert [rank["pid"] for rank in lab.ranks] != first_pids
        assert all(rank["rss_mib"] > 100 for rank in lab.ranks)
    finally:
        lab.stop()


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), True, "60"])
def test_a_bad_idle_stop_is_refused_before_any_engine_starts(value):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"Lab.idle_stop_s.*idle_stop_s="):
        Lab(workers=2, idle_stop_s=value)
    assert time.perf_counter() - t0 < 1

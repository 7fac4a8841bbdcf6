"""The client's reading of rank heartbeats (hpclab.cluster.watchdog) and the rank's heartbeat thread
(hpclab.rank.heartbeat), on a clock the test moves; real processes for the process states."""

import os
import platform
import signal
import subprocess
import sys
import threading

import pytest

from hpclab.cluster.watchdog import Watchdog, process_state
from hpclab.rank.heartbeat import KEY, Heartbeat, Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


RANKS = [{"rank": r, "pid": 1000 + r, "host": "node-a"} for r in range(3)]


def test_the_rank_whose_counter_stands_still_is_named():
    clock = Clock()
    dog = Watchdog(RANKS, hang_s=8, clock=clock)
    for t in range(12):
        clock.now = 100.0 + t
        dog.observe(0, t)
        dog.observe(1, min(t, 3))  # rank 1 stops beating at t = 3
        dog.observe(2, t)
    assert dog.verdict() is None  # silent 8 s, not more: not yet
    clock.now = 111.5
    assert dog.silent() == {1: pytest.approx(8.5)}
    verdict = dog.verdict()
    assert verdict == "rank 1 (pid 1001 on node-a) stopped responding: no heartbeat for 8 s"
    assert dog.verdict(among=[0, 2]) is None  # rank 1's task returned: nothing expected of it


def test_the_clients_own_pause_is_not_held_against_the_ranks():
    """The client looks every 0.2 s; a 12 s gap between two looks was the client's pause (its
    process stopped, a cell holding the GIL). The ranks are judged on the time the client was
    there to hear them: silent 1 s before the pause and 1.5 s after, not 14.5 s. A rank that
    stays silent after the pause is named on the time since, as before."""
    clock = Clock()
    dog = Watchdog(RANKS[:2], hang_s=8, clock=clock)
    for _ in range(5):
        clock.now += 0.2
        assert dog.tick() == 0.0
        dog.observe(0, clock.now), dog.observe(1, clock.now)
    clock.now += 1.0
    assert dog.tick() == 0.0  # one slow look: not a pause
    clock.now += 12.0
    assert dog.tick() == pytest.approx(12.0) and dog.paused_s == pytest.approx(12.0)
    clock.now += 1.5
    assert dog.tick() == 0.0
    assert dog.silent(longer_than=0) == {0: pytest.approx(2.5), 1: pytest.approx(2.5)}
    assert dog.verdict() is None
    for _ in range(30):  # the queued beats arrive, and new ones; rank 1's do not
        clock.now += 0.2
        dog.tick()
        dog.observe(0, clock.now)
    assert dog.verdict() == "rank 1 (pid 1001 on node-a) stopped responding: no heartbeat for 9 s"


def test_every_rank_silent_blames_the_link_not_a_rank():
    clock = Clock()
    dog = Watchdog(RANKS[:2], hang_s=8, clock=clock)
    dog.observe(0, 1), dog.observe(1, 1)
    clock.now += 9.6
    assert dog.verdict(link="the ipyparallel controller (pid 7) exited") == (
        "no rank sent a heartbeat for 10 s: the ipyparallel controller (pid 7) exited"
    )
    assert "stopped reaching this client" in dog.verdict()
    # one rank alone (no peers to compare with) is named when silent
    solo = Watchdog(RANKS[:1], hang_s=8, clock=clock)
    clock.now += 9
    assert solo.verdict().startswith("rank 0 (pid 1000 on node-a) stopped responding")


def test_ranks_whose_last_beats_arrived_a_second_apart_are_silent_together():
    """The link broke for both; rank 0's last beat came 1.5 s before rank 1's. When rank 0
    crosses the limit, rank 1 is past half of it: the verdict blames the link, not rank 0."""
    clock = Clock()
    dog = Watchdog(RANKS[:2], hang_s=8, clock=clock)
    dog.observe(0, 1)
    clock.now += 1.5
    dog.observe(1, 1)
    clock.now += 6.7  # rank 0 silent 8.2 s, rank 1 6.7 s
    assert set(dog.silent()) == {0} and dog.all_silent([0, 1])
    assert dog.verdict(link="the controller exited").startswith("no rank sent a heartbeat")
    fresh = Watchdog(RANKS[:2], hang_s=8, clock=clock)  # a rank that beat 2 s ago is alive
    fresh.observe(0, 1)
    clock.now += 8.5
    fresh.observe(1, 2)
    clock.now += 2.0
    assert not fresh.all_silent([0, 1]) and fresh.verdict().startswith("rank 0 (pid 1000")


def test_the_start_counts_as_a_sign_of_life_and_repeats_are_not():
    clock = Clock()
    dog = Watchdog(RANKS[:2], hang_s=5, clock=clock)
    clock.now += 4
    dog.observe(0, None)  # nothing published yet
    dog.observe(1, 1)
    clock.now += 2  # rank 0: 6 s since the start; rank 1: 2 s since its beat
    assert set(dog.silent()) == {0}
    dog.observe(1, 1)  # the same counter again is not a beat
    clock.now += 4
    assert set(dog.silent()) == {0, 1} and dog.silent(longer_than=30) == {}


def test_process_state_of_a_stopped_process_on_this_host():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # past its start-up, whose file reads can show as uninterruptible I/O ("disk-sleep")
        assert child.stdout.readline().strip() == "ready"
        rank = {"rank": 1, "pid": child.pid, "host": platform.node()}
        assert process_state(rank) == ""  # running or sleeping: nothing to add
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(50):
            if process_state(rank):
                break
            threading.Event().wait(0.02)
        assert process_state(rank) == "its process is stopped (SIGSTOP or SIGTSTP)"
        assert process_state(dict(rank, host="elsewhere")) == ""  # not ours to look at
    finally:
        child.kill()
        child.wait()
    assert process_state(rank) == "its process has exited"


def test_heartbeat_thread_beats_until_the_block_ends():
    sent, beat = [], threading.Event()

    def send(data):
        sent.append(data)
        if len(sent) >= 3:
            beat.set()

    with Heartbeat(send, every_s=0.01):
        assert beat.wait(5)
    n = len(sent)
    threading.Event().wait(0.05)
    assert len(sent) == n and [d[KEY]["n"] for d in sent] == list(range(1, n + 1))
    assert {d[KEY]["stage"] for d in sent} == {"start"}


def test_each_beat_carries_the_stage_and_how_long_on_the_ranks_own_clock():
    progress, sent, beat = Progress(), [], threading.Event()

    def send(data):
        sent.append(data[KEY])
        if data[KEY]["stage"] == "evaluation":
            beat.set()

    with Heartbeat(send, every_s=0.01, progress=progress):
        progress.enter("training", 40)
        progress.call_took(0.2)
        with progress.during("evaluation", 40):
            assert beat.wait(5)
        assert (progress.stage, progress.step) == ("training", 40)
    last = next(d for d in reversed(sent) if d["stage"] == "evaluation")
    assert last["step"] == 40 and last["longest_call_s"] == 0.2 and last["for_s"] >= 0


def _beat(dog, rank, n, stage, for_s, **more):
    dog.observe(rank, {"n": n, "stage": stage, "for_s": for_s, "step": None, **more})


def test_a_rank_stuck_in_its_own_work_is_named_and_the_waiting_ranks_said_to_wait():
    dog = Watchdog(RANKS, hang_s=8, clock=Clock(), stall_s=60)
    _beat(dog, 0, 1, "data", 59.0)
    _beat(dog, 1, 1, "data_wait", 70.0)  # past its bound, but only waiting for rank 0
    _beat(dog, 2, 1, "data_wait", 30.0)
    # rank 1 is past its bound, but rank 0, whom it waits for, is still within its own (its
    # report may be a beat older): nobody is named yet
    assert dog.stuck() == {1: dog._progress[1]} and dog.stuck_verdict() is None
    _beat(dog, 0, 2, "data", 61.0)
    assert dog.stuck_verdict() == (
        "rank 0 (pid 1000 on node-a) has been reading its data for 61 s (bound 60 s); "
        "rank(s) 1, 2 wait for it in a collective"
    )  # rank 2 too, though not yet past its own bound
    assert dog.silent() == {}  # all three beat: life is not progress


def test_ranks_that_all_wait_in_a_collective_are_all_named():
    dog = Watchdog(RANKS, hang_s=8, clock=Clock(), stall_s=60)
    _beat(dog, 0, 1, "build", 61.0)
    _beat(dog, 1, 1, "data_wait", 70.0)
    _beat(dog, 2, 1, "data_wait", 30.0)  # waiting too, not yet past its bound: nobody works
    assert dog.stuck_verdict() == (
        "rank 0 (pid 1000 on node-a) has been building its model and receiving rank 0's "
        "weights (a collective) for 61 s (bound 60 s); rank 1 (pid 1001 on node-a) has been "
        "waiting in a collective for rank 0 to read and cache the data for 70 s (bound 60 s)"
    )


def test_the_bound_grows_for_a_first_compile_and_with_the_longest_call():
    dog = Watchdog(RANKS, hang_s=8, clock=Clock(), stall_s=60)
    _beat(dog, 0, 1, "compile", 299.0)
    _beat(dog, 1, 1, "generate", 299.0)
    _beat(dog, 2, 1, "training", 599.0, longest_call_s=60.0)  # 10x its longest call
    assert dog.stuck() == {}
    _beat(dog, 2, 2, "training", 601.0, longest_call_s=60.0)
    _beat(dog, 0, 2, "compile", 301.0)
    assert sorted(dog.stuck()) == [0, 2]
    assert dog.bound_s({"stage": "training", "longest_call_s": 0.1}) == 60

"""`Lab.apply(fn, *args, **kwargs)` (hpclab/cluster/lab.py): what the studies run on every rank.

The callables are the standard library's (an engine imports a function's module to run it, and
this test module is not importable there)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from hpclab.core.errors import LabError

pytestmark = pytest.mark.mpi


def test_results_come_back_in_rank_order_with_args_and_kwargs(lab):
    assert lab.apply(os.getpid) == [r["pid"] for r in lab.ranks]
    assert lab.apply(int, "ff", base=16) == [255] * lab.workers


def test_a_rank_that_raises_is_named_and_the_engines_stay(lab):
    with pytest.raises(LabError, match=r"int failed on the lab's ranks: rank 0 raised ValueError"):
        lab.apply(int, "not a number")
    assert lab.healthy and lab.lost is None
    assert lab.apply(int, "7") == [7] * lab.workers


def test_ranks_still_busy_at_the_timeout_are_ended_and_the_next_call_restarts(lab):
    t0 = time.monotonic()
    with pytest.raises(LabError, match=r"rank\(s\) \[0, 1\] still ran after 2 s; every rank"):
        lab.apply(time.sleep, 60, timeout=2)
    assert time.monotonic() - t0 < 30
    assert not lab.healthy and "still ran after 2 s" in lab.lost
    assert lab.apply(os.getpid) == [r["pid"] for r in lab.ranks]  # fresh engines
    assert lab.healthy


def test_a_rank_that_dies_ends_every_rank_like_a_lost_run(lab):
    victim = lab.ranks[1]["pid"]
    with pytest.raises(LabError, match="every rank was ended — call lab.restart()"):
        lab.apply(os.kill, victim, signal.SIGKILL)
    assert not lab.healthy and lab.lost

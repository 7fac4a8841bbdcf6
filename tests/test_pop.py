"""POP's efficiencies and the straggler's arithmetic (hpclab.core.pop): NumPy only."""

import math

import numpy as np
import pytest

from hpclab.core.pop import (
    PARTS,
    STEP_PARTS,
    USEFUL,
    efficiencies,
    split,
    straggler_factor,
    weak_scaling_factors,
)


def parts(**per_rank) -> dict:
    """Every part of PARTS as per-rank seconds, zero unless given."""
    n = len(next(iter(per_rank.values())))
    return {name: np.asarray(per_rank.get(name, [0.0] * n), dtype=float) for name in PARTS}


def test_communication_is_everything_but_useful_work():
    assert set(USEFUL) == {"loop", "input", "compute", "apply", "host"}
    assert set(PARTS) - set(USEFUL) == {"allreduce", "sync"}


def test_the_parts_timed_in_the_step_are_declared_once_and_carried_by_name():
    """One list of the step's timed parts: the meters' per-rank detail columns follow it."""
    from hpclab.rank.meters import DETAIL

    assert STEP_PARTS == ("loop", "input", "compute", "allreduce", "apply")
    assert [n for n in DETAIL if n[:-2] in STEP_PARTS] == [f"{p}_s" for p in STEP_PARTS]


@pytest.mark.parametrize(
    ("slowdown", "factor"), [(0, 0.0), (30, 1 / 0.7 - 1), (50, 1.0), (90, 9.0)]
)
def test_a_rank_at_x_percent_less_speed_takes_1_over_1_minus_x_as_long(slowdown, factor):
    assert straggler_factor(slowdown) == pytest.approx(factor)


def test_a_30_percent_straggler_of_two_equal_ranks_gives_load_balance_085():
    """Equal ranks but one at 70 % speed: it computes 1/0.7 as long, the other waits that out."""
    t = 10.0
    slow = t * (1 + straggler_factor(30))
    eff = efficiencies(parts(compute=[t, slow], allreduce=[slow - t, 0.0]))
    assert eff["load_balance"] == pytest.approx((t + slow) / 2 / slow)
    assert eff["load_balance"] == pytest.approx(0.85)
    assert eff["comm_efficiency"] == pytest.approx(1.0)  # no transfer time: all loss is balance
    assert eff["parallel_efficiency"] == pytest.approx(eff["load_balance"])


def test_balanced_ranks_lose_only_what_they_communicate():
    eff = efficiencies(parts(compute=[8.0, 8.0], allreduce=[2.0, 2.0]))
    assert eff["load_balance"] == pytest.approx(1.0)
    assert eff["comm_efficiency"] == pytest.approx(0.8)
    assert eff["parallel_efficiency"] == pytest.approx(0.8)


def test_an_empty_window_has_no_efficiency():
    eff = efficiencies(parts(compute=[0.0, 0.0]))
    assert all(math.isnan(v) for v in eff.values())


def test_sync_is_the_untimed_rest_of_the_call_and_never_negative():
    raw = dict(
        loop=np.array([0.0, 0.0]),
        input=np.array([1.0, 1.0]),
        compute=np.array([5.0, 6.0]),
        allreduce=np.array([2.0, 1.0]),
        apply=np.array([1.0, 1.0]),
        call=np.array([9.5, 8.999999]),  # rank 1: a microsecond short (timer resolution)
        host=np.array([0.5, 0.5]),
    )
    out = split(raw)
    assert list(out) == list(PARTS)
    assert out["sync"] == pytest.approx([0.5, 0.0])


def test_the_input_share_is_the_mean_input_time_over_the_window():
    eff = efficiencies(parts(input=[3.0, 1.0], compute=[5.0, 7.0], allreduce=[0.0, 2.0]))
    assert eff["input_share"] == pytest.approx((3.0 + 1.0) / 2 / 10.0)  # T: rank 1's 10 s
    assert math.isnan(efficiencies(parts(compute=[0.0, 0.0]))["input_share"])


def _split_of(per_rank: dict[str, list[float]]) -> dict:
    return {
        f"rank_{name}_ms": per_rank.get(name, [0.0] * len(per_rank["compute"])) for name in PARTS
    }


def test_weak_scaling_factors_multiply_to_the_ratio_of_step_times():
    # one rank: 1.0 ms compute + 0.3 ms of other useful work + 0.05 ms untimed rest of the call;
    # two ranks: each computes 1.5 ms (they share cores), rank 1 a little more, and both wait in
    # the allreduce (rank 0 also for rank 1)
    ref = _split_of(
        {"compute": [1.0], "input": [0.1], "apply": [0.1], "host": [0.1], "sync": [0.05]}
    )
    run = _split_of(
        {
            "compute": [1.5, 1.6],
            "input": [0.1, 0.1],
            "apply": [0.1, 0.1],
            "host": [0.1, 0.1],
            "allreduce": [0.5, 0.4],
            "sync": [0.05, 0.05],
        }
    )
    f = weak_scaling_factors(ref, run)
    t_ref, t_run = 1.35, max(1.5 + 0.3 + 0.55, 1.6 + 0.3 + 0.45)  # busiest rank's total
    assert f["efficiency"] == pytest.approx(t_ref / t_run)
    assert f["computation_scalability"] == pytest.approx(1.3 / 1.85)  # useful 1.3 -> 1.8, 1.9
    assert f["load_balance"] == pytest.approx(1.85 / 1.9)
    assert f["comm_efficiency"] == pytest.approx(1.9 / t_run)
    assert f["reference_parallel_efficiency"] == pytest.approx(1.3 / 1.35)


def test_ranks_that_only_add_communication_keep_a_computation_scalability_of_one():
    ref = _split_of({"compute": [1.0, 1.0]})
    run = _split_of({"compute": [1.0, 1.0, 1.0, 1.0], "allreduce": [0.25] * 4})
    f = weak_scaling_factors(ref, run)
    assert f["computation_scalability"] == pytest.approx(1.0)
    assert f["efficiency"] == pytest.approx(f["comm_efficiency"]) == pytest.approx(0.8)

"""The rank-side bookkeeping (hpclab.rank.meters): NumPy only, no TensorFlow, no MPI.

Telemetry vectors are built field by field from chosen numbers, and every expected figure is
computed in the test from those numbers, so a wrong column, a wrong sum or a missing reset fails
here rather than in a 2-rank run.
"""

import math

import numpy as np
import pytest

from hpclab.core.metrics import NoiseScale
from hpclab.rank.meters import (
    DECISIONS,
    DETAIL,
    REDUCED,
    CallSizer,
    EpochMeter,
    RankClock,
    ThroughputLog,
    WindowMeter,
    decisions,
)

B, WORLD, SPE = 32, 2, 10  # batch per worker, ranks, steps per epoch


def reduced(**sums) -> np.ndarray:
    """A REDUCED vector (already summed over ranks) with the given entries, zeros elsewhere."""
    v = np.zeros(len(REDUCED))
    for name, value in sums.items():
        v[REDUCED.index(name)] = value
    return v


def detail(**per_rank) -> np.ndarray:
    """A gathered [WORLD, DETAIL] matrix: each keyword is one field's value per rank."""
    m = np.zeros((WORLD, len(DETAIL)))
    for name, values in per_rank.items():
        m[:, DETAIL.index(name)] = values
    return m


def test_the_decisions_are_reduced_entries():
    # The compiled call sums rank 0's decisions with the telemetry, by name.
    assert set(DECISIONS) <= set(REDUCED) and len(set(REDUCED)) == len(REDUCED)


def test_window_row_from_reduced_sums_and_gathered_detail_then_resets():
    meter = WindowMeter(B, WORLD, SPE)
    k = 4  # steps per call
    meter.add(reduced(loss_sum=4.4, correct=190, count=2 * k * B, small_sq=20, big_sq=8,
                      noise_samples=2), k)  # fmt: skip
    meter.add(reduced(loss_sum=3.6, correct=210, count=2 * k * B, small_sq=16, big_sq=6,
                      noise_samples=2), k)  # fmt: skip
    d = detail(samples=[2 * k * B] * 2, call_s=[0.06, 0.12], host_s=[0.02, 0.04], steps=[2 * k] * 2)
    row = meter.row(step=20, time_s=1.5, lr=0.1, detail=d, noise=None)

    assert row["step"] == 20 and row["epoch"] == 2.0 and row["samples"] == 20 * B * WORLD
    assert row["loss"] == pytest.approx((4.4 + 3.6) / (2 * k * WORLD))  # mean step loss
    assert row["accuracy"] == pytest.approx((190 + 210) / (2 * 2 * k * B))
    r0, r1 = 2 * k * B / (0.06 + 0.02), 2 * k * B / (0.12 + 0.04)  # own samples / own time
    assert row["rank_samples_per_sec"] == pytest.approx([r0, r1])
    assert row["samples_per_sec"] == pytest.approx(r0 + r1)
    assert row["host_ms"] == pytest.approx(1000 * (0.02 + 0.04) / (2 * 2 * k))
    assert row["rank_host_ms"] == pytest.approx([1000 * 0.02 / (2 * k), 1000 * 0.04 / (2 * k)])
    # nothing timed inside the calls here: all of call_s is the untimed rest of the call
    assert row["sync_ms"] == pytest.approx(1000 * (0.06 + 0.12) / (2 * 2 * k))
    assert row["grad_norm_small_sq"] == pytest.approx((20 + 16) / 4)  # mean over samples
    assert row["grad_norm_big_sq"] == pytest.approx((8 + 6) / 4)
    assert math.isnan(row["noise_scale"])

    empty = meter.row(step=21, time_s=1.6, lr=0.1, detail=detail(), noise=None)
    assert empty["loss"] == 0.0 and empty["samples_per_sec"] is None
    assert math.isnan(empty["grad_norm_small_sq"]) and math.isnan(empty["grad_norm_big_sq"])
    assert empty["rank_samples_per_sec"] == [None, None]


def test_zero_gradient_share_per_window_and_over_the_run():
    meter = WindowMeter(B, WORLD, SPE)
    meter.add(reduced(grad_zeros=30, grad_elems=2 * 5000), 3)  # two ranks x 5000 elements
    meter.add(reduced(grad_zeros=10, grad_elems=2 * 5000), 3)
    first = meter.row(step=6, time_s=1.0, lr=0.1, detail=detail(), noise=None)
    assert first["grad_zero_fraction"] == pytest.approx(40 / 20000)
    meter.add(reduced(grad_zeros=200, grad_elems=2 * 5000), 3)
    second = meter.row(step=9, time_s=2.0, lr=0.1, detail=detail(), noise=None)
    assert second["grad_zero_fraction"] == pytest.approx(200 / 10000)  # the window only
    assert meter.run_ratio("grad_zeros", "grad_elems") == pytest.approx(240 / 30000)  # the run
    assert math.isnan(meter.row(step=9, time_s=2, lr=0.1, detail=detail(), noise=None)[
        "grad_zero_fraction"])  # fmt: skip
    assert WindowMeter(B, WORLD, SPE).run_ratio("grad_zeros", "grad_elems") is None


def test_decisions_vector_by_name():
    v = decisions(stop=True, publish=False, next_steps=17)
    assert dict(zip(DECISIONS, v)) == {"stop": 1.0, "publish": 0.0, "next_steps": 17.0}
    assert not decisions().any()  # what every other rank contributes


def test_window_row_carries_the_running_noise_scale():
    noise = NoiseScale(B, B * WORLD)
    noise.update(g_small_sq=5.0, g_big_sq=4.0)
    row = WindowMeter(B, WORLD, SPE).row(step=1, time_s=0.1, lr=0.1, detail=detail(), noise=noise)
    assert math.isfinite(noise.value) and row["noise_scale"] == pytest.approx(noise.value)


def test_rank_clock_accumulates_until_taken():
    ticks = iter([10.0, 12.5, 13.0])  # a fake perf_counter: created, first take, second take
    clock = RankClock(B, now=lambda: next(ticks))
    clock.add(
        steps=4,
        call_s=0.1,
        host_s=0.01,
        timed=dict(loop=0.004, input=0.01, compute=0.05, allreduce=0.02, apply=0.01),
    )
    clock.add(
        steps=8,
        call_s=0.2,
        host_s=0.02,
        timed=dict(loop=0.008, input=0.02, compute=0.10, allreduce=0.04, apply=0.02),
    )
    clock.add_eval(0.4)
    got = dict(zip(DETAIL, clock.take()))
    expected = dict(samples=12 * B, call_s=0.3, host_s=0.03, steps=12, loop_s=0.012, input_s=0.03,
                    compute_s=0.15, allreduce_s=0.06, apply_s=0.03, eval_s=0.4, wall_s=2.5)  # fmt: skip
    assert got == pytest.approx(expected)
    again = dict(zip(DETAIL, clock.take()))
    assert again == pytest.approx({**dict.fromkeys(DETAIL, 0.0), "wall_s": 0.5})


def test_epoch_rows_use_epoch_sums_and_their_own_clock():
    meter = EpochMeter(WORLD)
    k = 5
    meter.add(reduced(loss_sum=11.0, correct=250, count=2 * k * B), k, 100.0)
    meter.add(reduced(loss_sum=9.0, correct=290, count=2 * k * B), k, 100.5)
    row = meter.close(step=10, now=102.0, time_s=2.0, lr=0.2, val=(0.7, 0.8))

    count = 2 * 2 * k * B
    assert row["epoch"] == 1 and row["step"] == 10
    assert row["loss"] == pytest.approx((11 + 9) / (2 * k * WORLD))
    assert row["accuracy"] == pytest.approx((250 + 290) / count)
    assert row["samples_per_sec"] == pytest.approx(count / (102.0 - 100.0))
    assert (row["val_loss"], row["val_accuracy"], row["lr"]) == (0.7, 0.8, 0.2)

    # The next epoch starts its clock when the previous one closed and its sums at zero.
    meter.add(reduced(loss_sum=2.0, correct=20, count=2 * B), 1, 103.0)
    second = meter.close(step=11, now=104.0, time_s=4.0, lr=0.2, val=(0.5, 0.9))
    assert second["epoch"] == 2
    assert second["loss"] == pytest.approx(2.0 / WORLD)
    assert second["accuracy"] == pytest.approx(20 / (2 * B))
    assert second["samples_per_sec"] == pytest.approx(2 * B / (104.0 - 102.0))
    assert [r["epoch"] for r in meter.rows] == [1, 2]


def test_throughput_skips_the_warm_up_calls_and_weights_calls_by_their_length():
    log = ThroughputLog()
    calls = [(1000, 0.5)] * 3 + [(1000, 0.01), (4000, 0.05), (1000, 0.01)]
    for samples, seconds in calls:
        log.add_call(samples, seconds)
    log.add_call(1000, 0.0)  # a zero-length interval is not a rate
    s = log.summary()
    kept = calls[3:]  # max(3, 10 %) calls skipped
    # all samples over all seconds of the kept calls, not the mean of unequal calls' rates
    assert s["samples_per_sec"] == pytest.approx(6000 / 0.07)
    rates = np.array([n / t for n, t in kept])
    w = np.array([t for _, t in kept])
    sigma = np.sqrt(np.average((rates - 6000 / 0.07) ** 2, weights=w))
    assert s["samples_per_sec_ci95"] == pytest.approx(1.96 * sigma)
    assert s["throughput_intervals"] == 3
    assert s["rank_samples_per_sec"] == []  # no window was gathered


def _lockstep(log: ThroughputLog, calls: int, seconds: float, waits=(0.0, 0.0), evals=(0, 0)):
    """``calls`` one-call windows of two ranks in lockstep: B samples each per call; the group's
    call takes ``seconds``, a rank that evaluated less than its peer (``evals``) waits the
    difference in its next call (``waits``)."""
    for _ in range(calls):
        log.add_call(WORLD * B, seconds + max(waits))
        log.add_window(
            detail(
                samples=[B, B],
                call_s=[seconds + w for w in waits],
                host_s=[0.0, 0.0],
                eval_s=list(evals),
            )
        )


def test_each_ranks_rate_is_its_share_of_the_calls_the_global_rate_keeps():
    """A start-up transient (rank 1 waits 0.1 s in each of the first calls for rank 0, which
    spent it outside the timed training) is skipped for the ranks as for the global rate: after
    it the ranks run in lockstep, and their rates are equal and add up to it."""
    log = ThroughputLog()
    _lockstep(log, 1, 5.0)  # the first call: the graph is optimised
    _lockstep(log, 2, 0.01, waits=(0.0, 0.1), evals=(0.1, 0.0))
    _lockstep(log, 57, 0.01)
    s = log.summary()  # 60 calls: the first 6 skipped
    assert s["samples_per_sec"] == pytest.approx(WORLD * B / 0.01)
    assert s["rank_samples_per_sec"] == pytest.approx([B / 0.01] * WORLD)
    assert sum(s["rank_samples_per_sec"]) == pytest.approx(s["samples_per_sec"])


def test_a_run_too_short_to_skip_the_warm_up_still_reports_every_rank():
    one, two = ThroughputLog(), ThroughputLog()
    _lockstep(one, 1, 0.5)  # one window: it is the whole run
    assert one.summary()["rank_samples_per_sec"] == pytest.approx([B / 0.5] * WORLD)
    _lockstep(two, 1, 5.0)
    _lockstep(two, 1, 0.25, waits=(0.0, 0.25))  # two windows: the first (graph) is skipped
    assert two.summary()["rank_samples_per_sec"] == pytest.approx([B / 0.25, B / 0.5])


def test_the_per_rank_sums_keep_logarithmically_many_snapshots():
    log = ThroughputLog()
    _lockstep(log, 20_000, 0.001)
    assert len(log._snapshots) < 20 + math.log(20_000 / 20) / math.log(log.SNAPSHOT_GROWTH)
    assert log.summary()["rank_samples_per_sec"] == pytest.approx([B / 0.001] * WORLD)


def _calls(sizer: CallSizer, seconds_per_step, n: int, epoch_steps: int | None = None) -> list:
    """Drive a CallSizer the way the trainer does: the plan made after call i sizes call i+2."""
    plans, sizes, step = [sizer.first, sizer.plan()], [], 0
    for i in range(n):
        k = plans[i]
        if epoch_steps:  # a call never crosses an epoch end
            k = min(k, epoch_steps - step % epoch_steps)
        step += k
        sizes.append(k)
        first = i == 0
        sizer.observe(k, k * seconds_per_step + (2.0 if first else 0.0))  # first call: + graph opt
        plans.append(sizer.plan())
    return sizes


def test_call_size_ramps_up_steadily_to_the_target_and_stays_there():
    sizer = CallSizer(first=4, fixed=0, target_s=0.15, limit=1000)
    sizes = _calls(sizer, 0.001, 14)
    # no growth until a call after the first is timed, then doubling, never collapsing
    assert sizes[:10] == [4, 4, 4, 8, 16, 32, 64, 128, 150, 150]
    assert sizes[-1] == 150  # 0.15 s / 1 ms
    # Epoch ends clip calls, but the ramp goes on from the plan, not from the clipped call.
    clipped = _calls(CallSizer(first=4, fixed=0, target_s=0.15, limit=1000), 0.001, 12, 125)
    assert min(clipped[7:]) >= 25 and max(clipped) <= 150


def test_call_size_respects_slow_steps_the_limit_and_a_fixed_size():
    assert (
        _calls(CallSizer(first=4, fixed=0, target_s=0.15, limit=1000), 0.5, 6) == [4] * 3 + [1] * 3
    )
    assert max(_calls(CallSizer(first=4, fixed=0, target_s=0.15, limit=64), 1e-5, 12)) == 64
    assert _calls(CallSizer(first=7, fixed=7, target_s=0.15, limit=1000), 0.001, 5) == [7] * 5


def test_throughput_is_taken_over_at_least_a_second_of_training():
    # Rows end at publishes, evaluations and epoch ends: one row may cover a single 50 ms step
    # whose fixed cost halves its own rate. The row's throughput is over its window and the
    # ones just before it, the fewest that reach RATE_WINDOW_S (1 s here).
    meter = WindowMeter(B, WORLD, SPE, rate_window_s=1.0)
    first = meter.row(step=1, time_s=1, lr=0.1, detail=detail(samples=[B] * 2,
                      call_s=[0.9, 0.9], host_s=[0, 0], steps=[1, 1]), noise=None)  # fmt: skip
    assert first["samples_per_sec"] == pytest.approx(2 * B / 0.9)  # the first call stands alone
    assert first["rate_window_s"] == pytest.approx(0.9)
    steady = detail(samples=[40 * B] * 2, call_s=[0.3, 0.3], host_s=[0.1, 0.1], steps=[40] * 2)
    rows = [meter.row(step=1 + 40 * i, time_s=1 + 0.4 * i, lr=0.1, detail=steady, noise=None)
            for i in range(1, 5)]  # fmt: skip
    rate = 40 * B / 0.4  # per rank, every steady window
    assert [r["rate_window_s"] for r in rows] == pytest.approx([0.4, 0.8, 1.2, 1.2])
    assert [r["samples_per_sec"] for r in rows] == pytest.approx([2 * rate] * 4)
    # one 50 ms step (its own rate B / 0.05 is far below `rate`) joins the last 1.2 s
    tiny = detail(samples=[B] * 2, call_s=[0.04, 0.04], host_s=[0.01, 0.01], steps=[1] * 2)
    row = meter.row(step=162, time_s=2.6, lr=0.1, detail=tiny, noise=None)
    assert B / 0.05 < 0.7 * rate
    assert row["rate_window_s"] == pytest.approx(1.25)
    assert row["samples_per_sec"] == pytest.approx(2 * (120 * B + B) / 1.25)
    assert row["rank_samples_per_sec"] == pytest.approx([(120 * B + B) / 1.25] * 2)
    # the busiest rank's seconds decide the window; each rank's rate is its own samples / time
    slow = detail(samples=[80 * B] * 2, call_s=[0.6, 1.6], host_s=[0.2, 0.2], steps=[80] * 2)
    row = meter.row(step=242, time_s=4.4, lr=0.1, detail=slow, noise=None)
    assert row["rate_window_s"] == pytest.approx(1.8)  # alone it covers 1 s already
    assert row["rank_samples_per_sec"] == pytest.approx([80 * B / 0.8, 80 * B / 1.8])


def test_the_time_split_and_pop_efficiencies_of_a_window_with_a_straggler():
    """Rank 1 computes 30 ms a step, rank 0 20 ms and waits 10 ms more in the allreduce: the
    columns give every part per rank, and POP's numbers follow from them (hpclab.core.pop)."""
    steps = 100
    per_step = {  # seconds per step on (rank 0, rank 1)
        "input_s": (0.001, 0.001),
        "compute_s": (0.020, 0.030),
        "allreduce_s": (0.012, 0.002),
        "apply_s": (0.002, 0.002),
    }
    call = [sum(v[r] for v in per_step.values()) + 0.001 for r in range(2)]  # +1 ms untimed
    host = (0.0005, 0.0005)
    d = detail(
        samples=[steps * B] * 2,
        steps=[steps] * 2,
        call_s=[c * steps for c in call],
        host_s=[h * steps for h in host],
        wall_s=[(c + h) * steps + 0.2 for c, h in zip(call, host)],
        eval_s=[0.2, 0.2],
        **{name: [v * steps for v in pair] for name, pair in per_step.items()},
    )
    row = WindowMeter(B, WORLD, SPE).row(step=steps, time_s=5.0, lr=0.1, detail=d, noise=None)
    assert row["rank_compute_ms"] == pytest.approx([20.0, 30.0])
    assert row["rank_allreduce_ms"] == pytest.approx([12.0, 2.0])
    assert row["rank_sync_ms"] == pytest.approx([1.0, 1.0])
    assert row["compute_ms"] == pytest.approx(25.0)
    assert row["step_ms"] == pytest.approx(1000 * (call[0] + host[0]))  # evaluation taken out
    assert row["eval_ms"] == pytest.approx(200.0)
    useful = [1 + 20 + 2 + 0.5, 1 + 30 + 2 + 0.5]  # ms: input, compute, apply, host
    T = 1000 * max(c + h for c, h in zip(call, host))
    assert row["load_balance"] == pytest.approx(np.mean(useful) / max(useful))
    assert row["comm_efficiency"] == pytest.approx(max(useful) / T)
    assert row["parallel_efficiency"] == pytest.approx(np.mean(useful) / T)

"""The allocation plan (hpclab/core/allocation.py): time to target = S(B) · T(B/p, p), GPU- and
node-hours, the efficiencies, the Pareto set and its named points, the paragraph and the
assumptions — on constructed models whose answers are known."""

from __future__ import annotations

import pytest

from hpclab.core.allocation import evaluate, knee, pareto_front, plan_allocation
from hpclab.core.critical_batch import fit_critical_batch
from hpclab.core.errors import ConfigError
from hpclab.core.hardware_model import Affine, HardwareModel, Link, Network

B_CRIT, S_MIN = 512.0, 1000.0
STATS = fit_critical_batch(
    [64, 128, 256, 512], [S_MIN * (1 + B_CRIT / b) for b in (64, 128, 256, 512)]
)


def hardware(per_node=4, **kw) -> HardwareModel:
    return HardwareModel(
        compute=Affine(1e-3, 1e-3, "measured: 1-rank runs"),
        rest=Affine(5e-4, 0.0, "measured: 1-rank runs"),
        network=Network(
            intra=Link(10e-6, 10e9, "measured: comm_probe"),
            inter=Link.from_gbit(25, 5.0),
            per_node=per_node,
        ),
        gradient_bytes=4e6,
        notes={"local_batches": [16, 256], "ranks_measured": [1, 2]},
        **kw,
    )


def test_one_choice_multiplies_steps_by_the_step_time():
    hw = hardware()
    r = evaluate(hw, STATS, 8, 1024)
    steps = S_MIN * (1 + B_CRIT / 1024)
    assert r["steps"] == pytest.approx(steps, rel=1e-6)
    assert r["step_s"] == pytest.approx(hw.step_s(128, 8))
    assert r["time_s"] == pytest.approx(steps * hw.step_s(128, 8), rel=1e-6)
    assert r["gpu_hours"] == pytest.approx(8 * r["time_s"] / 3600)
    assert r["nodes"] == 2 and r["node_hours"] == pytest.approx(2 * r["time_s"] / 3600)
    assert r["statistical_efficiency"] == pytest.approx(1 / (1 + 1024 / B_CRIT), rel=1e-6)
    assert r["efficiency"] == pytest.approx(r["hardware_efficiency"] * r["statistical_efficiency"])
    assert r["time_s_lo"] <= r["time_s"] <= r["time_s_hi"]


def test_pareto_front_keeps_only_the_undominated():
    rows = [
        {"id": "a", "time_s": 1.0, "gpu_hours": 10.0},
        {"id": "b", "time_s": 2.0, "gpu_hours": 5.0},
        {"id": "c", "time_s": 3.0, "gpu_hours": 6.0},  # dominated by b
        {"id": "d", "time_s": 4.0, "gpu_hours": 1.0},
    ]
    assert [r["id"] for r in pareto_front(rows)] == ["a", "b", "d"]
    # a sharp bend: the middle point sits far below the chord of the ends on log-log axes
    bend = [
        {"id": "fast", "time_s": 1.0, "gpu_hours": 100.0},
        {"id": "bend", "time_s": 2.0, "gpu_hours": 1.2},
        {"id": "cheap", "time_s": 100.0, "gpu_hours": 1.0},
    ]
    assert knee(bend)["id"] == "bend"


def test_the_plan_names_its_points_and_computes_its_paragraph():
    plan = plan_allocation(
        hardware(), STATS, workers=[1, 2, 4, 8, 16, 32], batches=[64, 256, 1024, 4096],
        target="val accuracy 0.9",
    )  # fmt: skip
    rows = plan.rows
    assert all(r["global_batch"] % r["workers"] == 0 for r in rows)
    assert len(rows) == 4 * 6  # every batch divides over every worker count here
    cheap, fast = plan.named["cheapest"], plan.named["fastest"]
    assert cheap["gpu_hours"] == min(r["gpu_hours"] for r in rows)
    assert fast["time_s"] == min(r["time_s"] for r in rows)
    within = plan.named["fastest within 2x the cheapest"]
    assert within["gpu_hours"] <= 2 * cheap["gpu_hours"] and within["time_s"] <= cheap["time_s"]
    assert all(r["pareto"] for r in plan.pareto) and plan.named["the knee"]["pareto"]
    assert "cheapest" in cheap["named"]
    # the paragraph quotes the plan's own numbers
    assert f"{fast['workers']} ranks at global batch {fast['global_batch']:,}" in plan.paragraph
    assert "val accuracy 0.9" in plan.paragraph
    kinds = {a.kind for a in plan.assumptions}
    assert kinds == {"measured here", "entered", "extrapolated"}
    extrapolated = " ".join(a.what for a in plan.assumptions if a.kind == "extrapolated")
    assert "4,096" in extrapolated and "up to 32" in extrapolated
    assert list(plan.table().columns)[:3] == ["workers", "nodes", "global_batch"]


def test_a_slow_network_moves_the_fastest_choice_to_fewer_ranks():
    batches, workers = [256, 1024, 4096], [1, 4, 16, 64]
    fast_net = plan_allocation(hardware(per_node=4), STATS, workers, batches)
    slow = hardware(per_node=4).with_network(
        Network(intra=Link(10e-6, 10e9), inter=Link.from_gbit(0.1, 50.0), per_node=4)
    )
    slow_net = plan_allocation(slow, STATS, workers, batches)
    assert slow_net.named["fastest"]["workers"] < fast_net.named["fastest"]["workers"]
    assert "Beyond 4 ranks the time no longer falls" in slow_net.paragraph
    assert "no longer falls" not in fast_net.paragraph


def test_choices_that_cannot_be_made_are_refused():
    with pytest.raises(ConfigError, match="divides evenly"):
        plan_allocation(hardware(), STATS, workers=[3], batches=[64, 128])
    with pytest.raises(ConfigError, match="workers must be"):
        plan_allocation(hardware(), STATS, workers=[0], batches=[64])

"""The planner replayed against real clusters (hpclab/core/replay.py, `hpclab plan --replay`;
issue 45): fitted on what one or two GPUs show, every other row predicted, on the real files.

The figures asserted are the ones this model reaches (the data is fixed, so they are exact to
rounding); the issue's acceptance (median <= 10 % and p90 <= 20 % at >= 16 GPUs on every
workload) is not met on every workload, and STEP_ERRORS says where.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hpclab.core import replay, traces
from hpclab.core.hardware_model import Affine
from hpclab.tools import cli

POLLUX = traces.traces_dir() / "pollux-osdi21"
MLPERF = traces.traces_dir() / traces.MLPERF_FILE
#: median / p90 of |predicted − measured| / measured of the step time at >= 16 GPUs, fitted on
#: <= 2 GPUs, as this model reaches them (asserted to half a point), and the share of those rows
#: inside their band (BERT's fit on 2 GPUs is tight and its allreduce grows less than a ring's:
#: its band is too narrow, and this says so)
STEP_ERRORS = {
    "cifar10": (0.097, 0.258, 0.99),
    "imagenet": (0.090, 0.215, 0.99),
    "bert": (0.248, 0.340, 0.15),
    "ncf": (0.107, 0.372, 0.97),
}


@pytest.fixture(scope="module")
def replays():
    return {w: replay.replay(POLLUX / w, t) for w, t in replay.SHARED_TARGETS.items()}


@pytest.mark.parametrize("workload", traces.POLLUX_WORKLOADS)
def test_step_time_at_16_gpus_and_more_from_two(replays, workload):
    far = replays[workload]["summary"]["step_time_at_16_gpus_or_more"]
    median, p90, in_band = STEP_ERRORS[workload]
    assert far["rows"] >= 100
    assert far["median"] == pytest.approx(median, abs=0.005)
    assert far["p90"] == pytest.approx(p90, abs=0.005)
    assert far["in_band"] == pytest.approx(in_band, abs=0.01)


def test_the_fit_sees_only_two_gpus_and_predicts_every_other_row(replays):
    rows = replays["imagenet"]["step_time"]
    assert {r["gpus"] for r in rows if r["fitted"]} == {1, 2}
    assert len(rows) == len(traces.read_steps(POLLUX / "imagenet"))
    assert all(r["band_lo_s"] <= r["predicted_s"] <= r["band_hi_s"] for r in rows)


def test_a_trace_made_by_the_model_is_recovered():
    """Rows written by the model itself (known compute, allreduce and overlap window) are fitted
    back and predicted exactly at 64 GPUs."""
    truth = replay.TraceHardware(Affine(0.02, 0.004), 0.05, 0.15, 0.2, 0.35, 0.0)
    rows = []
    for gpus, nodes, per_node in [(1, 1, 1), (2, 1, 2), (2, 2, 1), (64, 16, 4), (24, 6, 4)]:
        for b in (16, 32, 64, 128, 256):
            row = traces.StepRow(gpus, nodes, per_node, True, b, 1.0, 0.0, "synthetic")
            step = truth.step_s(row)
            rows.append(traces.StepRow(gpus, nodes, per_node, True, b, step, 0.0, "synthetic"))
    out = replay.replay_steps(rows)
    for r in out:
        assert r["predicted_s"] == pytest.approx(r["measured_s"], rel=1e-3)
    fit = replay.fit_trace_hardware(rows)
    assert fit.inter_s == pytest.approx(0.15, rel=1e-3)
    assert fit.phi_inter == pytest.approx(0.35, rel=1e-3)


def test_no_workload_is_both_outside_its_bands_and_unwarned(replays):
    for name, out in replays.items():
        outside = out["summary"]["steps_outside_band"]
        assert not outside or out["statistical_model_warning"], (name, outside)
    # the image workloads and BERT follow the hyperbola; NCF's three smallest batches do not
    # determine it, and it says so
    assert replays["ncf"]["statistical_model_warning"]
    for name in ("cifar10", "imagenet", "bert"):
        assert replays[name]["statistical_model_warning"] is None
        assert replays[name]["summary"]["steps_outside_band"] == []


def test_the_band_widens_with_extrapolation():
    lo1, hi1 = replay.steps_band(1000.0, 0.05, 0.02, 0.01, 1.0)
    lo4, hi4 = replay.steps_band(1000.0, 0.05, 0.02, 0.01, 4.0)
    assert hi4 / lo4 == pytest.approx((hi1 / lo1) ** 3)  # 1 + log2(4) = 3 times the width


def test_samples_that_fall_with_the_batch_are_warned():
    assert replay.hyperbola_warning([100, 200, 400], [1000, 600, 350], 0.01) is None
    sentence = replay.hyperbola_warning([100, 200, 400], [1000, 400, 150], 0.01)
    assert "forbids" in sentence and "25%" in sentence


def test_mlperf_768_gpus_from_the_runs_below():
    rows = {r["gpus"]: r for r in replay.replay_mlperf(traces.read_mlperf(MLPERF))}
    r = rows[768]
    assert r["fitted_on"] == [8, 64, 512]
    assert r["band_lo_minutes"] <= r["measured_minutes"] <= r["band_hi_minutes"]
    assert r["error"] == pytest.approx(0.083, abs=0.005)
    # 512 from one batch (8 and 64 GPUs ran the same 3,200): only the hyperbola's bracket
    assert rows[512]["band_lo_minutes"] <= rows[512]["measured_minutes"]
    assert rows[512]["measured_minutes"] <= rows[512]["band_hi_minutes"]


def test_cli_replay_json_schema(capsys):
    assert cli.main(["plan", "--replay", str(POLLUX / "bert"), "--target", "88", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"step_time", "steps_to_target", "statistical_model_warning", "summary"}
    assert set(out["step_time"][0]) == {
        "gpus",
        "nodes",
        "local_batch",
        "uniform",
        "fitted",
        "measured_s",
        "predicted_s",
        "band_lo_s",
        "band_hi_s",
    }
    assert set(out["steps_to_target"][0]) == {
        "batch",
        "fitted",
        "measured",
        "predicted",
        "band_lo",
        "band_hi",
    }
    assert cli.main(["plan", "--replay", str(MLPERF), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["time_to_train"][-1]["gpus"] == 768


def test_cli_replay_refuses_with_a_sentence(capsys, tmp_path):
    assert cli.main(["plan", "--replay", str(POLLUX / "bert")]) == 2
    assert "needs --target" in capsys.readouterr().err
    assert cli.main(["plan", "--replay", str(tmp_path / "nope"), "--target", "1"]) == 2


def test_the_plans_error_sentence_comes_from_the_replay():
    errors = replay.shared_replay_errors()
    every = np.concatenate(
        [
            [
                abs(r["predicted_s"] / r["measured_s"] - 1)
                for r in out["step_time"]
                if r["gpus"] >= 16
            ]
            for out in (replay.replay(POLLUX / w, t) for w, t in replay.SHARED_TARGETS.items())
        ]
    )
    assert errors["median"] == pytest.approx(np.median(every))
    sentence = replay.error_sentence(errors)
    assert f"{errors['median']:.0%} (median)" in sentence and "4 real workloads" in sentence


def test_a_plan_from_someone_elses_trace(tmp_path, capsys):
    """--measurements DIR: 1-2 GPU timings and validation runs in the trace format give the plan
    up to 1,024 GPUs, with the replay's error beside it (issue 45, item 5)."""
    args = ["plan", "--measurements", str(POLLUX / "imagenet"), "--target", "0.75",
            "--workers", "1,8,64,1024", "-o", str(tmp_path / "p.html"), "--json"]  # fmt: skip
    assert cli.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert max(r["workers"] for r in out["rows"]) == 1024
    assert any("measured elsewhere: imagenet's trace" in a["what"] for a in out["assumptions"])
    assert out["replay_error"]["median"] > 0
    assert cli.main(args[:3] + ["-o", str(tmp_path / "p.html")]) == 2
    assert "needs --target" in capsys.readouterr().err

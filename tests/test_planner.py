"""The allocation planner (hpclab/studies/planner.py, `hpclab.plan`, `hpclab plan`): fitted from a
recorded measurement without engines, and — on real ranks — its predictions checked against
measurements it was not fitted on (issue 29, item 4).

Held-out checks (the mpi test), each with its band:

* per-step time at 2 ranks, predicted from 1-rank time splits + the allreduce model fitted to
  the size sweep + the computation-scalability probe, against 2-rank runs: within STEP_BAND;
* the allreduce model at the model's gradient bytes against the allreduce a step does (grouped,
  averaged, compiled), measured apart from the sweep: within COMM_BAND.

On 2 shared cores the same measurement repeated can move by more than those bands (other
processes take the cores; Horovod's background loop waits for its turn). The test measures that
spread (each held-out quantity twice) and, when it exceeds the band, says the machine was too
busy to judge (a warning with every number) instead of judging — as notebook 04's claim check
does (tests/test_notebooks.py, BUSY).
"""

from __future__ import annotations

import json
import statistics as stats
import warnings

import pandas as pd
import pytest

from hpclab.core.critical_batch import CriticalBatchFit
from hpclab.core.errors import ConfigError
from hpclab.studies import planner

STEP_BAND = 0.15
COMM_BAND = 0.20


def recorded(**changes) -> planner.Measurements:
    """A measurement made of known numbers: compute 0.5 ms + 10 µs/sample, rest 0.2 ms,
    allreduce α = 100 µs (2 ranks: 0.2 ms fixed) and β = 1 GB/s, S(B) = 100 (1 + 200/B)."""
    splits = [
        {"workers": 1, "local_batch": b, "step_ms": 0.7 + 0.01 * b, "compute_ms": 0.5 + 0.01 * b,
         "loop_ms": 0.05, "input_ms": 0.05, "apply_ms": 0.05, "sync_ms": 0.0, "host_ms": 0.05,
         "allreduce_ms": 0.0}
        for b in (16, 64, 256)
    ]  # fmt: skip
    comm = [
        {"bytes": n, "seconds": 2e-4 + n / 1e9, "ranks": 2} for n in (1024, 16384, 2**20, 2**22)
    ]
    sweep = [
        {"global_batch": b, "lr": lr, "steps": 100 * (1 + 200 / b) * (1 if lr == 0.1 else 1.3)}
        for b in (32, 64, 128, 256)
        for lr in (0.05, 0.1, 0.2)
    ]
    m = planner.Measurements(
        model="cnn1d", target=0.8, gradient={"bytes": 20840, "tensors": 8}, comm=comm,
        splits=splits, sweep=sweep,
    )  # fmt: skip
    for k, v in changes.items():
        setattr(m, k, v)
    return m


def test_a_recorded_measurement_gives_back_its_models():
    result = planner.plan(measurements=recorded(), workers=[1, 2, 4], batches=[64, 256])
    hw = result.hardware
    assert hw.compute.fixed_s == pytest.approx(5e-4, rel=1e-3)
    assert hw.compute.per_sample_s == pytest.approx(1e-5, rel=1e-3)
    assert hw.rest(100) == pytest.approx(2e-4, rel=1e-3)
    assert hw.network.intra.latency_s == pytest.approx(1e-4, rel=1e-3)
    assert hw.network.intra.bandwidth_Bps == pytest.approx(1e9, rel=1e-3)  # 2(p-1)/p = 1 at p=2
    assert isinstance(result.statistics, CriticalBatchFit)
    assert result.statistics.b_crit == pytest.approx(200, rel=1e-3)
    assert [b.lr for b in result.best_lr] == [0.1] * 4 and not any(
        b.at_edge for b in result.best_lr
    )
    plan = result.allocation
    assert len(plan.rows) == 6 and plan.named["cheapest"]["workers"] == 1
    assert "every batch's best LR lies inside its grid" in [a.what for a in plan.assumptions]


def test_a_measurement_survives_json(tmp_path):
    m = recorded()
    back = planner.Measurements.load(m.save(tmp_path / "m.json"))
    assert back == m


def test_too_few_batches_reaching_the_target_is_one_sentence():
    missed = [dict(r, steps=None) if r["global_batch"] > 64 else r for r in recorded().sweep]
    with pytest.raises(ConfigError, match="sweep must reach the target 0.8 at 3 or more"):
        planner.plan(measurements=recorded(sweep=missed))


def test_steps_to_reach_reads_the_first_evaluation_at_the_target():
    h = pd.DataFrame({"step": [10, 20, 30, 40], "eval_accuracy": [0.5, float("nan"), 0.81, 0.9]})
    assert planner.steps_to_reach(h, 0.8) == 30
    assert planner.steps_to_reach(h, 0.95) is None
    assert planner.steps_to_reach(pd.DataFrame(), 0.8) is None


def test_plan_is_public_and_on_the_command_line(tmp_path, capsys):
    import hpclab
    from hpclab.tools.cli import main

    assert hpclab.plan is planner.plan
    path = recorded().save(tmp_path / "m.json")
    html = tmp_path / "plan.html"
    code = main(["plan", "--measurements", str(path), "-o", str(html), "--workers", "1,2,4,8",
                 "--gpus-per-node", "4", "--inter-gbit", "100"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "Pareto set" in out and "[entered] inter-node link" in out
    assert "plotly" in html.read_text(encoding="utf-8")
    assert main(["plan", "--measurements", str(path), "-o", str(html), "--json"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["paragraph"].startswith("To reach held-out accuracy 0.8")


# --- held-out checks on real ranks ------------------------------------------------------------


def _rel(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.own_lab
def test_predictions_hold_on_measurements_they_were_not_fitted_on(tmp_path):
    from hpclab import Lab, RunConfig

    cfg = RunConfig()
    m = planner.Measurements(model=cfg.model, target=planner.TARGET)
    again = planner.Measurements(model=cfg.model, target=planner.TARGET)
    with Lab(workers=2, runs_dir=tmp_path / "runs", verbose=False) as lab:
        planner.measure_comm(lab, cfg, m)
        planner.measure_compute_share(lab, cfg, m)
        two = planner.measure_splits(lab, cfg)  # held out: never fitted
        planner.measure_comm(lab, cfg, again)  # the repeat that says how noisy this machine is
        lab.restart(workers=1)
        m.splits = planner.measure_splits(lab, cfg)
        repeat = planner.measure_splits(lab, cfg)
    hw = planner.fit_hardware(m)
    n = m.gradient["bytes"]
    comm_pred = hw.network.allreduce_s(n, 2)
    comm_meas = [m.gradient_allreduce["seconds"], again.gradient_allreduce["seconds"]]
    comm_err = _rel(comm_pred, stats.median(comm_meas))
    comm_noise = abs(comm_meas[1] / comm_meas[0] - 1)
    pairs = {s["local_batch"]: (1e3 * hw.step_s(s["local_batch"], 2), s["step_ms"]) for s in two}
    step_err = {b: _rel(p, meas) for b, (p, meas) in pairs.items()}
    step_noise = max(
        abs(r["step_ms"] / s["step_ms"] - 1) for s, r in zip(m.splits, repeat, strict=True)
    )
    report = (
        f"gradient allreduce ({n} bytes, 2 ranks): predicted {1e3 * comm_pred:.3f} ms vs "
        f"measured {[round(1e3 * s, 3) for s in comm_meas]} ms (error {comm_err:+.0%}, repeat "
        f"spread {comm_noise:.0%}); step at 2 ranks, predicted vs measured ms by local batch "
        f"{ {b: (round(p, 3), round(x, 3)) for b, (p, x) in pairs.items()} } (errors "
        f"{ {b: f'{e:+.0%}' for b, e in step_err.items()} }, 1-rank repeat spread "
        f"{step_noise:.0%}); α {hw.network.intra.latency_s * 1e6:.0f} µs, β "
        f"{hw.network.intra.bandwidth_Bps / 1e9:.2f} GB/s, compute slowdown "
        f"{hw.compute_slowdown:.2f}"
    )
    print("[planner held-out]", report)
    if comm_noise > COMM_BAND or step_noise > STEP_BAND:
        warnings.warn(f"the machine was too busy to judge the planner: {report}", stacklevel=1)
        return
    assert abs(comm_err) <= COMM_BAND, report
    assert all(abs(e) <= STEP_BAND for e in step_err.values()), report

"""The allocation planner (hpclab/studies/planner.py, `hpclab.plan`, `hpclab plan`): fitted from a
recorded measurement without engines, and — on real ranks — its predictions checked against
measurements it was not fitted on (issue 29, item 4).

Held-out checks (the mpi test), each with its band:

* per-step time at 2 ranks, predicted from 1-rank time splits + the allreduce model fitted to
  the size sweep + the computation-scalability probe, against 2-rank runs: within STEP_BAND;
* the allreduce model at the model's gradient bytes against the allreduce a step does (grouped,
  averaged, compiled), measured apart from the sweep: within COMM_BAND;
* steps to target at a global batch left out of the critical-batch fit (LEFT_OUT), against its
  best-LR steps measured: within STEPS_BAND (steps do not depend on how busy the machine is, so
  this one is always judged).

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

from hpclab.core.critical_batch import CriticalBatchFit, best_per_batch, fit_critical_batch
from hpclab.core.errors import ConfigError
from hpclab.studies import planner

# Per-step time: the aim was 15 %; the stated band is 25 %, because the computation-scalability
# probe that the 2-rank compute rests on moved between 1.02 and 2.06 at local batch 256 in
# repeated runs on this machine (issue 29's note gives every pair measured).
STEP_BAND = 0.25
COMM_BAND = 0.20
STEPS_BAND = 0.25
LEFT_OUT = 128  # the sweep's global batch the critical-batch fit never sees


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
        repeat = planner.measure_splits(lab, cfg, local_batches=(64,))  # the noise, at one batch
        m.sweep = planner.measure_sweep(lab, cfg)
    # steps to target at a batch left out of the fit (steps do not depend on a busy machine)
    best = {b.batch: b for b in best_per_batch((r["global_batch"], r["lr"], r["steps"])
                                              for r in m.sweep)}  # fmt: skip
    kept = [b for b in best.values() if b.batch != LEFT_OUT]
    fit = fit_critical_batch([b.batch for b in kept], [b.steps for b in kept])
    steps_pred, steps_meas = fit.predict_steps(LEFT_OUT), best[LEFT_OUT].steps
    steps_err = _rel(steps_pred, steps_meas)
    print(
        f"[planner held-out] steps to {m.target:g} at batch {LEFT_OUT} (left out): predicted "
        f"{steps_pred:.0f} ± {fit.steps_se(LEFT_OUT):.0f} vs measured {steps_meas:.0f} at lr "
        f"{best[LEFT_OUT].lr:g} (error {steps_err:+.0%}); fit {fit.describe()}; best per batch "
        f"{ {b.batch: (b.steps, b.lr, b.at_edge) for b in best.values()} }"
    )
    assert abs(steps_err) <= STEPS_BAND, (steps_pred, steps_meas, m.sweep)
    hw = planner.fit_hardware(m)
    n = m.gradient["bytes"]
    # each round's model against the same round's gradients (measured turn about with its sizes)
    again.splits = m.splits
    hw_again = planner.fit_hardware(again)
    preds = [hw.allreduce_s(2), hw_again.allreduce_s(2)]
    comm_meas = [m.gradient_allreduce["seconds"], again.gradient_allreduce["seconds"]]
    # like with like: a round's model against its own gradients; the noise is how far the two
    # rounds' errors disagree, not how far the machine's speed moved between them
    errors = [_rel(p, x) for p, x in zip(preds, comm_meas, strict=True)]
    comm_noise = abs(errors[1] - errors[0])
    comm_err = stats.median(errors)
    # the 2-rank runs sat between the two communication rounds: predict with both rounds'
    # models (their mean), and count how far they disagree as noise, beside the 1-rank repeat's
    both = {s["local_batch"]: [1e3 * h.step_s(s["local_batch"], 2) for h in (hw, hw_again)]
            for s in two}  # fmt: skip
    pairs = {s["local_batch"]: (stats.mean(both[s["local_batch"]]), s["step_ms"]) for s in two}
    step_err = {b: _rel(p, meas) for b, (p, meas) in pairs.items()}
    first = {s["local_batch"]: s["step_ms"] for s in m.splits}
    step_noise = max(
        *(abs(r["step_ms"] / first[r["local_batch"]] - 1) for r in repeat),
        *(abs(a - b) / (a + b) for a, b in both.values()),
    )
    report = (
        f"gradient allreduce ({n} bytes, 2 ranks): predicted "
        f"{[round(1e3 * p, 3) for p in preds]} ms vs "
        f"measured {[round(1e3 * s, 3) for s in comm_meas]} ms (error {comm_err:+.0%}, repeat "
        f"spread {comm_noise:.0%}); step at 2 ranks, predicted vs measured ms by local batch "
        f"{ {b: (round(p, 3), round(x, 3)) for b, (p, x) in pairs.items()} } (errors "
        f"{ {b: f'{e:+.0%}' for b, e in step_err.items()} }, noise (1-rank repeat, rounds) "
        f"{step_noise:.0%}); α {hw.network.intra.latency_s * 1e6:.0f} µs, β "
        f"{hw.network.intra.bandwidth_Bps / 1e9:.2f} GB/s, γ {hw.per_tensor_s * 1e6:.0f} µs per "
        f"tensor ({hw.gradient_tensors} tensors), compute slowdown "
        f"{ {b: round(hw.slowdown(b), 2) for b in pairs} }"
    )
    print("[planner held-out]", report)
    busy = []  # each check judged unless its own repeat moved by more than its band
    if comm_noise > COMM_BAND:
        busy.append("the allreduce")
    else:
        assert abs(comm_err) <= COMM_BAND, report
    if step_noise > STEP_BAND:
        busy.append("the step time")
    else:
        assert all(abs(e) <= STEP_BAND for e in step_err.values()), report
    if busy:
        warnings.warn(
            f"the machine was too busy to judge {' and '.join(busy)}: {report}", stacklevel=1
        )

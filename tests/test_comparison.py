"""compare(), the sweep summary charts and the steps/time-to-target math.

Sweep runs are written as real run folders (tests/fakes.py) and read back with load_run. Expected
numbers are worked out here from the hand-chosen inputs, not taken from the code under test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fakes import write_run

from hpclab.core.config import RunConfig
from hpclab.core.pop import PARTS
from hpclab.records.store import load_run
from hpclab.views.charts.batch_charts import accuracy_vs_batch, steps_to_target_chart
from hpclab.views.charts.comparison import Comparison, compare
from hpclab.views.charts.facts import run_facts
from hpclab.views.charts.outcomes import (
    default_target,
    evaluations,
    steps_to_target,
    time_to_target,
)
from hpclab.views.charts.scaling_charts import (
    batch_effect,
    judge,
    pop_factors,
    scaling_efficiency,
    scaling_series,
)

SAMPLES = 20_000  # MNIST-1D samples generated for these runs
TRAIN = 16_000  # 20 % of them are held out for validation


# -- pure functions ------------------------------------------------------------------------------

EPOCHS = pd.DataFrame(
    {
        "epoch": [1, 2, 3, 4, 5],
        "step": [100, 200, 300, 400, 500],
        "time_s": [1.5, 3.0, 4.5, 6.0, 7.5],
        "val_accuracy": [0.50, 0.78, 0.81, 0.79, 0.90],
    }
)


@pytest.mark.parametrize(
    "target, steps, seconds",
    [
        (0.80, 300, 4.5),  # first row at or above 0.80 is epoch 3 (epoch 4 dips, irrelevant)
        (0.78, 200, 3.0),  # "≥": equal counts
        (0.90, 500, 7.5),
        (0.40, 100, 1.5),
        (0.95, None, None),  # never reached
    ],
)
def test_steps_and_time_to_target(target, steps, seconds):
    assert steps_to_target(EPOCHS, target) == steps
    assert time_to_target(EPOCHS, target) == seconds


def test_step_granular_evaluations_make_steps_to_target_exact_to_the_interval():
    """A run that learns steadily crosses 0.80 at step 1234 of 2000. Epoch-end validation (every
    500 steps) says 1500 (+22 %); evaluations every 50 steps (auto: 2000 / 40) say 1250, within
    one interval (2.5 % of the run) of the truth, and never before it."""
    true_step, total, every = 1234, 2000, 50
    acc = lambda step: 0.8 * step / true_step  # noqa: E731 (reaches 0.80 exactly at true_step)
    history = [
        {"step": s, "time_s": s / 100, "eval_accuracy": acc(s) if s % every == 0 else float("nan")}
        for s in range(10, total + 1, 10)
    ]
    epochs = [{"epoch": e, "step": 500 * e, "time_s": 5.0 * e, "val_accuracy": acc(500 * e)}
              for e in range(1, 5)]  # fmt: skip
    run = type("R", (), {"history": pd.DataFrame(history), "epochs": pd.DataFrame(epochs),
                         "config": {}, "workers": 2})()  # fmt: skip
    f = run_facts(run)
    assert steps_to_target(f.epochs, 0.8) == 1500
    got = steps_to_target(evaluations(f), 0.8)
    assert got == 1250 and true_step <= got < true_step + every
    assert time_to_target(evaluations(f), 0.8) == pytest.approx(12.5)
    # without step evaluations (older records, eval_samples=0) the epochs are what there is
    f.history = f.history.drop(columns="eval_accuracy")
    assert steps_to_target(evaluations(f), 0.8) == 1500


def test_to_target_on_empty_or_partial_tables():
    assert steps_to_target(pd.DataFrame(), 0.5) is None
    assert time_to_target(pd.DataFrame({"step": [10]}), 0.5) is None  # no val_accuracy column
    gaps = pd.DataFrame({"step": [10, 20], "time_s": [1.0, 2.0], "val_accuracy": [None, 0.7]})
    assert steps_to_target(gaps, 0.6) == 20
    assert time_to_target(gaps, 0.6) == 2.0


# -- a small sweep on disk -----------------------------------------------------------------------


@pytest.fixture
def sweep(tmp_path) -> dict[str, Path]:
    return {
        # linear rule, growing global batch (64 per worker × 1, 2, 4 workers)
        "b64": write_run(
            tmp_path,
            num_samples=SAMPLES,
            batch_per_worker=64,
            workers=1,
            val_accs=[0.70, 0.85, 0.90],
            epoch_s=10.0,
            samples_per_sec=10_000.0,
        ),
        "b128": write_run(
            tmp_path,
            num_samples=SAMPLES,
            batch_per_worker=64,
            workers=2,
            val_accs=[0.75, 0.82, 0.88],
            epoch_s=6.0,
            samples_per_sec=18_000.0,
        ),
        "b256": write_run(
            tmp_path,
            num_samples=SAMPLES,
            batch_per_worker=64,
            workers=4,
            val_accs=[0.60, 0.70, 0.78],
            epoch_s=4.0,
            samples_per_sec=30_000.0,
        ),
        # sqrt rule at two batches (256 from one worker: a strong-scaling partner of b256)
        "sqrt128": write_run(
            tmp_path,
            num_samples=SAMPLES,
            batch_per_worker=128,
            workers=1,
            lr_scaling="sqrt",
            val_accs=[0.80, 0.86, 0.89],
            samples_per_sec=11_000.0,
        ),
        "sqrt256": write_run(
            tmp_path,
            num_samples=SAMPLES,
            batch_per_worker=256,
            workers=1,
            lr_scaling="sqrt",
            val_accs=[0.78, 0.84, 0.87],
            samples_per_sec=12_000.0,
        ),
    }


def test_compare_table_from_paths(sweep):
    cmp = compare([str(p) for p in sweep.values()], target=0.8)
    assert isinstance(cmp, Comparison)
    t = cmp.table.set_index("run_id")
    for key in (
        "label",
        "workers",
        "global_batch",
        "optimizer",
        "lr_scaling",
        "precision",
        "peak_lr",
        "val_accuracy",
        "samples_per_sec",
        "wall_time_s",
        "steps_to_target",
        "time_to_target_s",
        "status",
    ):
        assert key in cmp.table.columns
    b64 = t.loc[sweep["b64"].name]
    assert b64["global_batch"] == 64 and b64["workers"] == 1
    assert b64["steps_to_target"] == 2 * (TRAIN // 64)  # epoch 2 (0.85) is the first ≥ 0.8
    assert b64["time_to_target_s"] == 20.0
    b256 = t.loc[sweep["b256"].name]
    assert pd.isna(b256["steps_to_target"]) and pd.isna(b256["time_to_target_s"])
    assert b256["peak_lr"] == pytest.approx(0.05 * 256 / 64)  # linear rule from base 64
    assert t.loc[sweep["sqrt128"].name, "steps_to_target"] == TRAIN // 128  # epoch 1 (0.80)
    assert t.loc[sweep["b128"].name, "label"] == "b64 linear+wu1 ×2"


def test_compare_accepts_records_and_live_runs(sweep):
    rec = load_run(sweep["b64"])

    class LiveRun:  # hpclab.cluster.run.Run offers record() for a snapshot
        def record(self):
            return load_run(sweep["b128"])

    cmp = compare([rec, LiveRun()])
    assert list(cmp.table["global_batch"]) == [64, 128]
    assert cmp.target == default_target([rec, LiveRun()]) == 0.81  # floor(0.9 × 0.90, 2 dp)
    fig = cmp.figure()
    assert len(fig.data) == 6  # per run: val acc vs epoch, vs samples, throughput bar
    bars = [t for t in fig.data if t.type == "bar"]
    assert [b.y[0] for b in bars] == [10_000.0, 18_000.0]
    # val accuracy vs samples: step × global batch
    assert list(fig.data[1].x) == [k * (TRAIN // 64) * 64 for k in (1, 2, 3)]


def test_repr_html_escapes_config_text(tmp_path):
    path = write_run(
        tmp_path,
        num_samples=SAMPLES,
        batch_per_worker=64,
        workers=1,
        val_accs=[0.5, 0.6],
        name="<b>x</b>",
    )
    html = compare([path])._repr_html_()
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html


def test_accuracy_vs_batch_one_line_per_rule_log_x(sweep):
    fig = accuracy_vs_batch(list(sweep.values()))
    assert fig.layout.xaxis.type == "log"
    lines = {t.name: t for t in fig.data}
    assert set(lines) == {"linear", "sqrt"}
    assert list(lines["linear"].x) == [64, 128, 256]
    assert list(lines["linear"].y) == [0.90, 0.88, 0.78]
    assert list(lines["sqrt"].x) == [128, 256]


def test_steps_to_target_chart_log_log_ideal_and_unreached(sweep):
    records = [load_run(sweep[k]) for k in ("b64", "b128", "b256")]
    fig = steps_to_target_chart(records, target=0.8)
    for axis in ("xaxis", "yaxis", "xaxis2", "yaxis2"):
        assert fig.layout[axis].type == "log", axis
    by_name = {}
    for t in fig.data:
        by_name.setdefault(t.name, []).append(t)
    # reached: b64 at epoch 2 of 250 steps, b128 at epoch 2 of 125 steps
    steps, seconds = by_name["linear"]
    assert list(steps.x) == [64, 128] and list(steps.y) == [500, 250]
    assert list(seconds.y) == [20.0, 12.0]
    # ideal 1/B anchored at the smallest batch: 500 · 64 / B and 20 s · 64 / B
    ideal_steps, ideal_time = by_name["ideal 1/B (perfect scaling)"]
    assert list(ideal_steps.x) == [64, 128, 256]
    np.testing.assert_allclose(ideal_steps.y, [500, 250, 125])
    np.testing.assert_allclose(ideal_time.y, [20, 10, 5])
    # b256 never reached 0.8: an open marker at the steps/time it ran (3 × 62 steps, 12 s)
    missed_steps, missed_time = by_name["linear: target not reached"]
    assert missed_steps.marker.symbol.endswith("-open")
    assert list(missed_steps.x) == [256] and list(missed_steps.y) == [3 * (TRAIN // 256)]
    assert list(missed_time.y) == [12.0]
    assert list(missed_steps.text) == ["not reached"]
    assert "0.8" in fig.layout.title.text


def test_steps_to_target_chart_when_nobody_reaches(sweep):
    fig = steps_to_target_chart([sweep["b64"], sweep["b128"]], target=0.99)
    assert any("no run reached" in (a.text or "") for a in fig.layout.annotations)
    missed = [t for t in fig.data if t.name and "not reached" in t.name]
    assert sum(len(t.x) for t in missed) == 2 * 2  # both runs, both panels


def test_scaling_efficiency_weak_and_strong(sweep):
    fig = scaling_efficiency(list(sweep.values()))
    eff = {t.name: t for t in fig.data if t.xaxis == "x2" and t.mode == "lines+markers"}
    thr = {t.name: t for t in fig.data if t.xaxis in (None, "x") and t.mode == "lines+markers"}
    weak = next(n for n in thr if "weak" in n)
    strong = next(n for n in thr if "strong" in n and "global batch 256" in n)
    strong128 = next(n for n in thr if "strong" in n and "global batch 128" in n)
    # weak scaling, 64 per worker: T = 10k, 18k, 30k at N = 1, 2, 4 → E = T_N / (N · 10k)
    assert list(thr[weak].x) == [1, 2, 4]
    np.testing.assert_allclose(eff[weak].y, [1.0, 18 / 20, 30 / 40])
    # strong scaling, global batch 256: N=1 (12k, b256 sqrt) and N=4 (30k, b64 linear)
    assert list(thr[strong].x) == [1, 4]
    np.testing.assert_allclose(eff[strong].y, [1.0, 30 / (4 * 12)])
    assert thr[strong].line.dash == "dash" and thr[weak].line.dash == "solid"
    # strong scaling, global batch 128: N=1 (11k, b128 sqrt) and N=2 (18k, b64 linear)
    np.testing.assert_allclose(eff[strong128].y, [1.0, 18 / (2 * 11)])
    assert len(thr) == 3  # 1 weak + 2 strong series; lone batches form no series


def test_scaling_efficiency_relative_to_smallest_worker_count(tmp_path):
    paths = [
        write_run(
            tmp_path,
            num_samples=SAMPLES,
            batch_per_worker=64,
            workers=n,
            val_accs=[0.5],
            samples_per_sec=t,
        )
        for n, t in ((2, 16_000.0), (4, 24_000.0))
    ]
    fig = scaling_efficiency(paths)
    eff = [t for t in fig.data if t.xaxis == "x2" and t.mode == "lines+markers"]
    assert len(eff) == 1 and "relative to N=2" in eff[0].name
    np.testing.assert_allclose(eff[0].y, [1.0, 24 / (4 * 8)])  # T_1 taken as 16k / 2


@pytest.mark.parametrize(
    ("gaps", "noise", "verdict"),
    [
        ([0.30, 0.20], 0.10, "shown"),  # both passes, mean 0.25 beats their disagreement
        ([0.127, 0.037], 0.09, "within the noise"),  # CI's pass: mean 0.082 within 0.09
        ([0.05, -0.01], 0.06, "within the noise"),  # one pass each way
        ([-0.30, -0.20], 0.10, "reversed"),
        ([0.50, 0.30], 0.20, "shown"),  # a busy machine's noise, beaten all the same
        ([0.10, 0.30], 0.20, "too busy to tell"),  # not beaten, and the noise beyond BUSY
    ],
)
def test_judge_a_difference_against_the_passes_disagreement(gaps, noise, verdict):
    assert judge(gaps, noise) == verdict


def test_batch_effect_reads_each_pass_gap_between_its_smallest_and_largest_batch(tmp_path):
    rates = {  # (pass, per-worker batch) -> samples/s on 1 and 2 workers
        ("first", 16): (1000.0, 1200.0),  # E(2) 0.6
        ("first", 1024): (9000.0, 16200.0),  # 0.9
        ("repeat", 16): (1000.0, 1400.0),  # 0.7
        ("repeat", 1024): (9000.0, 17100.0),  # 0.95
    }
    runs: dict[str, list[Path]] = {"first": [], "repeat": []}
    for (which, batch), pair in rates.items():
        for n, t in zip((1, 2), pair):
            runs[which].append(
                write_run(
                    tmp_path / which,
                    num_samples=SAMPLES,
                    batch_per_worker=batch,
                    workers=n,
                    val_accs=[0.5],
                    samples_per_sec=t,
                )
            )
    effect = batch_effect(runs["first"], runs["repeat"], model=RunConfig().model)
    assert effect["per-worker batches"] == [16, 1024]
    assert effect["E(2) first pass"] == {16: 0.6, 1024: 0.9}
    assert effect["gaps"] == [0.3, 0.25] and effect["noise"] == 0.05
    assert effect["verdict"] == "shown"
    with pytest.raises(ValueError, match="two batches in both passes"):
        batch_effect(runs["first"], runs["repeat"][:2], model=RunConfig().model)


def test_pop_factors_take_each_weak_e_n_apart_from_the_runs_time_splits(tmp_path):
    def split(n: int, compute: float, allreduce: float) -> dict:
        parts = {"compute": compute, "host": 0.2, "allreduce": allreduce}
        return {f"rank_{p}_ms": [parts.get(p, 0.0)] * n for p in PARTS}

    paths = [
        write_run(
            tmp_path,
            num_samples=SAMPLES,
            batch_per_worker=16,
            workers=n,
            val_accs=[0.5],
            samples_per_sec=t,
            summary={"time_split": split(n, c, a)},
        )
        for n, t, c, a in ((1, 10_000.0, 1.0, 0.0), (2, 12_000.0, 1.6, 0.4))
    ]
    paths.append(
        write_run(tmp_path, num_samples=SAMPLES, batch_per_worker=32, workers=1, val_accs=[0.5])
    )
    (row,) = pop_factors(paths).to_dict("records")  # the lone batch-32 run forms no series
    assert row["workers"] == 2 and row["E (throughput)"] == pytest.approx(0.6)
    assert row["computation scalability"] == pytest.approx(1.2 / 1.8)
    assert row["comm efficiency"] == pytest.approx(1.8 / 2.2) and row["load balance"] == 1.0
    assert row["E (split)"] == pytest.approx(1.2 / 2.2)


def test_scaling_efficiency_without_series_says_why(tmp_path):
    paths = [
        write_run(tmp_path, num_samples=SAMPLES, batch_per_worker=64, workers=1, val_accs=[0.5]),
        write_run(
            tmp_path,
            num_samples=SAMPLES,
            batch_per_worker=32,
            workers=2,
            val_accs=[0.5],
            lr_scaling="sqrt",
        ),
    ]
    # same global batch 64 from 1×64 and 2×32 → that IS a strong-scaling pair
    assert any("strong" in (t.name or "") for t in scaling_efficiency(paths).data)
    lonely = scaling_efficiency(paths[:1])
    assert any("differ only in worker count" in a.text for a in lonely.layout.annotations)


def test_threads_per_worker_split_scaling_series(tmp_path):
    # threads per worker is a Lab argument, recorded under "lab" in config.json, not in the config:
    # the same config at 1 and 4 threads must give two series, never one averaged line
    throughput = {(1, 1): 10_000.0, (1, 2): 18_000.0, (4, 1): 30_000.0, (4, 2): 45_000.0}
    paths = [
        write_run(
            tmp_path,
            num_samples=SAMPLES,
            batch_per_worker=64,
            workers=n,
            threads_per_worker=threads,
            val_accs=[0.5],
            samples_per_sec=t,
        )
        for (threads, n), t in throughput.items()
    ]
    series = [s for s in scaling_series(paths) if s["kind"] == "weak"]
    assert len(series) == 2  # not one series averaging 1 and 4 threads
    weak = {s["threads_per_worker"]: s for s in series}
    assert set(weak) == {1, 4}
    assert weak[1]["throughput"] == [10_000.0, 18_000.0]
    np.testing.assert_allclose(weak[1]["efficiency"], [1.0, 18 / 20])
    assert weak[4]["throughput"] == [30_000.0, 45_000.0]
    np.testing.assert_allclose(weak[4]["efficiency"], [1.0, 45 / 60])
    assert "1 thread per worker" in weak[1]["name"] and "4 threads per worker" in weak[4]["name"]
    names = {t.name for t in scaling_efficiency(paths).data if t.mode == "lines+markers"}
    assert {weak[1]["name"], weak[4]["name"]} <= names


@pytest.mark.parametrize(
    "setting",
    [
        {"lab": {"engine_settings": {"cycle_time_ms": 0.1, "fusion_mb": 64.0}}},
        {"lab": {"engine_settings": {"cycle_time_ms": 1.0, "fusion_mb": 64.0}}},
        {"lab": {"engine_settings": {"cycle_time_ms": 0.1, "fusion_mb": 0.0}}},
        {"grad_allreduce": "per_tensor"},
    ],
    ids=["same", "cycle_1ms", "fusion_0", "per_tensor"],
)
def test_engine_settings_split_scaling_series(tmp_path, setting):
    # Horovod's cycle time and fusion buffer (the Lab's EngineSettings, recorded under "lab")
    # or the allreduce mode change throughput: never one averaged series with the default's.
    def runs(i, **kw):
        return [
            write_run(
                tmp_path,
                num_samples=SAMPLES,
                batch_per_worker=64,
                workers=n,
                val_accs=[0.5],
                samples_per_sec=1000.0 * n * (i + 1),
                **kw,
            )
            for n in (1, 2)
        ]

    default = {"lab": {"engine_settings": {"cycle_time_ms": 0.1, "fusion_mb": 64.0}}}
    paths = runs(0, **default) + runs(1, **setting)
    weak = [s for s in scaling_series(paths) if s["kind"] == "weak"]
    expected = 1 if setting == default else 2  # (the same settings: one series of 4 runs)
    assert len(weak) == expected and all(len(s["throughput"]) == 2 for s in weak)


def test_comparison_module_keeps_the_chart_names_notebooks_import():
    from hpclab.views.charts import batch_charts, comparison, scaling_charts

    assert comparison.steps_to_target_chart is batch_charts.steps_to_target_chart
    assert comparison.accuracy_vs_batch is batch_charts.accuracy_vs_batch
    assert comparison.scaling_efficiency is scaling_charts.scaling_efficiency

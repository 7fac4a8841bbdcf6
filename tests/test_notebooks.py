"""The workshop notebooks: stored clean (fast tests) and run top to bottom on real engines (slow).

The notebooks are the source (instructors edit them in JupyterLab). Fast checks (no MPI, no
TensorFlow; tests/notebook_checks.py): every notebook is stored without outputs or execution
counts, is thin (no ``def``, no ``%%px``/``%px``; notebook 12's ``%%px`` cells excepted, where the
code is the lesson), names no absolute or personal path, ends by
stopping its Lab, and has learning objectives, an exercise with hints, answers and take-aways.

Execution (``-m notebook``): each notebook runs with nbclient in a fresh kernel, one after another
(a 2-core machine cannot run two labs at once), with ``notebooks/`` as the working directory and
runs recorded in a temporary folder (``HPCLAB_RUNS``), so a sweep never skips points recorded by
an earlier session and the time printed is what a student on a fresh checkout waits.

The kernel is *this* interpreter (``sys.executable``), not whatever ``python3`` kernelspec Jupyter
finds first: a user-level kernelspec (``~/.local/share/jupyter/kernels/python3``) or a kernel whose
argv is a bare ``python`` resolved on PATH could otherwise run the notebooks in a Python without
hpclab, Horovod or the venv's MPI. A kernelspec pointing at ``sys.executable`` is written to a
temporary folder and handed to nbclient through its own KernelSpecManager.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from pathlib import Path

import nbformat
import notebook_checks as checks
import pytest
from test_real_clusters import (
    assert_critical_batch,
    assert_hardware_vs_statistical,
    assert_overlap,
    assert_predict_mlperf,
    assert_scaling_out,
    assert_where_time_goes,
)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
EXPECTED = [
    "00_welcome",
    "01_batch_size_accuracy",
    "02_hardware_vs_statistical",
    "03_precision",
    "04_scaling_out",
    "05_critical_batch",
    "06_where_time_goes",
    "07_input_and_io",
    "08_silent_data_corruption",
    "09_learners_and_averaging",
    "10_plan_your_allocation",
    "11_checkpoint_and_resume",
    "12_the_loop_by_hand",
    "13_overlap_and_fusion",
    "14_float16_underflow",
]

CELL_TIMEOUT_S = 300  # one cell (a sweep) may take this long before nbclient gives up
BUDGET_S = 180  # what a notebook may take on 2 cores (warned about, not failed)


def _records(runs_dir: Path) -> list:
    from hpclab import load_run

    return [load_run(p.parent) for p in sorted(runs_dir.glob("*/config.json"))]


def _claim_00(runs_dir: Path) -> str:
    """Notebook 00: the first run finishes well above chance (0.10) with one weights digest on
    every rank, and in synchronous training the ranks' own rates come out nearly equal and add
    up to the global rate (each is its rank's share of the same calls after the warm-up)."""
    (run,) = _records(runs_dir)
    s = run.summary
    assert s["status"] == "finished" and s["val_accuracy"] >= 0.5, s  # chance is 0.10
    assert len(s["weights_digest"]) == s["world_size"] == 2, s["weights_digest"]
    assert len(set(s["weights_digest"])) == 1, s["weights_digest"]
    rates, group = s["rank_samples_per_sec"], s["samples_per_sec"]
    assert max(rates) <= 1.1 * min(rates), rates  # every rank runs at the group's pace
    assert abs(sum(rates) - group) <= 0.1 * group, (rates, group)  # shares of the same calls
    return (
        f"{s['status']}, val accuracy {s['val_accuracy']:.3f}, digests {s['weights_digest']}, "
        f"{s['samples_per_sec']:,.0f} samples/s, per rank {[round(r) for r in rates]}"
    )


def _claim_01(runs_dir: Path) -> str:
    """Notebook 01: without scaling, accuracy falls at every step up in batch, by more than 10
    points from 128 to 512 and from 512 to 2,048 (no scaling's runs are smooth: six seeds moved
    it by 4 points at 256); linear scaling with warm-up buys it back at the medium batch (256:
    more than 10 points above no scaling; six seeds read 16-20, the seeds moved the gap by 4)
    and fails at the largest. At 512 its peak LR 0.4 is at the window's edge, where the seed
    decides (seeds 0-5: 0.956, 0.947, collapsed, 0.906, 0.958, 0.531; under
    ONEDNN_MAX_CPU_ISA=AVX2 seed 0 read 0.729): reported, not judged. In the window, LARS still
    trains (status not failed, accuracy above 0.15) at a peak LR at least twice the largest at
    which momentum SGD trains, and collapses too at the top."""
    records = _records(runs_dir)
    window = [r for r in records if "lr-window" in (r.config.get("tags") or ())]
    sweep = [r for r in records if r.config["epochs"] == 6]

    def acc(r):  # a run that diverged or collapsed has not trained, whatever it read
        failed = r.status in ("diverged", "collapsed")
        return 0.0 if failed else r.summary.get("val_accuracy") or 0.0

    def rule(name, opt="momentum"):
        return {
            r.summary["global_batch"]: round(acc(r), 3)
            for r in sweep
            if r.config["lr_scaling"] == name and r.config["optimizer"] == opt
        }

    none, linear, lars = rule("none"), rule("linear"), rule("linear", "lars")
    b = sorted(none)  # 128, 256 (medium), 512 (the edge), 2,048 on two workers
    assert len(b) == 4 and none[b[0]] > none[b[1]] > none[b[2]] > none[b[3]], none
    assert none[b[0]] > none[b[2]] + 0.1 > none[b[3]] + 0.2, none
    assert linear[b[1]] > none[b[1]] + 0.1, (linear, none)  # bought back at the medium batch
    assert linear[b[3]] < linear[b[1]] - 0.2, linear  # the largest: past the window's edge
    band = {
        opt: {
            round(r.summary["lr"], 3): round(acc(r), 3)
            for r in sorted(window, key=lambda r: r.summary["lr"])
            if r.config["optimizer"] == opt
        }
        for opt in ("momentum", "lars")
    }
    trained = {opt: [lr for lr, a in accs.items() if a > 0.15] for opt, accs in band.items()}
    assert trained["momentum"] and max(trained["lars"]) >= 2 * max(trained["momentum"]), band
    assert band["lars"][max(band["lars"])] < 0.15, band  # LARS collapses too, at the top
    return f"val accuracy by global batch: none {none}, linear {linear}, LARS {lars}; window {band}"


def _best_lr_sweep(runs_dir: Path):
    """Notebooks 02/05's saved per-batch LR sweep and its best-LR table."""
    from hpclab.studies import plan_measure

    (path,) = sorted(runs_dir.glob("critical-batch-sweep-*.json"))
    sweep = plan_measure.Measurements.load(path)
    return sweep, plan_measure.best_lr_table(sweep).set_index("global_batch")


def _claim_02(runs_dir: Path) -> str:
    """Notebook 02: throughput rises many times from the smallest batch to the largest; with the
    LR tuned per batch every batch reaches the target, and from the smallest batch to the largest
    the steps fall by more than 2x while the samples to target grow by more than 2x.

    Where the curve bends is not judged here, from two ratios of single runs: one batch's steps
    to target moved by up to 60 % between seeds (256: 150 steps at seed 0, 160 at seed 1, 240 at
    seed 2 with ONEDNN_MAX_CPU_ISA=AVX2), and at that seed the 32->128 cut (x2.19, each count
    moved one 10-step evaluation against it) fell below the 256->1,024 cut (x2.27), where seeds 0
    and 1 read x3.05 / x1.45 and x2.67 / x1.55. Notebook 05 fits the bend over all six batches,
    with its standard error, and judges it there. The cuts and time to target are reported.
    The section "On a real cluster" states fixed data (exact: tests/test_real_clusters.py), and
    that 16 T4s' soonest batch is larger than any batch of this sweep."""
    from hpclab.core import real_clusters
    from hpclab.studies import plan_measure
    from hpclab.views.charts.comparison import compare

    real = assert_hardware_vs_statistical()

    speed_runs = [r for r in _records(runs_dir) if r.config.get("max_steps") == 32]
    speed_runs = [r for r in speed_runs if not (r.config.get("name") or "").startswith("planner")]
    rate = compare(speed_runs).table.set_index("global_batch")["samples_per_sec"].sort_index()
    assert len(rate) == 7 and rate.iloc[-1] > 5 * rate.iloc[0], rate
    sweep, best = _best_lr_sweep(runs_dir)
    batches = sorted({r["global_batch"] for r in sweep.sweep})
    assert list(best.index) == batches == [32, 64, 128, 256, 512, 1024], (batches, best)
    steps, samples = best["steps"], best["samples"]
    assert steps[32] > 2 * steps[1024] and samples[1024] > 2 * samples[32], best
    early, late = steps[32] / steps[128], steps[256] / steps[1024]  # reported: see above
    table = plan_measure.best_lr_table(sweep, rate).set_index("global_batch")
    soonest_16 = real_clusters.hardware_vs_statistical().figures["soonest_16"]
    assert soonest_16 > max(batches), (soonest_16, batches)
    return (
        f"samples/s by global batch {rate.round(0).to_dict()}; best LR {best['best_lr'].to_dict()}"
        f"; steps {steps.to_dict()}; samples {samples.to_dict()}; steps cut x{early:.2f} over "
        f"32->128 vs x{late:.2f} over 256->1024 (reported); time to target "
        f"{table['time_to_target_s'].round(2).to_dict()} (reported); on a real cluster: {real}"
    )


def _claim_03(runs_dir: Path) -> str:
    """Notebook 03: bfloat16's accuracy lands within twice the seed-to-seed gap (or 2 points) of
    float32's, at each of two seeds, where oneDNN runs bfloat16 (hpclab.rank.bfloat16's probe);
    below AVX-512 every bfloat16 run failed at set-up with the ranks' sentence instead. float16
    on a CPU is at least twice as slow as float32; early in training float16 without the loss
    scaler has the scaled run's share of zero gradient elements within a quarter (or 0.05
    points: no sign of underflow), within half a percent of float32's."""
    from hpclab.rank import bfloat16

    records = _records(runs_dir)
    cnn = [r for r in records if r.config["model"] != "resnet20" and not r.config["max_steps"]]
    acc = {(r.config["seed"], r.config["precision"]): r.summary.get("val_accuracy") for r in cnn}
    seeds = sorted({s for s, _ in acc})
    assert len(seeds) == 2 and len(acc) == 4, acc
    bf16 = [r for r in records if r.config["precision"] == "mixed_bfloat16"]
    runs = bfloat16.probe()["ok"]
    assert runs is not None, "the bfloat16 probe timed out: the machine is too busy to tell"
    if not runs:  # below AVX-512: every bfloat16 run failed with the sentence
        assert all(r.status == "failed" for r in bf16), [r.status for r in bf16]
        assert all("TF_ENABLE_ONEDNN_OPTS=0" in r.summary["error"] for r in bf16), bf16[0].summary
        gaps = f"bfloat16 failed at set-up in all {len(bf16)} runs, as the probe predicts"
    else:
        assert all(r.status == "finished" for r in bf16), [r.status for r in bf16]
        seed_gap = max(
            abs(acc[seeds[0], p] - acc[seeds[1], p]) for p in ("float32", "mixed_bfloat16")
        )
        precision_gap = max(abs(acc[s, "mixed_bfloat16"] - acc[s, "float32"]) for s in seeds)
        assert precision_gap <= max(2 * seed_gap, 0.02), (precision_gap, seed_gap, acc)
        gaps = f"precision gap {precision_gap:.4f}, seed gap {seed_gap:.4f}"
    float32_rate = min(
        r.summary["samples_per_sec"] for r in cnn if r.config["precision"] == "float32"
    )
    short = {
        (r.config["precision"], r.config["loss_scaling"]): r
        for r in records
        if r.config["model"] != "resnet20" and r.config["max_steps"]
    }
    fp16 = short["mixed_float16", True].summary["samples_per_sec"]
    assert fp16 < float32_rate / 2, (fp16, float32_rate)
    zeros = {f"{p}, scaler {s}": r.summary["grad_zero_fraction"] for (p, s), r in short.items()}
    f32, unscaled = zeros["float32, scaler True"], zeros["mixed_float16, scaler False"]
    scaled = zeros["mixed_float16, scaler True"]
    assert abs(unscaled - scaled) <= max(0.0005, 0.25 * scaled), zeros  # the scaler rescued none
    assert abs(unscaled - f32) <= 0.005, zeros  # well under a percent of elements either way
    return (
        f"val accuracy {acc} ({gaps}); "
        f"float16 {fp16:,.0f} vs float32 {float32_rate:,.0f} samples/s; zero share {zeros}"
    )


def _claim_04(runs_dir: Path) -> str:
    """Notebook 04: the section "On a real cluster" first, exactly, whatever the machine (fixed
    data, tests/test_real_clusters.py): there small local batches lose most of the gain and
    large ones little. Then the notebook's own runs, judged by the rule the notebook prints
    (``batch_effect``, ``judge``): the CNN's weak-scaling E(2) gap from 16 to 1,024 per worker in
    two passes against how far the passes disagree about it, and ResNet-20's E(2) against the
    small-batch CNN's of both passes against how far those two disagree. A verdict "reversed"
    fails: the effect went the other way beyond the noise. "within the noise" and "too busy to
    tell" are what two shared cores may honestly say (a warning, as the notebook says): there
    the gap is near the noise (passes on 2 cores measured it from 0.04 to 0.32)."""
    from hpclab.views.charts.scaling_charts import (
        batch_effect,
        judge,
        pop_factors,
        weak_efficiency,
    )

    real = assert_scaling_out()  # the section "On a real cluster": fixed data, exact figures
    records = _records(runs_dir)
    ablation = [r for r in records if "ablation" in (r.config.get("tags") or ())]
    records = [r for r in records if r not in ablation]
    repeated = [r for r in records if "repeat" in (r.config.get("tags") or ())]
    first = [r for r in records if r not in repeated]
    effect = batch_effect(first, repeated)
    assert effect["per-worker batches"] == [16, 1024], effect
    (resnet,) = weak_efficiency(first, "resnet20").values()
    small = [effect["E(2) first pass"][16], effect["E(2) repeat"][16]]
    resnet_verdict = judge([resnet - e for e in small], abs(small[0] - small[1]))
    table = pop_factors(first)  # the notebook's POP table: read by the student, not a take-away
    cols = ["series", "E (split)", "load balance", "comm efficiency", "computation scalability"]
    pop = {
        row.pop("series"): {k: round(float(v), 2) for k, v in row.items()}
        for row in (table[cols].to_dict("records") if len(table) else [])
    }
    measured = (
        f"CNN batch effect {effect}; ResNet-20 E(2) {resnet:.3f} against the small-batch CNN's "
        f"{small}: {resnet_verdict}; POP factors {pop}; ablation: {_ablation_04(ablation)}; "
        f"on a real cluster: {real}"
    )
    assert "reversed" not in (effect["verdict"], resnet_verdict), measured
    if {effect["verdict"], resnet_verdict} != {"shown"}:
        warnings.warn(
            f"notebook 04: not shown above this machine's noise: {measured}", stacklevel=2
        )
    return measured


def _ablation_04(records) -> str:
    """Notebook 04's ablation (hpclab.studies.scaling_ablation): per pass, the factors multiply
    to E(full) and the lost points add up to 1 - E(full) (by construction: checked, not the
    finding); the skipped allreduce left the replicas apart (their weight digests differ); the
    largest part is named only when both passes name it and it beats every other part by more
    than the passes' largest spread of any part — else the finding is "within the noise"."""
    from hpclab.studies import scaling_ablation as ab

    t = ab.table(records)
    parts = [*ab.PARTS, ab.REMAINDER]
    passes = t[t["pass"] != "spread"].to_dict("records")
    assert len(passes) == 2, f"the ablation needs two complete passes; it has {len(t)} rows"
    for row in passes:
        assert math.isclose(math.prod(row[p] for p in parts), row["E"], rel_tol=1e-9), row
        assert math.isclose(sum(row[f"{p} loss"] for p in parts), 1 - row["E"], abs_tol=1e-9)
    for r in records:
        if r.workers == 2 and r.config.get("skip_allreduce"):
            assert len(set(r.summary["weights_digest"])) == 2, r.summary["weights_digest"]
    spread = t[t["pass"] == "spread"].iloc[0]
    losses = {p: [round(row[f"{p} loss"], 3) for row in passes] for p in parts}
    largest = {ab.largest_loss(row) for row in passes}
    verdict = "no part beats the repeat's spread"
    if len(largest) == 1:
        (top,) = largest
        margins = [
            min(row[f"{top} loss"] - row[f"{p} loss"] for p in parts if p != top) for row in passes
        ]
        noise = max(spread[f"{p} loss"] for p in parts)
        if min(margins) > noise:
            verdict = f"{top} is the largest loss (margin {min(margins):.3f} > spread {noise:.3f})"
    return f"E(2) per variant {t.filter(like='E ').round(3).to_dict('list')}; losses {losses}; {verdict}"


def _claim_05(runs_dir: Path) -> str:
    """Notebook 05: S(B) fitted to the saved sweep's best-LR steps puts B_crit inside the batches
    measured, more than one standard error from zero; B_simple, read where each of the two
    seeds' 2-worker runs first reached the target, is positive. Their ratio is reported
    whatever it is, beside the two seeds' B_simple (not judged: McCandlish et al. expect
    B_crit ≈ B_simple only roughly). The section "On a real cluster" (fixed data: exact figures
    in tests/test_real_clusters.py) says every real B_crit is larger than any batch the sweep
    measured: checked against this sweep's largest batch."""
    from hpclab.core import real_targets
    from hpclab.core.critical_batch import fit_critical_batch
    from hpclab.studies import plan_measure

    real = assert_critical_batch()
    sweep, best = _best_lr_sweep(runs_dir)
    fit = fit_critical_batch(list(best.index), list(best["steps"]))
    assert min(best.index) < fit.b_crit < max(best.index), fit.describe()
    figures = real_targets.critical_batch().figures
    real_b_crit = {w: figures[f"{w}_b_crit"] for w in ("cifar10", "imagenet", "mlperf")}
    assert min(real_b_crit.values()) > max(best.index), (real_b_crit, list(best.index))
    assert fit.b_crit > fit.b_crit_se, fit.describe()
    runs = [r for r in _records(runs_dir) if "B_simple" in (r.config.get("name") or "")]
    b_simple = {}
    for r in runs:
        step = plan_measure.steps_to_reach(r.history, sweep.target)
        b_simple[r.config["seed"]] = plan_measure.b_simple_at(r.history, step)
    assert len(b_simple) == 2 and all(v and v > 0 for v in b_simple.values()), b_simple
    ratios = {seed: round(fit.b_crit / v, 2) for seed, v in b_simple.items()}
    return (
        f"{fit.describe()}; B_simple at the target by seed {pd_round(b_simple)}; "
        f"B_crit / B_simple {ratios} (± {fit.b_crit_se / min(b_simple.values()):.2f} from "
        f"B_crit's se; reported); on a real cluster: {real}"
    )


def pd_round(d: dict) -> dict:
    return {k: round(float(v), 1) for k, v in sorted(d.items())}


def _claim_06(runs_dir: Path) -> str:
    """Notebook 06: a 50 % straggler lowers load balance to about 0.75, clearly below the balanced
    run's; the timeline records the negotiation; in the notebook's Amdahl sweep one rank-0
    evaluation at 2 workers takes longer than a sharded one, beyond the 1-worker repeat's noise
    (the serial part does not shrink); small allreduces are latency-bound, large ones
    bandwidth-bound. The section "On a real cluster" states fixed data: its figures are
    asserted exactly (tests/test_real_clusters.py)."""
    from hpclab import load_run
    from hpclab.views.charts import serial_phase
    from hpclab.views.charts.scaling_charts import scaling_series

    real = assert_where_time_goes()

    records = [load_run(p.parent) for p in sorted(runs_dir.glob("*/config.json"))]
    lb = {
        r.config.get("straggler_slowdown"): r.summary["time_split"]["load_balance"]
        for r in records
        if r.config.get("eval_samples") == 0 and not r.config.get("timeline_steps")
    }
    traced = [r for r in records if r.config.get("timeline_steps")]
    assert traced and traced[0].summary["timeline"]["ms_per_step"].get("NEGOTIATE_ALLREDUCE")
    # POP: 0.75 for a 50 % straggler; short runs on two shared cores read a balanced run
    # 0.88-0.99, and once in a while one rank runs slow for a whole run (up to +0.1 either way)
    assert lb[50] <= 0.85 and lb[0.0] >= lb[50] + 0.08, lb
    amdahl = [r for r in records if r.config.get("eval_samples")]
    series = {
        s["name"].rsplit("validation ", 1)[-1]: round(s["efficiency"][-1], 3)
        for s in scaling_series(amdahl, "overall")
    }
    assert set(series) == {"sharded", "rank0"}, series
    # the serial part measured directly: one evaluation's time, judged against the 1-worker
    # repeat; the overall E(2) is reported, not asserted: the evaluation gap is a tenth of a run,
    # less than the training part's run-to-run noise (rank-0 ahead in three of five quiet sweeps)
    evaluations = serial_phase.evaluation_speedups(amdahl)
    assert sorted(evaluations["workers"]) == [1, 1, 2, 2], evaluations
    assert (evaluations["evaluations"] >= 30).all(), evaluations
    serial, said = serial_phase.rank0_is_serial(evaluations, workers=2)
    assert serial, said
    timeline = {k: round(v, 3) for k, v in traced[0].summary["timeline"]["ms_per_step"].items()}
    import pandas as pd

    (sweep,) = [pd.read_csv(p).set_index("bytes") for p in (runs_dir / ".comm").glob("*.csv")]
    ms, bw = sweep["ms"], sweep["busbw_GBps"]
    assert (sweep["where"] == "intra-node").all()
    assert ms[2**14] < 2 * ms[2**10], ms  # latency-bound: 16x the bytes, about the same time
    assert ms[2**26] > 8 * ms[2**22], ms  # bandwidth-bound: 16x the bytes, ~16x the time
    assert bw[2**26] > 20 * bw[2**10], bw
    return (
        f"load balance {lb}; {said}; E(2) overall {series}; timeline ms/step {timeline}; "
        f"allreduce ms {ms.round(3).to_dict()}; on a real cluster: {real}"
    )


def _claim_07(runs_dir: Path) -> str:
    """Notebook 07: online augmentation makes the step wait for its data (input share above 0.4
    and 0.3 above plain), offline does not; small files open one file per sample of the rank per epoch, packed one; at
    1 ms per metadata operation that is 6.4 s against 2 ms; staging costs about two epochs once
    and leaves the epochs free; a global shuffle reads half its samples from outside the shard
    and the whole packed file on every rank; shards sorted by label train as well under a local
    shuffle as under a global one (synchronous SGD averages every shard each step)."""
    import pandas as pd

    from hpclab import load_run

    runs = {
        r.config["name"]: r for r in (load_run(p.parent) for p in runs_dir.glob("*/config.json"))
    }
    share = {name: r.summary["time_split"]["input_share"] for name, r in runs.items()}
    assert share["online, cost 50"] > max(0.4, share["plain"] + 0.3), share
    assert share["offline, cost 50"] < share["plain"] + 0.05, share
    assert runs["offline, cost 50"].summary["augment_offline_s"] > 0
    probes = [pd.read_csv(p) for p in sorted((runs_dir / ".io").glob("*.csv"))]
    assert len(probes) == 7, [p.layout.iloc[0] for p in probes]
    files, packed, slow_files, slow_packed, staged, local, spread = probes
    per_rank = 3200  # 8,000 samples, 6,400 for training, two ranks
    assert list(files.open) == list(files.stat) == [per_rank] * 4, files
    assert list(packed.open) == [1] * 4 and packed.read.max() <= 3, packed
    assert list(slow_files.simulated_s) == pytest.approx([2 * per_rank * 0.001] * 2)
    assert list(slow_packed.simulated_s) == pytest.approx([0.002] * 2)
    copy, epochs = staged[staged.epoch < 0], staged[staged.epoch >= 0]
    assert list(copy.simulated_s) == pytest.approx([2 * (2 * per_rank + 1) * 0.001] * 2)
    assert list(epochs.simulated_s) == [0.0] * 6 and list(epochs.open) == [per_rank] * 6
    whole = 2 * per_rank * (40 * 4 + 4)  # bytes of the packed file
    assert list(spread.bytes) == [whole] * 4 and local.bytes.max() <= 0.8 * whole, (local, spread)
    remote = spread.remote / spread.samples
    assert remote.between(0.45, 0.55).all() and list(local.remote) == [0] * 4, spread
    kept, dealt = (runs[f"by label, {s} shuffle"] for s in ("local", "global"))
    assert kept.config["shards"] == dealt.config["shards"] == "by_label"
    acc = {s: r.summary["val_accuracy"] for s, r in (("local", kept), ("global", dealt))}
    # measured 0.957 and 0.955 (6 epochs: 0.961, 0.963; iid shards 0.960); a bias costs many points
    assert min(acc.values()) >= 0.9 and abs(acc["local"] - acc["global"]) <= 0.02, acc
    # your own files: streamed through tf.data (staged), the step waits longer than in memory
    info = runs["streamed"].summary["input_pipeline"]
    assert info["mode"] == "stream" and info["sharding"] == "by_file", info
    assert info["stage"]["copied_mb"] + info["stage"]["kept_mb"] > 0, info
    assert runs["resident"].summary["input_pipeline"]["mode"] == "resident"
    assert share["streamed"] > share["resident"], share
    return (
        f"input share {share}; files open {per_rank}/rank/epoch, packed 1; global remote share "
        f"{remote.min():.3f}-{remote.max():.3f}; bytes local {local.bytes.max()} vs global {whole}; "
        f"by-label shards, val accuracy {acc}"
    )


def _claim_08(runs_dir: Path) -> str:
    """Notebook 08: bit 30 of a weight on rank 1 splits the replicas at once, the detector fires
    within two steps and the run diverges; with rollback it heals, equal replicas, the clean
    accuracy; a gradient flip keeps the replicas equal; bit 0 is silent, splits the replicas at
    once and moves accuracy by at most twice another seed's gap, or 5 points (tests/test_sdc.py's
    rule); the
    Monte-Carlo's failure rate falls from the exponent's top bit to the mantissa bits."""
    import pandas as pd

    from hpclab import load_run
    from hpclab.studies.sdc import failure_rates

    runs = [load_run(p.parent) for p in sorted(runs_dir.glob("*/config.json"))]
    clean, other_seed = sorted(
        (r for r in runs if r.config["sdc_target"] == "none"), key=lambda r: r.config["seed"]
    )  # the preset's seed, and the next one (how far runs land apart when nothing went wrong)
    by = {(r.config["sdc_target"], r.config["sdc_bit"], r.config["rollback"]): r for r in runs}
    broken = by[("weights", 30, False)]
    healed, grad, low = (
        by[("weights", 30, True)],
        by[("gradients", 30, True)],
        by[("weights", 0, False)],
    )
    flip = broken.summary["sdc"]
    assert broken.status == "diverged" and 0 <= flip["detected_step"] - 40 <= 2, flip
    assert len(set(flip["digest_after"])) == 2, flip
    assert healed.status == "finished" and len(set(healed.summary["weights_digest"])) == 1
    assert healed.summary["val_accuracy"] == pytest.approx(clean.summary["val_accuracy"], abs=0.01)
    assert len(set(grad.summary["sdc"]["digest_after"])) == 1, grad.summary["sdc"]
    seeds = abs(other_seed.summary["val_accuracy"] - clean.summary["val_accuracy"])
    moved = abs(low.summary["val_accuracy"] - clean.summary["val_accuracy"])
    assert moved <= max(2 * seeds, 0.05), (moved, seeds)  # no more than seed noise
    assert len(set(low.summary["sdc"]["digest_after"])) == 2, low.summary["sdc"]
    assert low.summary["sdc"]["detected_step"] is None
    studies = sorted((runs_dir / ".sdc").glob("*.csv"))
    assert len(studies) == 1, studies
    rates = failure_rates(pd.read_csv(studies[0])).set_index("bit")["p_fail_given_sdc"]
    assert rates[30] >= 0.7 and rates[30] > max(rates[22], rates[0]), rates
    assert rates[[30, 29, 27]].mean() > rates[[22, 0]].mean(), rates
    return (
        f"bit 30 detected at {flip['detected_step']}; bit 0 moved accuracy {moved:.3f} (seeds "
        f"{seeds:.3f}); P(failure | SDC) by bit {rates.to_dict()}"
    )


def _claim_09(runs_dir: Path) -> str:
    """Notebook 09: local SGD every 16 steps trains within two points of synchronous SGD on iid
    shards; Crossbow's central model reaches the target, its epochs reported beside synchronous
    SGD's; on shards sorted by label synchronous SGD still trains, local SGD with H = 16 falls
    clearly behind it, and two synchronous groups averaged every 16 steps do no better than
    synchronous SGD (where between local SGD and synchronous SGD they land is within the runs'
    noise: 0.908 vs local 0.811 on one machine, 0.859 vs 0.870 on another)."""
    from hpclab import load_run
    from hpclab.views.charts.comparison import compare

    runs = {
        r.config["name"]: r for r in (load_run(p.parent) for p in runs_dir.glob("*/config.json"))
    }
    table = compare(list(runs.values()), target=0.85).table.set_index("label")
    acc, epochs = table["val_accuracy"], table["epochs_to_target"]
    at = {name: f"{name} ×4" for name in runs}
    assert abs(acc[at["local SGD, H=16"]] - acc[at["S-SGD"]]) <= 0.02, acc
    assert epochs[at["S-SGD"]] > 0 and epochs[at["Crossbow SMA"]] > 0, epochs  # both reached it
    assert acc[at["S-SGD, by label"]] >= acc[at["S-SGD"]] - 0.02, acc
    assert acc[at["local SGD, H=16, by label"]] <= acc[at["S-SGD, by label"]] - 0.05, acc
    hybrid = acc[at["hybrid 2x2, H=16, by label"]]
    assert hybrid <= acc[at["S-SGD, by label"]], acc
    return f"val accuracy {acc.round(3).to_dict()}; epochs to 0.85 {epochs.round(2).to_dict()}"


def _claim_10(runs_dir: Path) -> str:
    """Notebook 10: from the notebook's own saved measurement, steps to target fall from the
    smallest batch to the largest, and the allreduce's share of a step grows with the ranks and
    is most of a step at 64 ranks (this host's allreduce latency against a tiny model's
    arithmetic); B_simple was measured where a run reached the target and is shown beside B_crit
    (their ratio is reported whatever it is); the steps at the second-largest batch, predicted by
    S(B) fitted without it, land within 25 % of those measured (plus the 10-step evaluation
    interval). The notebook's 2-rank prediction at local batch 128 (a batch the fit never ran) is
    reported with its error, not judged: inside a notebook the kernel and its client share the 2
    cores with the ranks; the planner's held-out checks are judged in tests/test_planner.py,
    where no kernel runs. The section "On a real cluster" (MLPerf's 512 and 768 GPUs predicted
    from its 8 and 64) states fixed data: asserted exactly (tests/test_real_clusters.py)."""
    from hpclab.studies import planner

    real = assert_predict_mlperf()

    result = planner.plan(measurements=runs_dir / "plan-measurement.json")
    best = {b.batch: b.steps for b in result.best_lr}
    shares = result.allocation.table().groupby("workers")["allreduce_share"].max()
    assert best[min(best)] > best[max(best)], best
    assert list(shares) == sorted(shares) and shares[max(shares.index)] > 0.5, dict(shares)
    held_out = [
        r for r in _records(runs_dir)
        if r.config.get("name") == "planner: time split, local batch 128"
        and r.summary.get("world_size") == 2
    ]  # fmt: skip
    assert len(held_out) == 3, [r.config.get("name") for r in held_out]
    held_out.sort(key=lambda r: r.path.name)  # run ids begin with their start time
    measured = [planner.steady_split(r.history, r.summary)["step_ms"] for r in held_out[1:]]
    predicted = 1e3 * result.hardware.step_s(128, 2)
    noise = result.noise_scale  # B_simple where a 2-rank run reached the target, beside B_crit
    assert noise is not None and noise["b_simple"] > 0, result.measurements.b_simple_at
    held = planner.held_out_steps(result.best_lr, sorted(best)[-2])
    # issue 29's aim (25 %) plus the measurement's granularity: steps are read every 10 steps
    assert abs(held["error"]) <= 0.25 + 10 / held["measured"], held
    return (
        f"{noise['sentence']} Steps at batch {held['batch']} left out of the fit: predicted "
        f"{held['predicted']:.0f} ± {held['se']:.0f} vs {held['measured']:.0f} measured "
        f"({held['error']:+.0%}). "
        f"best-LR steps {best}; allreduce share by ranks "
        f"{ {w: round(v, 2) for w, v in shares.items()} }; 2-rank step at 128 predicted "
        f"{predicted:.3f} ms vs measured {[round(m, 3) for m in measured]} (error "
        f"{predicted / (sum(measured) / 2) - 1:+.0%}, repeats differ by "
        f"{abs(measured[1] / measured[0] - 1):.0%}; reported, not judged); on a real cluster: "
        f"{real}"
    )


def _claim_11(runs_dir: Path) -> str:
    """Notebook 11: the run that lost rank 1 resumed on one worker by keep_per_rank_batch and
    finished with that rule's global batch and peak LR (the 1-worker plan's), recorded in its
    resumed entry and config.json, every history row after the resume at the 1-worker plan's LR,
    and reached the notebook's target (0.5, five times chance: it resumed and kept learning; 0.70
    at seed 0, 0.597 at seed 1 with oneDNN off); a ResNet-20 checkpoint is written in less than
    one of its steps, and costs a smaller share of a step than the tiny cnn1d's."""
    import numpy as np

    from hpclab import RunConfig
    from hpclab.studies import fault_tolerance as ft

    records = _records(runs_dir)
    (run,) = [r for r in records if r.meta.get("resumed")]
    s, rule = run.summary, run.meta["resumed"][-1]["rescale"]
    cfg = RunConfig(num_samples=8192, epochs=3, checkpoint_every=20, seed=5)
    one, two = cfg.for_workers(1), cfg.for_workers(2)
    assert s["status"] == "finished" and s["steps"] == one.total_steps, s.get("error")
    assert rule["rule"] == "keep_per_rank_batch" and rule["workers"] == [2, 1], rule
    assert rule["global_batch"] == [two.global_batch, one.global_batch], rule
    assert rule["peak_lr"] == [two.peak_lr, one.peak_lr] and one.peak_lr < two.peak_lr, rule
    assert run.workers == 1 and run.meta["derived"]["peak_lr"] == one.peak_lr
    after = run.history[run.history["step"] > rule["start_step"]]
    assert np.allclose(after["lr"], [one.lr_at(k - 1) for k in after["step"]], rtol=1e-5)
    assert s["val_accuracy"] >= 0.5, s["val_accuracy"]
    costs = ft.cost_table(records).set_index("model")
    assert costs.loc["resnet20", "write_s"] < costs.loc["resnet20", "step_s"], costs
    assert costs.loc["resnet20", "steps_per_write"] < costs.loc["cnn1d", "steps_per_write"]
    young = ft.young_interval(costs["write_s"].max(), 24 * 3600.0)
    return (
        f"resumed {rule}; val accuracy {s['val_accuracy']:.3f}; checkpoints "
        f"{costs.round(4).to_dict('index')}; Young's interval at a 24 h MTBF {young:.0f} s"
    )


def _claim_12(runs_dir: Path) -> str:
    """Notebook 12: the loop written by hand (each rank from its own seed, the state broadcast
    from rank 0 after the first step) ends with one weights digest on every rank; the same loop
    without the broadcast ends with a digest per rank; the hand loop's held-out accuracy is well
    above chance (0.10) and lands within seed noise of lab.run's on the same settings (twice the
    gap between lab.run at two seeds, at least 0.03). The throughputs are reported, not judged:
    the hand loop pays Python's call and a copy per step, lab.run once per many steps."""
    saved = json.loads((runs_dir / "hand_loop.json").read_text())
    hand, forgot = saved["hand"], saved["forgot"]
    digests = [r["digest"] for r in hand]
    assert len(digests) == 2 and len(set(digests)) == 1, digests  # one model on every rank
    drifted = [r["digest"] for r in forgot]
    assert len(drifted) == 2 and len(set(drifted)) == 2, drifted  # no broadcast: two models
    accuracy = {r["val_accuracy"] for r in hand}
    assert len(accuracy) == 1, hand  # the allreduce gives every rank the same figure
    (acc,) = accuracy
    runs = {r.run_id: r for r in _records(runs_dir)}
    same, other = (runs[run_id] for run_id in saved["lab_runs"])
    assert same.config["seed"] == saved["seed"] != other.config["seed"], saved["lab_runs"]
    lab_acc = same.summary["val_accuracy"]
    seeds = abs(other.summary["val_accuracy"] - lab_acc)
    assert acc >= 0.5 and abs(acc - lab_acc) <= max(2 * seeds, 0.03), (acc, lab_acc, seeds)
    return (
        f"digests {digests}, without the broadcast {drifted}; val accuracy by hand {acc:.3f}, "
        f"lab.run {lab_acc:.3f} (next seed {other.summary['val_accuracy']:.3f}); samples/s by "
        f"hand {[round(r['samples_per_sec']) for r in hand]}, lab.run "
        f"{same.summary['samples_per_sec']:,.0f}"
    )


def _claim_13(runs_dir: Path) -> str:
    """Notebook 13: eight ResNet-20 runs finish (grouped and per_tensor: twice under the default
    settings, once with fusion off, once at a 5 ms cycle); each fusion-off arm is judged against
    the fusion-on arm of its own way, and per_tensor against grouped under the default settings.
    The verdicts are reported, not asserted: on two shared cores per_tensor has measured from
    15 % slower to 33 % faster than grouped beyond the spread (a CI run), and fusion off's
    exposed share a few points larger in most passes but smaller beyond the spread in one
    rehearsal (grouped, 2026-11-27), so no direction holds on every machine. The section "On a
    real cluster" states fixed data: its figures are asserted exactly (tests/test_real_clusters.py)."""
    from hpclab.views.charts import overlap

    real = assert_overlap()
    records = _records(runs_dir)
    arms = overlap.arms(records)
    assert len(records) == 8 and arms["runs"].sum() == 8 and len(arms) == 6, arms
    found = overlap.findings(records).set_index("arm")
    off = found[found.index.str.contains("fusion off")]
    for way in ("grouped", "per_tensor"):  # judged against its own way with fusion on
        against = off.loc[overlap.arm_name(way, 0.1, 0.0), "against"]
        assert against == overlap.arm_name(way, 0.1, 64.0), off.T
    per_tensor = found.loc[overlap.arm_name("per_tensor", 0.1, 64.0)]
    assert per_tensor["against"] == overlap.arm_name("grouped", 0.1, 64.0), per_tensor
    rates = arms.set_index("arm")["samples_per_sec"].round(1).to_dict()
    takeaways = " ".join(overlap.takeaways(records))
    return f"samples/s by arm {rates}; {takeaways}; on a real cluster: {real}"


def _claim_14(runs_dir: Path) -> str:
    """Notebook 14: at the last point in training, at both seeds, the loss scale of 2^15 saves
    more than half of the activation gradients float16 flushes to 0 unscaled, and that saving
    beats twice its own change between the seeds; the unscaled share is larger than at epoch 0
    and than the weight gradients' (what grad_zero_fraction sees), by more than twice the seeds'
    spread of the unscaled share.

    The saving is paired (the same weights and batch, with and without the scale), so it is set
    against how much the saving itself moves between seeds, not against how far the seeds' levels
    lie apart, which moves both arms alike: seeds 2 and 3 (ONEDNN_MAX_CPU_ISA=AVX2) flushed 0.411
    and 0.292 unscaled, 0.148 and 0.069 scaled, savings 0.263 and 0.224 (64 % and 77 %), and the
    level's spread (0.119) would have asked the smaller saving for 0.237. Seeds 0 and 1 saved 78 %
    and 68 %."""
    from hpclab.studies import fp16

    saved = fp16.load(runs_dir)
    assert len(saved["seeds"]) == 2, saved["seeds"]
    act, wt = fp16.flushed(saved, "activation"), fp16.flushed(saved, "weight")
    epochs = sorted({e for _, e, _ in act})
    first, last = epochs[0], epochs[-1]
    assert first < last, epochs
    un = [act[(s, last, "unscaled")] for s in saved["seeds"]]
    spread = max(un) - min(un)
    gains = {s: act[(s, last, "unscaled")] - act[(s, last, "scaled")] for s in saved["seeds"]}
    gain_spread = max(gains.values()) - min(gains.values())
    for seed in saved["seeds"]:
        gain = gains[seed]
        assert gain > 0.5 * act[(seed, last, "unscaled")], (seed, gain, act)
        assert gain > 2 * gain_spread, (seed, gains)
        assert act[(seed, last, "unscaled")] > act[(seed, first, "unscaled")] + 2 * spread
        assert act[(seed, last, "unscaled")] > wt[(seed, last, "unscaled")] + 2 * spread
    return "flushed to 0 (activation; weight): " + ", ".join(
        f"seed {s} epoch {e} {k} {act[(s, e, k)]:.4f}; {wt[(s, e, k)]:.4f}"
        for (s, e, k) in sorted(act)
    )


CLAIMS = {
    "00_welcome": _claim_00,
    "01_batch_size_accuracy": _claim_01,
    "02_hardware_vs_statistical": _claim_02,
    "03_precision": _claim_03,
    "04_scaling_out": _claim_04,
    "05_critical_batch": _claim_05,
    "06_where_time_goes": _claim_06,
    "07_input_and_io": _claim_07,
    "08_silent_data_corruption": _claim_08,
    "09_learners_and_averaging": _claim_09,
    "10_plan_your_allocation": _claim_10,
    "11_checkpoint_and_resume": _claim_11,
    "12_the_loop_by_hand": _claim_12,
    "13_overlap_and_fusion": _claim_13,
    "14_float16_underflow": _claim_14,
}


def _ids(paths):
    return [p.stem for p in paths]


# ---------------------------------------------------------------------------------------------
# fast: how the notebooks are stored (the checks live in tests/notebook_checks.py)
# ---------------------------------------------------------------------------------------------


def test_every_workshop_notebook_is_present():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED, (
        f"notebooks/ holds {[p.name for p in NOTEBOOKS]}; expected {EXPECTED}"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_stored_without_outputs(path):
    assert checks.stored_clean(checks.read(path), path.name) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_thin_and_portable(path):
    assert checks.thin_and_portable(checks.read(path), path.name, path.read_text()) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_starts_a_lab_and_stops_it_at_the_end(path):
    assert checks.lab_lifecycle(checks.read(path), path.name) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_objectives_exercise_answers_and_takeaways(path):
    assert checks.pedagogy(checks.read(path), path.name) == []


def test_the_checks_catch_what_they_claim(tmp_path):
    """Each check fails on a notebook broken the way it guards against."""
    nb = checks.read(NOTEBOOKS[0])
    nb.cells[-1].outputs = [nbformat.v4.new_output("stream", text="hi")]
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[1].source = "def helper():\n    pass"
    nb.cells = [c for c in nb.cells if "## Answers" not in c.source]
    broken = tmp_path / "broken.ipynb"
    nbformat.write(nb, broken)
    found = " | ".join(checks.problems(broken))
    assert "saved with outputs" in found and "nbconvert --clear-output" in found
    assert "defines a function" in found and "no '## Answers' section" in found
    assert checks.problems(NOTEBOOKS[0]) == []


# ---------------------------------------------------------------------------------------------
# slow: run every notebook end to end on real MPI engines
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_dirs(tmp_path_factory):
    """A kernelspec that starts exactly this interpreter (the venv's), in a private folder."""
    from ipykernel.kernelspec import write_kernel_spec

    root = tmp_path_factory.mktemp("kernels")
    write_kernel_spec(
        path=root / "hpclab-venv", overrides={"display_name": "hpclab test kernel (this venv)"}
    )
    argv = json.loads((root / "hpclab-venv" / "kernel.json").read_text())["argv"]
    assert argv[0] == sys.executable, argv
    return [str(root)]


def _slowest_cells(nb, n: int = 4) -> str:
    """The `n` code cells that took longest (nbclient's own timestamps), as "[index] seconds
    first-line": where a notebook's time goes, for whoever sizes its runs."""
    from datetime import datetime

    took = []
    for i, cell in enumerate(nb.cells):
        when = cell.get("metadata", {}).get("execution", {})
        start, end = when.get("iopub.execute_input"), when.get("shell.execute_reply")
        if cell.cell_type == "code" and start and end:
            seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
            took.append((seconds, i, cell.source.strip().splitlines()[0][:40]))
    return "; ".join(f"[{i}] {s:.0f} s {first!r}" for s, i, first in sorted(took)[::-1][:n])


SHARED_RUNS = {"05_critical_batch": "02_hardware_vs_statistical"}  # reader: the runs it reuses


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    """One fresh folder per session, a runs folder per notebook in it (SHARED_RUNS aside)."""
    return tmp_path_factory.mktemp("notebook-runs")


@pytest.mark.mpi
@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs_top_to_bottom(
    path, kernel_dirs, runs_root, monkeypatch, capsys, record_property
):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    # Runs go to a fresh folder: a sweep must really train, not reuse an earlier session's runs.
    # Notebook 05 shares notebook 02's (it reuses 02's saved LR sweep, as it does for a student
    # who runs them in order; run alone, it measures the sweep itself).
    runs = runs_root / SHARED_RUNS.get(path.stem, path.stem)
    monkeypatch.setenv("HPCLAB_RUNS", str(runs))
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    km = AsyncKernelManager(
        kernel_name="hpclab-venv", kernel_spec_manager=KernelSpecManager(kernel_dirs=kernel_dirs)
    )
    nb = checks.read(path)
    client = NotebookClient(
        nb,
        km=km,
        timeout=CELL_TIMEOUT_S,
        allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    t0 = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(
            f"{path.name} failed after {time.perf_counter() - t0:.0f} s:\n{exc}", pytrace=False
        )
    finally:  # nbclient leaves a kernel it did not start running: end it like Jupyter does
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=False)
    elapsed = time.perf_counter() - t0
    record_property("seconds", round(elapsed, 1))
    with capsys.disabled():
        print(
            f"\n[notebook] {path.name}: {elapsed:.0f} s top to bottom; slowest cells "
            f"{_slowest_cells(nb)}",
            flush=True,
        )
    assert runs.is_dir() and any(runs.iterdir()), (
        f"{path.name} ran but recorded no run under HPCLAB_RUNS"
    )
    if path.stem in CLAIMS:  # what the notebook tells the student, checked on its own runs
        measured = CLAIMS[path.stem](runs)
        with capsys.disabled():
            print(f"[notebook] {path.name} claims hold: {measured}", flush=True)
    if elapsed > BUDGET_S:
        warnings.warn(
            f"{path.name} took {elapsed:.0f} s, over the {BUDGET_S} s workshop budget "
            "(a busy machine is slower; on an idle 2-core machine it should fit)",
            stacklevel=2,
        )

"""The benchmark suite's math and table (fast, no TF, no MPI) and one real tiny run (slow, MPI).

Expected values are computed by hand here, not with the helpers under test. Speed goals are
*not* asserted: they live in benchmarks/run.py and its results, not in tests.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import benchlib as bl  # noqa: E402

CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
cpu MHz\t\t: 2600.000
flags\t\t: fpu sse sse2 avx fma avx2 avx512f avx512bw amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
cpu MHz\t\t: 2600.000
flags\t\t: fpu sse sse2 avx fma avx2 avx512f avx512bw amx_tile
"""


# -- machine, peak and MFU -----------------------------------------------------------------------


def test_parse_cpuinfo():
    cpu = bl.parse_cpuinfo(CPUINFO)
    assert cpu["model_name"] == "Intel(R) Xeon(R) Processor"
    assert cpu["logical_cpus"] == 2
    assert cpu["mhz"] == 2600.0
    assert {"avx512f", "fma", "amx_tile"} <= set(cpu["flags"])


@pytest.mark.parametrize(
    "flags,units,expected",
    [
        (["avx512f", "avx2", "fma"], 2, 64),  # 16 lanes x 2 (FMA) x 2 units
        (["avx512f", "avx2", "fma"], 1, 32),  # one 512-bit FMA unit
        (["avx2", "fma"], 2, 32),  # 8 lanes x 2 x 2
        (["sse2"], 1, 8),  # 4 lanes x 2
    ],
)
def test_fp32_flop_per_cycle(flags, units, expected):
    assert bl.fp32_flop_per_cycle(flags, units) == expected


def test_peak_and_mfu_by_hand():
    # 2 cores x 2.6e9 Hz x 64 FLOP/cycle = 332.8e9 FLOP/s
    peak = bl.peak_flops(2, 2.6, 64)
    assert peak == pytest.approx(332.8e9)
    # 3 img/s x 24.6e9 FLOP/img = 73.8e9 FLOP/s -> 73.8 / 332.8 = 0.221754...
    assert bl.mfu(3.0, 24.6e9, peak) == pytest.approx(73.8 / 332.8)
    # keras ResNet50 (v1) forward, counted: 3,857,973,248 multiply-adds; x 2 FLOP x 3 (fwd + bwd)
    assert bl.RESNET50_TRAIN_FLOP_PER_IMAGE == 23_147_839_488


def test_peak_table_states_both_assumptions():
    table = bl.peak_table(bl.parse_cpuinfo(CPUINFO), cores=2)
    assert table["flop_per_cycle_per_core"] == 64 and table["fma_units_assumed"] == 2
    assert table["peak_flops"] == pytest.approx(2 * 2.6e9 * 64)
    assert table["peak_flops_1fma"] == pytest.approx(2 * 2.6e9 * 32)
    assert "2.60 GHz" in table["assumption"]


def test_bad_inputs_say_what_was_passed():
    with pytest.raises(ValueError, match="fma_units=0"):
        bl.fp32_flop_per_cycle(["avx2"], 0)
    with pytest.raises(ValueError, match="peak=0"):
        bl.mfu(1.0, 1.0, 0)
    with pytest.raises(ValueError, match="2 and 1"):
        bl.paired_ratios([1.0, 2.0], [1.0])


# -- statistics ----------------------------------------------------------------------------------


def test_paired_ratios_median_spread_efficiency():
    assert bl.paired_ratios([10.0, 30.0, 8.0], [5.0, 10.0, 8.0]) == [2.0, 3.0, 1.0]
    assert bl.median([2.0, 3.0, 1.0]) == 2.0
    assert bl.median([4.0, 1.0, float("nan"), 3.0, 2.0]) == 2.5
    assert math.isnan(bl.median([]))
    assert bl.spread([90.0, 100.0, 110.0]) == pytest.approx(0.2)
    assert bl.weak_efficiency(190.0, 100.0, 2) == pytest.approx(0.95)


def test_efficiency_has_one_home():
    """The suite's E(N) is hpclab.core.metrics.efficiency itself (tested in tests/test_metrics.py),
    not a second copy that could drift from what the comparison charts show."""
    from hpclab.core import metrics

    assert bl.efficiency is metrics.efficiency
    assert bl.weak_efficiency is metrics.efficiency


def test_verdicts():
    assert bl.verdict(2.1, 2.0) == "PASS"
    assert bl.verdict(1.9, 2.0) == "MISS"
    assert bl.verdict(9.5, 10.0, higher_is_better=False) == "PASS"
    assert bl.verdict(10.5, 10.0, higher_is_better=False) == "MISS"
    assert bl.verdict(None, 1.0) == "n/a"
    assert bl.verdict(float("nan"), 1.0) == "n/a"


def test_summarize_median_min_max():
    s = bl.summarize([30.0, 10.0, None, 20.0, float("nan")])
    assert (s["median"], s["min"], s["max"], s["n"]) == (20.0, 10.0, 30.0, 3)
    assert s["spread"] == pytest.approx(1.0)  # (30 - 10) / 20
    empty = bl.summarize([])
    assert empty["n"] == 0 and math.isnan(empty["median"]) and math.isnan(empty["min"])


def test_rotations_put_every_arm_in_every_position():
    orders = bl.rotations(("A", "B", "C"), 5)
    assert orders == [
        ("A", "B", "C"),
        ("B", "C", "A"),
        ("C", "A", "B"),
        ("A", "B", "C"),
        ("B", "C", "A"),
    ]
    # over len(arms) rounds each arm runs once in each position
    for pos in range(3):
        assert sorted(o[pos] for o in orders[:3]) == ["A", "B", "C"]
    assert bl.rotations(("on", "off"), 3) == [("on", "off"), ("off", "on"), ("on", "off")]
    assert bl.rotations(("A",), 0) == []
    with pytest.raises(ValueError, match="rounds"):
        bl.rotations(("A", "B"), -1)


def test_compile_seconds():
    # 0.8 s trace; first call 0.5 s of which 4 steps x 0.002 s = 0.008 s are training
    assert bl.compile_seconds(0.8, 0.5, 4, 0.002) == pytest.approx(0.8 + 0.492)
    # a first call faster than its steps' steady time adds nothing
    assert bl.compile_seconds(1.0, 0.1, 4, 0.5) == pytest.approx(1.0)
    # no steady step time: the whole first call counts
    assert bl.compile_seconds(1.0, 0.3, 4, None) == pytest.approx(1.3)
    assert bl.compile_seconds(None, 0.3, 4, 0.1) is None
    assert bl.compile_seconds(1.0, None, 4, 0.1) is None


def test_parse_result_line_takes_the_last_json_line():
    out = (
        "Epoch 1/2\r 10/500 [...] - loss: 2.3\r500/500 [====]\n"
        '{"benchmark": "plain_horovod_fit", "samples_per_sec": 1.0}\n'
        "noise\r"
        '{"benchmark": "plain_horovod_fit", "samples_per_sec": 2.5}\n'
    )
    assert bl.parse_result_line(out) == {"benchmark": "plain_horovod_fit", "samples_per_sec": 2.5}
    assert bl.parse_result_line("no result\n") is None


def _run_module():
    """benchmarks/run.py as a module (by path: `run` is too common a name to import)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "hpclab_bench_run", ROOT / "benchmarks" / "run.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the table -----------------------------------------------------------------------------------


def _arm(*values):
    return bl.summarize(values)


RESULTS = {
    "engine_vs_plain": {
        "goal": 2.0,
        "goal_loop": 1.0,
        "ranks": {
            "1": {
                "engine": _arm(48000.0, 46000.0, 50000.0),
                "fit": _arm(16000.0, 15000.0, 17000.0),
                "loop": _arm(40000.0, 39000.0, 45000.0),
                "ratio_fit_median": 3.0,
                "ratio_loop_median": 1.2,
                "wall_ratio_fit_median": 2.5,
                "wall_ratio_loop_median": 1.1,
                "cross_check": {"fit_samples_per_sec": 15500.0, "loop_samples_per_sec": 41000.0},
            },
            "2": {
                "engine": _arm(30000.0),
                "fit": _arm(20000.0),
                "loop": _arm(31000.0),
                "ratio_fit_median": 1.5,
                "ratio_loop_median": 0.97,
            },
        },
    },
    "telemetry": {
        "goal": 0.98,
        "ratio_median": 0.985,
        "ratios": [0.98, 0.985, 0.99, 1.0, 0.97],
        "engine_ratio_median": 1.001,
    },
    "trace": {
        "goal": 2.0,
        "runs_counted": 7,
        "compile_median_s": 1.25,
        "trace_median_s": 0.9,
        "first_call_median_s": 0.35,
        "first_run_on_lab_compile_median_s": 3.5,
    },
    "cold_start": {
        "goal": 8.0,
        "workers": 2,
        "startup_s": [9.0, 11.0, 12.0],
        "median_s": 11.0,
        "phase_medians_s": {
            "controller_s": 0.5,
            "engines_s": 5.25,
            "tf_import_s": 3.0,
            "horovod_init_s": 0.75,
        },
        "idle_engine_cpu_fraction": [[0.3, 0.2], [0.25, 0.1], [0.4, 0.35]],
    },
    "horovod": {
        "default": {"label": "cycle 0.1 ms"},
        "settings": {
            "cycle 0.1 ms": {"samples_per_sec": _arm(30000.0, 31000.0), "ratio_to_default": 1.0},
            "cycle 5 ms": {"samples_per_sec": _arm(3000.0), "ratio_to_default": 0.1},
        },
        "idle_engine_cpu_fraction": {"0.1": [0.5, 0.7], "1": [0.1, 0.2]},
    },
    "weak_scaling": {
        "goal": 0.9,
        "label": "resnet20",
        "t1_median": 100.0,
        "t2_median": 190.0,
        "efficiency_median": 0.95,
        "efficiencies": [0.95, 0.8, 0.97],
    },
    "resnet50": {
        "ranks": 2,
        "batch_per_rank": 8,
        "per_rank_mean": 1.5,
        "per_rank_ci95": 0.1,
        "total_mean": 3.0,
        "total_ci95": 0.2,
        "script_per_rank_mean": 1.6,
        "script_per_rank_ci95": 0.05,
        "ratio_median": 0.9375,
        "goal": 0.95,
        "mfu": 73.8 / 332.8,
        "mfu_1fma": 73.8 / 166.4,
        "script_mfu": {"mfu": 78.72 / 332.8, "mfu_1fma": 78.72 / 166.4},
        "peak": {
            "peak_flops": 332.8e9,
            "flop_per_cycle_per_core": 64,
            "peak_flops_1fma": 166.4e9,
            "flop_per_cycle_per_core_1fma": 32,
        },
    },
}


def _row(rows, measure_start):
    hits = [r for r in rows if r["measure"].startswith(measure_start)]
    assert len(hits) == 1, (measure_start, [r["measure"] for r in rows])
    return hits[0]


def test_build_table_engine_vs_fit_vs_loop():
    rows = bl.build_table(RESULTS)
    engine = _row(rows, "1 rank(s): A engine samples/s, median [min – max] of 3")
    assert engine["value"] == "48,000 [46,000 – 50,000]"
    assert _row(rows, "1 rank(s): B model.fit")["value"] == "16,000 [15,000 – 17,000]"
    assert _row(rows, "1 rank(s): C loop")["value"] == "40,000 [39,000 – 45,000]"
    # a single repeat shows no range
    assert _row(rows, "2 rank(s): A engine")["value"] == "30,000"
    fit1 = _row(rows, "1 rank(s): engine / fit")
    assert (fit1["value"], fit1["goal"], fit1["verdict"]) == ("3.00x", ">= 2x", "PASS")
    loop1 = _row(rows, "1 rank(s): engine / loop")
    assert (loop1["value"], loop1["goal"], loop1["verdict"]) == ("1.20x", ">= 1x", "PASS")
    assert _row(rows, "2 rank(s): engine / fit")["verdict"] == "MISS"
    assert _row(rows, "2 rank(s): engine / loop")["verdict"] == "MISS"
    assert _row(rows, "1 rank(s): same, all-in")["value"] == "2.50x, 1.10x"
    cross = _row(rows, "1 rank(s): fit, loop with Horovod's own defaults")
    assert (cross["value"], cross["goal"]) == ("15,500, 41,000", "(cross-check)")
    assert not [r for r in rows if r["measure"].startswith("2 rank(s): fit, loop with")]


def test_build_table_other_sections():
    rows = bl.build_table(RESULTS)
    tel = _row(rows, "on / really off: epoch wall rate, median of 5")
    assert (tel["value"], tel["goal"], tel["verdict"]) == ("0.985", ">= 0.98", "PASS")
    assert _row(rows, "on / really off: engine's own")["value"] == "1.001"
    tr = _row(rows, "per cnn1d run after the first on a Lab, median of 7")
    assert (tr["value"], tr["goal"], tr["verdict"]) == ("1.25 s", "<= 2 s", "PASS")
    assert _row(rows, "of which: trace_s / first_call_s")["value"] == "0.90 s / 0.35 s"
    assert _row(rows, "first run on a fresh Lab")["value"] == "3.50 s"
    start = _row(rows, "Lab(workers=2) total, median of 3")
    assert (start["value"], start["goal"], start["verdict"]) == ("11.0 s", "<= 8 s", "MISS")
    phases = _row(rows, "controller / engines registered / TF import / Horovod init")
    assert phases["value"] == "0.5 s / 5.2 s / 3.0 s / 0.8 s"
    # median of the six per-rank figures 0.1 0.2 0.25 0.3 0.35 0.4 = (0.25 + 0.3) / 2
    assert _row(rows, "idle engine CPU (fraction of a core per rank, median)")["value"] == "0.28"
    default = _row(rows, "cycle 0.1 ms (default): samples/s")
    assert default["value"] == "30,500 [30,000 – 31,000], 1.000"
    assert _row(rows, "cycle 5 ms: samples/s")["value"] == "3,000, 0.100"
    idle = _row(rows, "idle engine CPU by cycle time")
    assert idle["value"] == "0.1 ms: 0.60 (sum 1.20), 1 ms: 0.15 (sum 0.30)"
    assert _row(rows, "E = T2")["value"] == "0.950" and _row(rows, "E = T2")["verdict"] == "PASS"
    assert _row(rows, "E of each pair")["value"] == "0.95, 0.80, 0.97"


def test_build_table_trace_by_model_and_without_cnn1d_runs():
    trace = {
        "goal": 2.0,
        "runs_counted": 0,
        "first_run_on_lab_compile_median_s": 12.0,
        "by_model_after_first": {
            "resnet50": {"trace_s": 6.5, "first_call_s": 9.25, "compile_s": 15.75},
        },
    }
    rows = bl.build_table({"trace": trace})
    # no cnn1d run after the first on a Lab: no goal row, rather than an "n/a" verdict
    assert not [r for r in rows if r["verdict"]]
    res = _row(rows, "resnet50, runs after the first on a Lab")
    assert res["value"] == "15.75 s (6.50 s + 9.25 s)"
    assert _row(rows, "first run on a fresh Lab")["value"] == "12.00 s"


def test_build_table_resnet50_side_by_side():
    rows = bl.build_table(RESULTS)
    assert _row(rows, "engine img/s per rank")["value"] == "1.50 ± 0.10"
    assert _row(rows, "Horovod synthetic-benchmark logic")["value"] == "1.60 ± 0.05"
    ratio = _row(rows, "engine / Horovod script")
    assert (ratio["value"], ratio["goal"], ratio["verdict"]) == ("0.938", ">= 0.95", "MISS")
    assert _row(rows, "engine total img/s")["value"] == "3.00 ± 0.20"
    mfu = _row(rows, "MFU at 24.6 GFLOP/img vs 332.8 GFLOP/s")
    # 73.8 / 332.8 = 0.2218, 78.72 / 332.8 = 0.2365
    assert mfu["value"] == "22.2 % (script 23.7 %)"
    # no 1-FMA-unit row: the stated peak is the CPU's (two 512-bit FMA pipes)
    assert not [r for r in rows if "1 FMA unit" in r["measure"]]


def test_build_table_skips_sections_not_run_and_formats_markdown():
    rows = bl.build_table({"cold_start": {"goal": 8.0, "startup_s": [11.0], "median_s": 11.0}})
    assert len(rows) == 1 and rows[0]["section"] == "cold start"
    text = bl.format_table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("| section") and set(lines[1]) <= {"|", "-"}
    assert "MISS" in lines[2] and len(lines) == 3
    assert bl.build_table({}) == []


def test_run_py_goals_match_the_issue():
    """The goals of hpclab issue 10, in one place (benchmarks/run.py GOALS)."""
    bench_run = _run_module()
    assert bench_run.GOALS == {
        "ab": 2.0,
        "loop": 1.0,
        "telemetry": 0.98,
        "start": 8.0,
        "trace": 2.0,
        "scaling": 0.9,
        "resnet50": 0.95,
    }
    full = bench_run.PLANS["full"]
    assert full["ab_rounds"] >= 5 and full["tel_pairs"] >= 5 and full["start_reps"] >= 3
    assert bench_run.HVD_CYCLES_MS == (0.05, 0.1, 0.5, 1.0, 5.0)
    sections = ("start", "ab", "telemetry", "horovod", "scaling", "resnet50", "files")
    assert bench_run.SECTIONS == sections


def test_goals_summary_lists_every_goal_of_the_sections_run():
    bench_run = _run_module()
    results = {
        "engine_vs_plain": {
            "ranks": {
                "1": {
                    "ratio_fit_median": 2.1,
                    "verdict_fit": "PASS",
                    "ratio_loop_median": 0.9,
                    "verdict_loop": "MISS",
                }
            }
        },
        "trace": {"compile_median_s": 1.5, "verdict": "PASS"},
        "resnet50": {"ratio_median": 0.97, "verdict": "PASS"},
    }
    goals = bench_run.goals_summary(results)
    assert [(g["value"], g["verdict"]) for g in goals] == [
        (2.1, "PASS"),
        (0.9, "MISS"),
        (1.5, "PASS"),
        (0.97, "PASS"),
    ]
    assert goals[1]["goal"] == "engine >= 1x hand-written loop at 1 rank(s)"


# -- a real tiny run -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.mpi
def test_run_py_quick_start_writes_results(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run.py"),
            "--quick",
            "--only",
            "start",
            "--quiet-wait",
            "0",  # the plumbing is under test, not the figures: no waiting for a quiet moment
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=500,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads(out.read_text())
    assert {
        "machine",
        "versions",
        "plan",
        "noise",
        "goals",
        "table",
        "cold_start",
        "sections",
    } <= set(results)
    assert results["sections"] == ["start"]
    assert "engine_vs_plain" not in results and results["errors"] == {}
    cs = results["cold_start"]
    assert len(cs["startup_s"]) == 2 and all(t > 0 for t in cs["startup_s"])
    assert cs["verdict"] in ("PASS", "MISS")
    assert results["machine"]["logical_cpus"] >= 1 and results["machine"]["cpu_model"]
    assert results["versions"]["horovod"] == "0.28.1"
    assert {r["section"] for r in results["table"]} == {"cold start"}
    assert len(cs["phases"]) == 2 and len(cs["idle_engine_cpu_fraction"]) == 2
    phases = {"controller_s", "engines_s", "tf_import_s", "horovod_init_s"}
    assert phases <= set(cs["phase_medians_s"])
    assert all(cs["phase_medians_s"][k] >= 0 for k in phases)
    assert "trace" not in results  # the start section runs no training
    assert [g["verdict"] for g in results["goals"]] == [cs["verdict"]]
    assert results["horovod_env"]["HOROVOD_CYCLE_TIME"]
    assert "cold start" in proc.stdout


def test_the_readme_figures_are_generated_from_results_json():
    """benchmarks/README.md's table is results.json's, as benchmarks/readme_table.py writes it
    (a hand-edited figure in it fails here)."""
    import readme_table

    assert readme_table.main(["--check"]) == 0

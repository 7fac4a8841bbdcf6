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
    assert bl.RESNET50_TRAIN_FLOP_PER_IMAGE == 24.6e9


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


def test_verdicts():
    assert bl.verdict(2.1, 2.0) == "PASS"
    assert bl.verdict(1.9, 2.0) == "MISS"
    assert bl.verdict(9.5, 10.0, higher_is_better=False) == "PASS"
    assert bl.verdict(10.5, 10.0, higher_is_better=False) == "MISS"
    assert bl.verdict(None, 1.0) == "n/a"
    assert bl.verdict(float("nan"), 1.0) == "n/a"


# -- the table -----------------------------------------------------------------------------------

RESULTS = {
    "engine_vs_plain": {
        "goal": 2.0,
        "ranks": {
            "1": {
                "engine_median": 48000.0,
                "plain_median": 16000.0,
                "ratio_median": 3.0,
                "wall_ratio_median": 2.5,
                "engine_cpu_us_per_sample": 20.0,
                "plain_cpu_us_per_sample": 50.0,
                "cpu_ratio": 2.5,
            },
            "2": {"engine_median": 30000.0, "plain_median": 20000.0, "ratio_median": 1.5},
        },
    },
    "telemetry": {"goal": 0.99, "ratio_median": 0.995, "engine_ratio_median": 1.001},
    "cold_start": {
        "goal": 10.0,
        "workers": 2,
        "startup_s": [9.0, 11.0, 12.0],
        "median_s": 11.0,
        "registered_median_s": 7.5,
        "horovod_init_median_s": 3.5,
        "idle_engine_cpu_fraction": [[0.3, 0.2], [0.25, 0.1], [0.4, 0.35]],
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
        "mfu": 73.8 / 332.8,
        "mfu_1fma": 73.8 / 166.4,
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


def test_build_table_values_and_verdicts():
    rows = bl.build_table(RESULTS)
    assert _row(rows, "1 rank(s): engine / fit")["value"] == "3.00x"
    assert _row(rows, "1 rank(s): engine / fit")["verdict"] == "PASS"
    assert _row(rows, "2 rank(s): engine / fit")["verdict"] == "MISS"
    assert _row(rows, "1 rank(s): engine samples/s")["value"] == "48,000"
    assert _row(rows, "1 rank(s): same, all-in")["value"] == "2.50x"
    # CPU-time figures stay in results.json only (too noisy on a shared machine for the table)
    assert not [r for r in rows if "CPU µs" in r["measure"]]
    assert _row(rows, "on (0.5 s) / off")["value"] == "0.995"
    assert _row(rows, "on (0.5 s) / off")["verdict"] == "PASS"
    start = _row(rows, "Lab(workers=2) startup_s, median of 3")
    assert (start["value"], start["verdict"]) == ("11.0 s", "MISS")
    assert _row(rows, "of which: engines registered")["value"] == "7.5 s / 3.5 s"
    # median of the six per-rank figures 0.1 0.2 0.25 0.3 0.35 0.4 = (0.25 + 0.3) / 2
    assert _row(rows, "idle engine CPU")["value"] == "0.28"
    assert _row(rows, "E = T2")["value"] == "0.950" and _row(rows, "E = T2")["verdict"] == "PASS"
    assert _row(rows, "E of each pair")["value"] == "0.95, 0.80, 0.97"
    assert _row(rows, "img/s per rank")["value"] == "1.50 ± 0.10"
    assert _row(rows, "total img/s")["value"] == "3.00 ± 0.20"
    mfu = _row(rows, "MFU at 24.6 GFLOP/img vs 332.8 GFLOP/s")
    assert mfu["value"] == "22.2 %"  # 73.8 / 332.8 = 0.2218
    assert _row(rows, "MFU vs 166.4")["value"] == "44.4 %"


def test_build_table_skips_sections_not_run_and_formats_markdown():
    rows = bl.build_table({"cold_start": {"goal": 10.0, "startup_s": [11.0], "median_s": 11.0}})
    assert len(rows) == 1 and rows[0]["section"] == "cold start"
    text = bl.format_table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("| section") and set(lines[1]) <= {"|", "-"}
    assert "MISS" in lines[2] and len(lines) == 3
    assert bl.build_table({}) == []


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
    assert len(cs["registered_s"]) == 2 and len(cs["idle_engine_cpu_fraction"]) == 2
    assert "cold start" in proc.stdout

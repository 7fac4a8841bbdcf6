"""Pure helpers of the benchmark suite: machine facts, peak FLOP/s and MFU, paired statistics,
goal verdicts and the results table. No TensorFlow, no MPI: unit-tested in tests/test_benchmarks.py.

Reference formulas (docs: /work/shared/DESIGN.md "Reference math"):

* Throughput the Horovod-benchmark way: skip warm-up intervals, mean ± 1.96 σ per rank, × ranks.
* Weak-scaling efficiency E(N) = T_N / (N · T_1) (fixed batch per rank).
* MFU = achieved FLOP/s ÷ peak FLOP/s, with achieved = images/s × FLOP/image; ResNet-50 training
  ≈ 24.6 GFLOP/image (forward + backward ≈ 3 × 4.1 GMAC forward, multiply-add = 2 FLOP).
* CPU FP32 peak = cores × clock × FLOP/cycle/core; FLOP/cycle/core = SIMD FP32 lanes × 2 (an FMA
  is a multiply and an add) × FMA units per core. AVX-512: 16 lanes -> 32 FLOP/cycle per FMA
  unit, 64 with the two 512-bit FMA units of Xeon Gold/Platinum-class cores; AVX2: 8 lanes -> 16
  per unit, 32 with two units.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

RESNET50_TRAIN_FLOP_PER_IMAGE = 24.6e9


# ---------------------------------------------------------------------------------------------
# machine
# ---------------------------------------------------------------------------------------------


def parse_cpuinfo(text: str) -> dict:
    """Model name, logical CPU count, clock (MHz, first CPU) and flags from /proc/cpuinfo text."""
    cpus, model, mhz, flags = 0, None, None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            cpus += 1
        elif key == "model name" and model is None:
            model = value
        elif key == "cpu MHz" and mhz is None:
            mhz = float(value)
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"model_name": model, "logical_cpus": cpus, "mhz": mhz, "flags": sorted(flags)}


def simd_fp32_lanes(flags: Iterable[str]) -> int:
    """FP32 lanes of the widest FMA-capable vector unit the flags announce."""
    flags = set(flags)
    if "avx512f" in flags:
        return 16
    if "avx2" in flags or "fma" in flags or "avx" in flags:
        return 8
    return 4  # SSE


def fp32_flop_per_cycle(flags: Iterable[str], fma_units: int = 2) -> int:
    """FP32 FLOP per cycle per core: lanes × 2 (FMA = multiply + add) × FMA units.

    Without the `fma` flag there is no fused multiply-add; a separate multiply and add port
    per unit give the same 2 FLOP per lane per cycle in the best case, so the formula holds.
    """
    if fma_units < 1:
        raise ValueError(f"fma_units must be >= 1; you passed fma_units={fma_units!r}.")
    return simd_fp32_lanes(flags) * 2 * int(fma_units)


def peak_flops(cores: int, ghz: float, flop_per_cycle: float) -> float:
    """Peak FLOP/s = cores × clock (GHz → Hz) × FLOP/cycle/core."""
    if cores < 1 or ghz <= 0 or flop_per_cycle <= 0:
        raise ValueError(
            f"peak_flops needs cores >= 1, ghz > 0 and flop_per_cycle > 0; "
            f"you passed {cores}, {ghz}, {flop_per_cycle}."
        )
    return cores * ghz * 1e9 * flop_per_cycle


def mfu(items_per_sec: float, flop_per_item: float, peak: float) -> float:
    """Model FLOP utilisation: items/s × FLOP/item ÷ peak FLOP/s."""
    if peak <= 0:
        raise ValueError(f"peak must be > 0 FLOP/s; you passed peak={peak!r}.")
    return items_per_sec * flop_per_item / peak


def peak_table(cpu: dict, cores: int) -> dict:
    """The stated peak (2 AVX-512 FMA units) and the conservative one (1 unit) for `cores`."""
    ghz = (cpu.get("mhz") or 0) / 1000.0
    flags = cpu.get("flags") or []
    main = fp32_flop_per_cycle(flags, 2)
    low = fp32_flop_per_cycle(flags, 1)
    return {
        "cores": cores,
        "ghz": ghz,
        "simd_fp32_lanes": simd_fp32_lanes(flags),
        "flop_per_cycle_per_core": main,
        "fma_units_assumed": 2,
        "peak_flops": peak_flops(cores, ghz, main) if ghz > 0 else None,
        "flop_per_cycle_per_core_1fma": low,
        "peak_flops_1fma": peak_flops(cores, ghz, low) if ghz > 0 else None,
        "assumption": (
            f"FP32, {simd_fp32_lanes(flags)} lanes x 2 (FMA) x 2 FMA units = {main} "
            f"FLOP/cycle/core at the /proc/cpuinfo clock {ghz:.2f} GHz, {cores} cores "
            "(no turbo, no AMX: AMX has no FP32 path); the 1-FMA-unit figure is "
            f"{low} FLOP/cycle/core"
        ),
    }


# ---------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(vals) if vals else float("nan")


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a[i] / b[i] for each repeat i (A and B measured back to back); pairs with b <= 0 dropped."""
    if len(a) != len(b):
        raise ValueError(
            f"paired_ratios needs equally many A and B repeats; got {len(a)} and {len(b)}."
        )
    return [
        float(x) / float(y)
        for x, y in zip(a, b)
        if x is not None and y is not None and float(y) > 0
    ]


def spread(values: Sequence[float]) -> float:
    """(max − min) / median: how far apart the repeats are (0 = identical)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(vals) < 2:
        return 0.0 if vals else float("nan")
    m = statistics.median(vals)
    return (max(vals) - min(vals)) / m if m else float("nan")


def weak_efficiency(t_n: float, t_1: float, n: int) -> float:
    """E(N) = T_N / (N · T_1)."""
    return t_n / (n * t_1) if t_1 and t_1 > 0 and n > 0 else float("nan")


def verdict(value: float | None, target: float, higher_is_better: bool = True) -> str:
    """PASS / MISS against a goal; n/a when the value is missing."""
    if value is None or not math.isfinite(value):
        return "n/a"
    ok = value >= target if higher_is_better else value <= target
    return "PASS" if ok else "MISS"


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------


def _fmt(value, spec: str = ",.0f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)


def build_table(results: dict) -> list[dict]:
    """One row per figure: {section, measure, value, goal, verdict}. Sections not run are skipped.

    `results` is what benchmarks/run.py writes to results.json (only the keys read here matter).
    """
    rows: list[dict] = []

    def row(section, measure, value, goal="", result=""):
        rows.append(
            {
                "section": section,
                "measure": measure,
                "value": value,
                "goal": goal,
                "verdict": result,
            }
        )

    ab = results.get("engine_vs_plain")
    if ab:
        goal = ab.get("goal", 2.0)
        for n in sorted(ab.get("ranks", {}), key=int):
            r = ab["ranks"][n]
            row(
                "engine vs model.fit",
                f"{n} rank(s): engine samples/s (median)",
                _fmt(r.get("engine_median")),
            )
            row(
                "engine vs model.fit",
                f"{n} rank(s): plain fit samples/s (median)",
                _fmt(r.get("plain_median")),
            )
            ratio = r.get("ratio_median")
            row(
                "engine vs model.fit",
                f"{n} rank(s): engine / fit (median of paired ratios)",
                _fmt(ratio, ".2f") + "x",
                f">= {goal:g}x",
                verdict(ratio, goal),
            )
            wall = r.get("wall_ratio_median")
            if wall is not None:
                row(
                    "engine vs model.fit",
                    f"{n} rank(s): same, all-in epoch wall rate",
                    _fmt(wall, ".2f") + "x",
                    "(cross-check)",
                    "",
                )
    tel = results.get("telemetry")
    if tel:
        goal = tel.get("goal", 0.99)
        ratio = tel.get("ratio_median")
        row(
            "live telemetry",
            "on (0.5 s) / off: epoch wall rate, median of paired ratios",
            _fmt(ratio, ".3f"),
            f">= {goal:g}",
            verdict(ratio, goal),
        )
        if tel.get("engine_ratio_median") is not None:
            row(
                "live telemetry",
                "on / off: engine's own samples/s",
                _fmt(tel["engine_ratio_median"], ".3f"),
                "(cross-check)",
                "",
            )
    cs = results.get("cold_start")
    if cs:
        goal = cs.get("goal", 10.0)
        med = cs.get("median_s")
        row(
            "cold start",
            f"Lab(workers={cs.get('workers', 2)}) startup_s, median of "
            f"{len(cs.get('startup_s', []))}",
            _fmt(med, ".1f") + " s",
            f"<= {goal:g} s",
            verdict(med, goal, higher_is_better=False),
        )
        if cs.get("registered_median_s") is not None:
            row(
                "cold start",
                "of which: engines registered / TF+Horovod init (medians)",
                f"{_fmt(cs['registered_median_s'], '.1f')} s / "
                f"{_fmt(cs.get('horovod_init_median_s'), '.1f')} s",
            )
        idle = cs.get("idle_engine_cpu_fraction")
        if idle:
            flat = [v for rep in idle for v in rep]
            row(
                "cold start",
                "idle engine CPU (fraction of a core per rank, median)",
                _fmt(median(flat), ".2f"),
            )
    ws = results.get("weak_scaling")
    if ws:
        goal = ws.get("goal", 0.9)
        row(
            "weak scaling",
            f"{ws.get('label', '')}: T1 samples/s (median)",
            _fmt(ws.get("t1_median"), ",.1f"),
        )
        row(
            "weak scaling",
            f"{ws.get('label', '')}: T2 samples/s (median)",
            _fmt(ws.get("t2_median"), ",.1f"),
        )
        eff = ws.get("efficiency_median")
        row(
            "weak scaling",
            "E = T2 / (2 T1), median of paired repeats",
            _fmt(eff, ".3f"),
            f">= {goal:g}",
            verdict(eff, goal),
        )
        if len(ws.get("efficiencies") or []) > 1:
            row(
                "weak scaling",
                "E of each pair, in run order",
                ", ".join(_fmt(e, ".2f") for e in ws["efficiencies"]),
            )
    rn = results.get("resnet50")
    if rn:
        row(
            "ResNet-50 synthetic",
            f"img/s per rank (batch {rn.get('batch_per_rank')}, {rn.get('ranks')} ranks)",
            f"{_fmt(rn.get('per_rank_mean'), '.2f')} ± {_fmt(rn.get('per_rank_ci95'), '.2f')}",
        )
        row(
            "ResNet-50 synthetic",
            f"total img/s on {rn.get('ranks')} ranks",
            f"{_fmt(rn.get('total_mean'), '.2f')} ± {_fmt(rn.get('total_ci95'), '.2f')}",
        )
        peak = rn.get("peak", {})
        if rn.get("mfu") is not None:
            row(
                "ResNet-50 synthetic",
                f"MFU at 24.6 GFLOP/img vs {_fmt((peak.get('peak_flops') or 0) / 1e9, '.1f')} "
                f"GFLOP/s peak ({peak.get('flop_per_cycle_per_core')} FLOP/cycle/core)",
                _fmt(100 * rn["mfu"], ".1f") + " %",
            )
        if rn.get("mfu_1fma") is not None:
            row(
                "ResNet-50 synthetic",
                f"MFU vs {_fmt((peak.get('peak_flops_1fma') or 0) / 1e9, '.1f')} GFLOP/s "
                f"({peak.get('flop_per_cycle_per_core_1fma')} FLOP/cycle/core, 1 FMA unit)",
                _fmt(100 * rn["mfu_1fma"], ".1f") + " %",
            )
    return rows


def format_table(rows: list[dict]) -> str:
    """A Markdown table of `build_table` rows (also readable in a terminal)."""
    head = ("section", "measure", "value", "goal", "verdict")
    cells = [head] + [tuple(str(r[k]) for k in head) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = []
    for j, c in enumerate(cells):
        lines.append("| " + " | ".join(s.ljust(w) for s, w in zip(c, widths)) + " |")
        if j == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)

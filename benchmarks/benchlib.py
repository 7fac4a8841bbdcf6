"""Pure helpers of the benchmark suite: machine facts, peak FLOP/s and MFU, paired statistics,
goal verdicts and the results table. No TensorFlow, no MPI: unit-tested in tests/test_benchmarks.py.

Reference formulas and where they come from:

* Throughput the Horovod-benchmark way (horovod/examples/tensorflow2/
  tensorflow2_synthetic_benchmark.py): skip warm-up intervals, mean ± 1.96 σ per rank, × ranks —
  :func:`hpclab.core.metrics.throughput_stats`, the same code the engine reports with.
* Weak-scaling efficiency E(N) = T_N / (N · T_1) (fixed batch per rank) —
  :func:`hpclab.core.metrics.efficiency`, re-exported here as `efficiency` (and `weak_efficiency`).
* MFU = achieved FLOP/s ÷ peak FLOP/s, with achieved = images/s × FLOP/image (the model-FLOP
  utilisation of Chowdhery et al. 2022, "PaLM", arXiv:2204.02311, appendix B). ResNet-50 training
  ≈ 23.1 GFLOP/image = 3 × 3.858·10⁹ multiply-adds × 2 FLOP each. The model benchmarked is
  `keras.applications.ResNet50`, which is ResNet v1 (the stride-2 sits on each stage's first
  1×1 convolution); its forward pass counted layer by layer (every Conv2D: output H × W × C_out ×
  k_h × k_w × C_in, plus the 2048×1000 Dense) is 3,857,973,248 multiply-adds per 224×224 image,
  He et al. 2016 (arXiv:1512.03385, Table 1) quote 3.8·10⁹; the 4.1·10⁹ of torchvision's table
  is v1.5 (stride on the 3×3), not this model. Backward ≈ 2 × forward (Kaplan et al. 2020,
  arXiv:2001.08361, sec. 2.1).
* CPU FP32 peak = cores × clock × FLOP/cycle/core; FLOP/cycle/core = SIMD FP32 lanes × 2 (an FMA
  is a multiply and an add) × FMA units per core (Intel 64 and IA-32 Architectures Optimization
  Reference Manual). AVX-512: 16 lanes -> 32 FLOP/cycle per FMA unit, 64 with the two 512-bit FMA
  units of Xeon Gold/Platinum-class cores; AVX2: 8 lanes -> 16 per unit, 32 with two units.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence

from hpclab.core.metrics import efficiency

RESNET50_FORWARD_MACS = 3_857_973_248  # keras.applications.ResNet50 (v1), 224x224x3, counted
RESNET50_TRAIN_FLOP_PER_IMAGE = 3 * 2 * RESNET50_FORWARD_MACS  # ≈ 23.1e9


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


def summarize(values: Sequence[float]) -> dict:
    """Median, min, max, count and relative spread of one arm's repeats (None/NaN ignored)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return {
        "median": median(vals),
        "min": min(vals) if vals else float("nan"),
        "max": max(vals) if vals else float("nan"),
        "n": len(vals),
        "spread": spread(vals),
        "values": vals,
    }


def rotations(arms: Sequence[str], rounds: int) -> list[tuple[str, ...]]:
    """The run order of each round: `arms` rotated by one more place every round, so that over
    len(arms) rounds each arm runs once in every position (A B C, B C A, C A B, A B C, ...)."""
    if rounds < 0 or not arms:
        raise ValueError(f"rotations needs arms and rounds >= 0; you passed {arms!r}, {rounds!r}.")
    n = len(arms)
    return [tuple(arms[(i + j) % n] for j in range(n)) for i in range(rounds)]


def compile_seconds(
    trace_s: float | None, first_call_s: float | None, first_steps: int, step_s: float | None
) -> float | None:
    """Trace + compile seconds of one run: the explicit trace plus what the first call took beyond
    its `first_steps` optimizer steps at the run's steady step time `step_s` (first execution of a
    graph runs Grappler and creates kernels). None when the run did not report the figures."""
    if trace_s is None or first_call_s is None:
        return None
    work = first_steps * step_s if step_s is not None and math.isfinite(step_s) else 0.0
    return float(trace_s) + max(0.0, float(first_call_s) - work)


def parse_result_line(stdout: str) -> dict | None:
    """The last JSON result line (starting with '{"benchmark"') a benchmark script printed; Keras
    progress bars end lines with carriage returns, so those split lines too."""
    lines = [ln for ln in stdout.replace("\r", "\n").splitlines() if ln.startswith('{"benchmark"')]
    return json.loads(lines[-1]) if lines else None


#: E(N) = T_N / (N · T_1): one implementation, in hpclab.core.metrics; this is the name run.py uses.
weak_efficiency = efficiency


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


def _arm(summary: dict | None, spec: str = ",.0f") -> str:
    """'median [min – max]' of a :func:`summarize` dict."""
    if not summary:
        return "n/a"
    med = _fmt(summary.get("median"), spec)
    if (summary.get("n") or 0) < 2:
        return med
    return f"{med} [{_fmt(summary.get('min'), spec)} – {_fmt(summary.get('max'), spec)}]"


def build_table(results: dict) -> list[dict]:
    """One row per figure: {section, measure, value, goal, verdict}. Sections not run are skipped.

    `results` is what benchmarks/run.py writes to results.json (only the keys read here matter).
    Arms are shown as "median [min – max]" over their repeats.
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
        sec = "engine vs fit vs loop"
        goal, goal_loop = ab.get("goal", 2.0), ab.get("goal_loop", 1.0)
        for n in sorted(ab.get("ranks", {}), key=int):
            r = ab["ranks"][n]
            rounds = (r.get("engine") or {}).get("n", 0)
            arms = (
                ("engine", "A engine"),
                ("fit", "B model.fit"),
                ("fit_tuned", "B' model.fit, steps_per_execution tuned"),
                ("loop", "C loop (tf.data iterator, per-tensor allreduce)"),
                ("graph_loop", "D in-graph loop (the ceiling)"),
            )
            for arm, name in arms:
                if r.get(arm) is None:
                    continue  # (results from before the arm existed)
                row(
                    sec,
                    f"{n} rank(s): {name} samples/s, median [min – max] of {rounds}",
                    _arm(r.get(arm)),
                )
            if r.get("ratio_fit_tuned_median") is not None:
                row(
                    sec,
                    f"{n} rank(s): engine / tuned fit (median of paired ratios)",
                    _fmt(r["ratio_fit_tuned_median"], ".2f") + "x",
                    "(reported)",
                )
            if r.get("ratio_graph_loop_median") is not None:
                ratio = r["ratio_graph_loop_median"]
                row(
                    sec,
                    f"{n} rank(s): engine / in-graph loop, the ceiling (median of paired ratios)",
                    _fmt(ratio, ".2f") + "x",
                    f">= {goal_loop:g}x",
                    verdict(ratio, goal_loop),
                )
            ratio = r.get("ratio_fit_median")
            row(
                sec,
                f"{n} rank(s): engine / fit (median of paired ratios)",
                _fmt(ratio, ".2f") + "x",
                f">= {goal:g}x",
                verdict(ratio, goal),
            )
            ratio = r.get("ratio_loop_median")
            row(
                sec,
                f"{n} rank(s): engine / loop (median of paired ratios)",
                _fmt(ratio, ".2f") + "x",
                f">= {goal_loop:g}x",
                verdict(ratio, goal_loop),
            )
            if r.get("wall_ratio_fit_median") is not None:
                row(
                    sec,
                    f"{n} rank(s): same, all-in epoch wall rate: engine / fit, engine / loop",
                    f"{_fmt(r['wall_ratio_fit_median'], '.2f')}x, "
                    f"{_fmt(r.get('wall_ratio_loop_median'), '.2f')}x",
                    "(cross-check)",
                )
            cross = r.get("cross_check")
            if cross:
                row(
                    sec,
                    f"{n} rank(s): fit, loop with Horovod's own defaults (no HOROVOD_* env)",
                    f"{_fmt(cross.get('fit_samples_per_sec'))}, "
                    f"{_fmt(cross.get('loop_samples_per_sec'))}",
                    "(cross-check)",
                )
    tel = results.get("telemetry")
    if tel:
        goal = tel.get("goal", 0.98)
        ratio = tel.get("ratio_median")
        row(
            "live telemetry",
            f"on / really off: epoch wall rate, median of {len(tel.get('ratios') or [])} "
            "paired ratios",
            _fmt(ratio, ".3f"),
            f">= {goal:g}",
            verdict(ratio, goal),
        )
        if tel.get("engine_ratio_median") is not None:
            row(
                "live telemetry",
                "on / really off: engine's own samples/s",
                _fmt(tel["engine_ratio_median"], ".3f"),
                "(cross-check)",
            )
    tr = results.get("trace")
    if tr:
        goal = tr.get("goal", 2.0)
        med = tr.get("compile_median_s")
        if tr.get("runs_counted"):
            row(
                "trace + compile",
                f"per cnn1d run after the first on a Lab, median of {tr['runs_counted']}",
                _fmt(med, ".2f") + " s",
                f"<= {goal:g} s",
                verdict(med, goal, higher_is_better=False),
            )
            row(
                "trace + compile",
                "of which: trace_s / first_call_s (medians)",
                f"{_fmt(tr.get('trace_median_s'), '.2f')} s / "
                f"{_fmt(tr.get('first_call_median_s'), '.2f')} s",
            )
        for model, m in (tr.get("by_model_after_first") or {}).items():
            if model != "cnn1d" and m.get("compile_s") is not None:
                row(
                    "trace + compile",
                    f"{model}, runs after the first on a Lab: compile (trace_s + first call)",
                    f"{_fmt(m['compile_s'], '.2f')} s ({_fmt(m.get('trace_s'), '.2f')} s + "
                    f"{_fmt(m.get('first_call_s'), '.2f')} s)",
                )
        if tr.get("first_run_on_lab_compile_median_s") is not None:
            row(
                "trace + compile",
                "first run on a fresh Lab (median, all models)",
                _fmt(tr["first_run_on_lab_compile_median_s"], ".2f") + " s",
            )
    cs = results.get("cold_start")
    if cs:
        goal = cs.get("goal", 8.0)
        med = cs.get("median_s")
        row(
            "cold start",
            f"Lab(workers={cs.get('workers', 2)}) total, median of {len(cs.get('startup_s', []))}",
            _fmt(med, ".1f") + " s",
            f"<= {goal:g} s",
            verdict(med, goal, higher_is_better=False),
        )
        ph = cs.get("phase_medians_s") or {}
        names = [
            k for k in ("controller_s", "engines_s", "tf_import_s", "horovod_init_s") if k in ph
        ]
        if names:
            row(
                "cold start",
                "controller / engines registered / TF import / Horovod init (medians)",
                " / ".join(f"{_fmt(ph[k], '.1f')} s" for k in names),
            )
        idle = cs.get("idle_engine_cpu_fraction")
        if idle:
            flat = [v for rep in idle for v in rep]
            row(
                "cold start",
                "idle engine CPU (fraction of a core per rank, median)",
                _fmt(median(flat), ".2f"),
            )
    hv = results.get("horovod")
    if hv:
        default = (hv.get("default") or {}).get("label")
        for label, st in (hv.get("settings") or {}).items():
            ratio = st.get("ratio_to_default")
            row(
                "Horovod settings (2 ranks)",
                f"{label}{' (default)' if label == default else ''}: samples/s, ratio to default",
                f"{_arm(st.get('samples_per_sec'))}, {_fmt(ratio, '.3f')}",
            )
        idle = hv.get("idle_engine_cpu_fraction") or {}
        if idle:
            row(
                "Horovod settings (2 ranks)",
                "idle engine CPU by cycle time: fraction of a core per rank, median (sum of ranks)",
                ", ".join(
                    f"{c} ms: {_fmt(median(v), '.2f')} (sum {_fmt(sum(v), '.2f')})"
                    for c, v in idle.items()
                ),
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
        sec = "ResNet-50 synthetic"
        where = f"batch {rn.get('batch_per_rank')}, {rn.get('ranks')} ranks"
        row(
            sec,
            f"engine img/s per rank ({where})",
            f"{_fmt(rn.get('per_rank_mean'), '.2f')} ± {_fmt(rn.get('per_rank_ci95'), '.2f')}",
        )
        if rn.get("script_per_rank_mean") is not None:
            row(
                sec,
                f"Horovod synthetic-benchmark logic img/s per rank ({where})",
                f"{_fmt(rn.get('script_per_rank_mean'), '.2f')} ± "
                f"{_fmt(rn.get('script_per_rank_ci95'), '.2f')}",
            )
        if rn.get("ratio_median") is not None or "goal" in rn:
            goal = rn.get("goal", 0.95)
            ratio = rn.get("ratio_median")
            row(
                sec,
                "engine / Horovod script (median of paired ratios)",
                _fmt(ratio, ".3f"),
                f">= {goal:g}",
                verdict(ratio, goal),
            )
        row(
            sec,
            f"engine total img/s on {rn.get('ranks')} ranks",
            f"{_fmt(rn.get('total_mean'), '.2f')} ± {_fmt(rn.get('total_ci95'), '.2f')}",
        )
        peak = rn.get("peak", {})
        script = rn.get("script_mfu") or {}
        if rn.get("mfu") is not None:
            both = _fmt(100 * rn["mfu"], ".1f") + " %"
            if script.get("mfu") is not None:
                both += f" (script {_fmt(100 * script['mfu'], '.1f')} %)"
            flop = rn.get("flop_per_image", 24.6e9)  # (results from before the v1 count)
            row(
                sec,
                f"MFU at {flop / 1e9:.1f} GFLOP/img vs "
                f"{_fmt((peak.get('peak_flops') or 0) / 1e9, '.1f')} "
                f"GFLOP/s peak ({peak.get('flop_per_cycle_per_core')} FLOP/cycle/core)",
                both,
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

"""hpclab benchmark suite (`make bench`): measured side by side in one run, written to results.json.

Sections (`--only` takes a comma-separated subset; they run in this order):

  start      cold start of `Lab(workers=2)` split by `Lab.startup_phases` into controller, engines
             registered, TensorFlow import and Horovod init (max over ranks); median of >= 3 fresh
             labs; idle engine CPU. Goal total <= 8 s.
  ab         three arms at 1 and 2 ranks, alternated in rotating order over >= 5 rounds:
             (A) the hpclab engine (default RunConfig, MNIST-1D 40k, batch 64/rank),
             (B) plain_horovod_fit.py, Horovod's tensorflow2_keras_mnist.py way (`model.fit`),
             (C) plain_horovod_loop.py, Horovod's tensorflow2_mnist.py way (DistributedGradientTape,
                 K = 8 steps per `tf.function` call over a prefetched tf.data iterator);
             same cnn1d model, data, shard, batch and one thread per rank. Every arm runs with the
             engine's Horovod environment (HOROVOD_CYCLE_TIME / HOROVOD_FUSION_THRESHOLD from the
             RunConfig defaults); B and C once more with Horovod's own defaults as a cross-check.
             Medians, min/max per arm, medians of the paired ratios. Goals A/B >= 2, A/C >= 1.
  telemetry  live telemetry on (the defaults) vs really off (publish_every_s=0,
             noise_scale=False, time_split=False), 2 ranks, alternated, >= 5 pairs. Goal on/off
             >= 0.98.
  horovod    the evidence for the engine's Horovod defaults, 2 ranks: throughput for cycle times
             0.05 / 0.1 / 0.5 / 1 / 5 ms (fusion 64 MB), fusion 0 vs 64 MB at the chosen cycle,
             grouped vs per-tensor allreduce, and idle engine CPU at each cycle time.
  scaling    weak scaling 1 -> 2 ranks on a compute-bound configuration (resnet20, synthetic
             32x32x3 images, batch 64 per rank, one thread per rank), alternated.
             E = T2 / (2 T1). Goal >= 0.9.
  resnet50   ResNet-50 (synthetic 224x224x3, 1000 classes) on the engine side by side with
             horovod_synthetic.py (the logic of Horovod's tensorflow2_synthetic_benchmark.py) at
             the same batch and ranks: img/s per rank mean ± 1.96 σ, the ratio (goal >= 0.95) and
             MFU at 23.1 GFLOP/image (keras ResNet50 is v1: 3.86 G multiply-adds forward,
             counted) against the CPU's FP32 peak from /proc/cpuinfo (two FMA units).
  files      your own data from TFRecord files, 2 ranks, one model and batch: the engine
             streaming (tf.data), resident, streaming copies staged to node-local storage, and
             plain_horovod_files.py (a plain tf.data Horovod script), alternated
             (benchmarks/files_bench.py).

Every engine run also yields its trace/compile seconds (`trace_s`, `first_call_s` of its summary):
results["trace"] reports the median over the cnn1d runs after the first on each Lab (goal <= 2 s).
The load (loadavg, machine CPU busy, steal) during each section goes to results["noise"].

Usage:  .venv/bin/python benchmarks/run.py [--quick] [--only start,ab] [--out PATH]
Full run ~35 min on 2 cores; --quick ~15 min (fewer repeats, shorter runs; default output
benchmarks/results-quick.json so it never overwrites the full results).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import benchlib as bl  # noqa: E402  (benchmarks/ is not a package)

SECTIONS = ("start", "ab", "telemetry", "horovod", "scaling", "resnet50", "files")
FIT_SCRIPT = HERE / "plain_horovod_fit.py"
LOOP_SCRIPT = HERE / "plain_horovod_loop.py"
SYNTHETIC_SCRIPT = HERE / "horovod_synthetic.py"
LOOP_STEPS_PER_CALL = 8
TUNED_STEPS = 32  # B tuned's steps_per_execution and D's steps per tf.while_loop call
HOROVOD_VARS = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD")

# How much of everything: rounds, repeats and run lengths.
PLANS = {
    "full": {
        # at most one Lab alive at a time and none while a plain script runs: idle Horovod engines
        # are not idle (their background loop cycles every HOROVOD_CYCLE_TIME; see `horovod`)
        "exclusive_labs": True,
        "start_reps": 3,
        "ab_rounds": 5,
        "ab_epochs": 4,
        "tel_pairs": 6,
        "tel_epochs": 6,
        "tel_pair_epochs": 40,
        "hvd_rounds": 2,
        "hvd_reps": 2,
        "hvd_epochs": 3,
        "idle_s": 3.0,
        "scale_pairs": 3,
        "scale_steps": 40,
        "r50_batch": 8,
        "r50_pairs": 2,
        "r50_batches_per_iter": 2,
        "r50_iters": 5,
        "files_rounds": 3,
        "files_epochs": 3,
    },
    # quick: a smoke run of every code path (1-2 repeats, short runs), not for the published figures.
    "quick": {
        "exclusive_labs": True,
        "start_reps": 2,
        "ab_rounds": 1,
        "ab_epochs": 2,
        "tel_pairs": 1,
        "tel_epochs": 3,
        "tel_pair_epochs": 12,
        "hvd_rounds": 1,
        "hvd_reps": 1,
        "hvd_epochs": 2,
        "idle_s": 3.0,
        "scale_pairs": 1,
        "scale_steps": 16,
        "r50_batch": 8,
        "r50_pairs": 1,
        "r50_batches_per_iter": 1,
        "r50_iters": 3,
        "files_rounds": 1,
        "files_epochs": 2,
    },
}

GOALS = {
    "ab": 2.0,  # engine / model.fit, at 1 and 2 ranks
    "loop": 1.0,  # engine / hand-written compiled loop
    "telemetry": 0.98,  # on / really off
    "start": 8.0,  # seconds, 2-rank cold start with Horovod ready
    "trace": 2.0,  # seconds of trace + compile per run after the first on a Lab
    "scaling": 0.9,  # weak-scaling efficiency 1 -> 2 ranks
    "resnet50": 0.95,  # engine / Horovod synthetic-benchmark logic, img/s per rank
}
HVD_CYCLES_MS = (0.05, 0.1, 0.5, 1.0, 5.0)
RUN_TIMEOUT_S = 900


# ---------------------------------------------------------------------------------------------
# machine and noise
# ---------------------------------------------------------------------------------------------


def machine_info() -> dict:
    cpu = bl.parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    flags = set(cpu["flags"])
    return {
        "cpu_model": cpu["model_name"],
        "logical_cpus": cpu["logical_cpus"],
        "os_cpu_count": os.cpu_count(),
        "cpu_mhz": cpu["mhz"],
        "simd": [
            f
            for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")
            if f in flags
        ],
        "hypervisor": "hypervisor" in flags,
        "memory_gb": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "gpu": "none",
    }


def package_versions() -> dict:
    out = {}
    for dist in (
        "tensorflow-cpu",
        "tensorflow",
        "keras",
        "horovod",
        "numpy",
        "mpi4py",
        "mpich",
        "ipyparallel",
    ):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _cpu_times() -> tuple[float, float, float]:
    """(busy, total, steal) jiffies of the whole machine from /proc/stat."""
    parts = [float(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0.0)
    steal = parts[7] if len(parts) > 7 else 0.0
    total = sum(parts[:8])
    return total - idle, total, steal


def busy_fraction(seconds: float = 1.0) -> float:
    """Machine-wide CPU busy fraction over the next `seconds` (1.0 = every core busy)."""
    busy0, total0, _ = _cpu_times()
    time.sleep(seconds)
    busy1, total1, _ = _cpu_times()
    return (busy1 - busy0) / max(total1 - total0, 1.0)


def wait_for_quiet(max_wait_s: float, threshold: float = 0.5) -> dict:
    """Before a measurement: wait (at most `max_wait_s`) for a 1 s window in which the machine is
    less than `threshold` busy, i.e. the other engineers' jobs leave a core free. Returns what it
    saw, for the record; never fails."""
    t0 = time.perf_counter()
    busy = busy_fraction(0.5)
    while busy >= threshold and time.perf_counter() - t0 < max_wait_s:
        busy = busy_fraction(1.0)
    return {"waited_s": round(time.perf_counter() - t0, 1), "busy": round(busy, 2)}


class Noise:
    """Load average and machine-wide CPU use around a section (others share this machine)."""

    def __enter__(self):
        self.load0 = os.getloadavg()
        self.cpu0 = _cpu_times()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        busy1, total1, steal1 = _cpu_times()
        busy0, total0, steal0 = self.cpu0
        dtotal = max(total1 - total0, 1.0)
        self.record = {
            "seconds": round(time.perf_counter() - self.t0, 1),
            "loadavg_1min_before": round(self.load0[0], 2),
            "loadavg_1min_after": round(os.getloadavg()[0], 2),
            "machine_cpu_busy_fraction": round((busy1 - busy0) / dtotal, 3),
            "steal_fraction": round((steal1 - steal0) / dtotal, 4),
        }
        return False


# ---------------------------------------------------------------------------------------------
# one engine run, one plain run
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# one engine run, one script run
# ---------------------------------------------------------------------------------------------


def _rank_cpu_seconds(lab) -> list[float]:
    """user+system CPU seconds so far of every rank's engine process (all its threads)."""
    import psutil

    out = []
    for r in lab.ranks:
        t = psutil.Process(r["pid"]).cpu_times()
        out.append(t.user + t.system)
    return out


def _idle_engine_cpu(lab, seconds: float) -> list[float]:
    """Fraction of a core each rank's engine uses while no run is going on."""
    time.sleep(1.0)  # let start-up work settle
    c0 = _rank_cpu_seconds(lab)
    time.sleep(seconds)
    return [round((b - a) / seconds, 3) for a, b in zip(c0, _rank_cpu_seconds(lab))]


def _lab_key(lab) -> tuple:
    """Identifies one set of engine processes (a restart gives new pids)."""
    return tuple(r["pid"] for r in lab.ranks)


def horovod_env_of(settings=None) -> dict[str, str]:
    """The Horovod environment a Lab with these EngineSettings (default: a Lab's own) gives its
    engines (hpclab.core.engine_settings.EngineSettings.env)."""
    from hpclab.core.engine_settings import EngineSettings

    return (settings or EngineSettings()).env()


def _settings_key(settings) -> tuple:
    """The engine settings a benchmark varies: Horovod's cycle time and fusion buffer."""
    return (settings.cycle_time_ms, settings.fusion_mb)


def engine_run(lab, cfg) -> dict:
    """Run `cfg` on `lab` and keep the figures the comparisons need."""
    from hpclab.rank.trainer import FIRST_CALL_STEPS

    cpu0 = _rank_cpu_seconds(lab)
    run = lab.run(cfg)  # restarts the engines first when cfg's Horovod settings differ
    s = run.wait(timeout=RUN_TIMEOUT_S)
    try:
        cpu = [b - a for a, b in zip(cpu0, _rank_cpu_seconds(lab))]
    except Exception:  # noqa: BLE001 — the engines were restarted: their pids changed
        cpu = None
    epochs = run.epochs
    rates = [float(v) for v in epochs["samples_per_sec"]] if len(epochs) else []
    steady = rates[1:] or rates
    hist = run.history
    split = {}
    if len(hist) > 2 and "step_ms" in hist:  # telemetry on: the engine's own per-step split
        from hpclab.core.pop import PARTS

        later = hist.iloc[len(hist) // 4 :]  # past the first call
        split = {f"{p}_ms_per_step": float(later[f"{p}_ms"].mean()) for p in PARTS}
        split["load_balance"] = float(later["load_balance"].mean())
    workers = s.get("world_size") or lab.workers
    first_steps = min(  # the trainer's first call: capped by the epoch and the run
        cfg.steps_per_call or FIRST_CALL_STEPS,
        cfg.for_workers(workers).steps_per_epoch,
        cfg.for_workers(workers).total_steps,
    )
    sps = s["samples_per_sec"]
    step_s = cfg.for_workers(workers).global_batch / sps if sps and sps > 0 else None
    return {
        **split,
        "samples_per_sec": sps,
        "samples_per_sec_ci95": s["samples_per_sec_ci95"],
        "intervals": s.get("throughput_intervals"),
        "rank_samples_per_sec": s["rank_samples_per_sec"],
        "epoch_samples_per_sec": rates,
        "steady_epoch_samples_per_sec": sum(steady) / len(steady) if steady else None,
        "train_time_s": s["train_time_s"],
        "steps": s["steps"],
        "setup_s": s.get("setup_s"),
        "trace_s": s.get("trace_s"),
        "first_call_s": s.get("first_call_s"),
        "first_call_steps": first_steps,
        "compile_s": bl.compile_seconds(
            s.get("trace_s"), s.get("first_call_s"), first_steps, step_s
        ),
        "rank_cpu_s": cpu,
        "val_accuracy": s.get("val_accuracy"),
        "input_pipeline": s.get("input_pipeline"),  # a file dataset's reads (section files)
        "loadavg_1min": round(os.getloadavg()[0], 2),
        "versions": s.get("versions"),
    }


def script_run(script: Path, ranks: int, args: list, horovod: dict | None) -> dict:
    """`script` under mpiexec on `ranks` ranks; its JSON result line as a dict.

    `horovod` is the HOROVOD_* environment to give it (the engine's: EngineSettings.env());
    None runs it with Horovod's own defaults (HOROVOD_CYCLE_TIME / HOROVOD_FUSION_THRESHOLD
    unset, also when `--env` set them)."""
    from hpclab.cluster.host import find_mpiexec

    cmd = [find_mpiexec(), "-n", str(ranks), sys.executable, str(script), *map(str, args)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for key in HOROVOD_VARS:
        env.pop(key, None)
    env.update(horovod or {})
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S)
    wall = time.perf_counter() - t0
    result = bl.parse_result_line(proc.stdout)
    if proc.returncode != 0 or result is None:
        raise RuntimeError(
            f"{script.name} on {ranks} rank(s) exited {proc.returncode} "
            f"without a result line; its stderr ends with:\n{proc.stderr[-2000:]}"
        )
    result["launch_wall_s"] = wall
    result["horovod_env_given"] = horovod if horovod is not None else "Horovod defaults"
    result["loadavg_1min"] = round(os.getloadavg()[0], 2)
    return result


def _script_args(epochs: int, batch: int, num_samples: int, *extra) -> list:
    """The flags B and C share (same data, batch, epochs, one thread per rank), then their own."""
    common = ["--batch", batch, "--epochs", epochs, "--num-samples", num_samples, "--threads", 1]
    return [*common, *extra]


def fit_args(epochs: int, batch: int = 64, num_samples: int = 40000) -> list:
    return _script_args(epochs, batch, num_samples, "--interval", LOOP_STEPS_PER_CALL)


def loop_args(epochs: int, batch: int = 64, num_samples: int = 40000) -> list:
    return _script_args(epochs, batch, num_samples, "--steps-per-call", LOOP_STEPS_PER_CALL)


def fit_tuned_args(epochs: int, batch: int = 64, num_samples: int = 40000) -> list:
    """B tuned: TUNED_STEPS batches per compiled call, no progress bar (a window is one call)."""
    k = TUNED_STEPS
    extra = ("--steps-per-execution", k, "--interval", k, "--verbose", 0)
    return _script_args(epochs, batch, num_samples, *extra)


def graph_loop_args(epochs: int, batch: int = 64, num_samples: int = 40000) -> list:
    """D, the ceiling: resident batches gathered in the graph, one grouped allreduce."""
    extra = ("--steps-per-call", TUNED_STEPS, "--input", "resident", "--num-groups", 1)
    return _script_args(epochs, batch, num_samples, *extra)


# ---------------------------------------------------------------------------------------------
# the suite
# ---------------------------------------------------------------------------------------------


class Suite:
    """Runs the sections. Labs are started on demand; with `exclusive` at most one Lab is alive at
    a time and none while a plain script runs, because idle Horovod engines are not idle: their
    background thread negotiates over MPI every HOROVOD_CYCLE_TIME (the `horovod` section
    measures what that costs an idle engine)."""

    def __init__(self, plan: dict, runs_dir: Path, log=print, quiet_wait_s: float = 0.0):
        self.plan, self.runs_dir, self.log = plan, runs_dir, log
        self.exclusive = plan.get("exclusive_labs", True)
        self.quiet_wait_s = quiet_wait_s
        self.quiet: dict[str, list] = {}
        self.labs: dict[int, object] = {}
        self.lab_env: dict[int, tuple | None] = {}  # the Horovod settings each Lab was warmed with
        self.runs_on: dict[tuple, int] = {}  # engine runs so far on each set of engine processes
        self.traces: list[dict] = []  # trace/compile figures of every engine run
        self.other_startups: list[float] = []
        self.lab_failures: list[str] = []  # Lab starts that failed and were retried
        self.engine_versions: dict | None = None
        self.section = ""
        self.warm_cfg = None  # run first on a fresh (or restarted) Lab: one-time costs

    # -- labs ---------------------------------------------------------------------------------
    def lab(self, workers: int):
        from hpclab import Lab
        from hpclab.core.errors import LabError

        if workers not in self.labs:
            if self.exclusive:
                self.release()
            try:
                lab = Lab(
                    workers=workers, threads_per_worker=1, runs_dir=self.runs_dir, verbose=False
                )
            except LabError as exc:  # seen once: engines that never registered; retry once
                self.lab_failures.append(f"{self.section}: {str(exc)[:300]}")
                self.log(f"  Lab(workers={workers}) failed to start ({str(exc)[:120]}); retrying")
                lab = Lab(
                    workers=workers, threads_per_worker=1, runs_dir=self.runs_dir, verbose=False
                )
            self.labs[workers] = lab
            self.lab_env[workers] = None
            self.other_startups.append(lab.startup_s)
            self.log(f"  Lab(workers={workers}) ready in {lab.startup_s:.1f} s")
        return self.labs[workers]

    def release(self) -> None:
        """Stop every Lab (before a plain script, or before another Lab when exclusive)."""
        for lab in self.labs.values():
            lab.stop()
        self.labs.clear()
        self.lab_env.clear()

    close = release

    def _script(self, script: Path, ranks: int, args: list, horovod: dict | None) -> dict:
        if self.exclusive:
            self.release()
        return script_run(script, ranks, args, horovod)

    def _quiet(self, section: str) -> None:
        if self.quiet_wait_s > 0:
            self.quiet.setdefault(section, []).append(wait_for_quiet(self.quiet_wait_s))

    def _engine(self, workers: int, cfg, *, settings=None, warm: bool = True) -> dict:
        """One engine run of `cfg` on a Lab with these Horovod settings (`EngineSettings`;
        default: a Lab's own; other ones restart its engines); first, on a fresh Lab or one just
        restarted for other settings, the section's warm-up run (`warm_cfg`)."""
        from hpclab.core.engine_settings import EngineSettings

        lab = self.lab(workers)
        settings = settings or EngineSettings()
        wanted = lab.engine_settings.replace(
            cycle_time_ms=settings.cycle_time_ms, fusion_mb=settings.fusion_mb
        )
        if wanted != lab.engine_settings:
            lab.restart(settings=wanted)  # Horovod reads them at hvd.init(): fresh engines
        key = _settings_key(wanted)
        if warm and self.warm_cfg is not None and self.lab_env.get(workers) != key:
            self._record(lab, self.warm_cfg, engine_run(lab, self.warm_cfg), warm=True)
        self.lab_env[workers] = key
        return self._record(lab, cfg, engine_run(lab, cfg), warm=False)

    def _record(self, lab, cfg, r: dict, *, warm: bool) -> dict:
        self.engine_versions = self.engine_versions or r.get("versions")
        r.pop("versions", None)
        key = _lab_key(lab)
        index = self.runs_on.get(key, 0)
        self.runs_on[key] = index + 1
        self.traces.append(
            {
                "section": self.section,
                "workers": lab.workers,
                "model": cfg.model,
                "warm_up_run": warm,
                "run_on_lab": index,  # 0 = the first run on these engine processes
                **{k: r.get(k) for k in ("setup_s", "trace_s", "first_call_s", "compile_s")},
                "first_call_steps": r.get("first_call_steps"),
            }
        )
        return r

    # -- sections -----------------------------------------------------------------------------
    def start(self) -> dict:
        from hpclab import Lab

        if self.labs:
            raise RuntimeError("the cold-start section must run before any other Lab exists")
        totals, phases, stops, idle = [], [], [], []
        for i in range(self.plan["start_reps"]):
            self._quiet("start")
            lab = Lab(workers=2, threads_per_worker=1, runs_dir=self.runs_dir, verbose=False)
            ph = dict(getattr(lab, "startup_phases", None) or {})
            totals.append(ph.get("total_s", lab.startup_s))
            phases.append(ph)
            idle.append(_idle_engine_cpu(lab, seconds=self.plan["idle_s"]))
            t0 = time.perf_counter()
            lab.stop()
            stops.append(time.perf_counter() - t0)
            parts = ", ".join(f"{k} {v:.2f}" for k, v in ph.items() if isinstance(v, float))
            self.log(
                f"  start {i + 1}: {totals[-1]:.2f} s ({parts or 'no startup_phases'}); idle "
                f"engines use {idle[-1]} of a core each; stop {stops[-1]:.1f} s"
            )
        med = bl.median(totals)
        keys = sorted({k for ph in phases for k in ph if k != "total_s"})
        return {
            "workers": 2,
            "horovod_env": horovod_env_of(),
            "startup_s": totals,
            "median_s": med,
            "spread": bl.spread(totals),
            "phases": phases,
            "phase_medians_s": {k: bl.median([ph.get(k) for ph in phases]) for k in keys},
            "stop_s": stops,
            "idle_engine_cpu_fraction": idle,
            "goal": GOALS["start"],
            "verdict": bl.verdict(med, GOALS["start"], higher_is_better=False),
        }

    def ab(self) -> dict:
        from hpclab import RunConfig

        epochs = self.plan["ab_epochs"]
        # The engine exactly as a user gets it: default RunConfig (auto-sized calls, live
        # telemetry every 0.5 s, gradient-noise bookkeeping on), only size/batch/epochs set.
        cfg = RunConfig(num_samples=40000, batch_per_worker=64, epochs=epochs)
        hv = horovod_env_of()  # the Lab's own settings
        self.warm_cfg = cfg.replace(max_steps=24, publish_every_s=0)
        arms = ("engine", "fit", "fit_tuned", "loop", "graph_loop")
        scripts = {
            "fit": (FIT_SCRIPT, fit_args),
            "fit_tuned": (FIT_SCRIPT, fit_tuned_args),
            "loop": (LOOP_SCRIPT, loop_args),
            "graph_loop": (LOOP_SCRIPT, graph_loop_args),
        }
        out = {
            "goal": GOALS["ab"],
            "goal_loop": GOALS["loop"],
            "config": cfg.to_dict(),
            "horovod_env": hv,
            "horovod_env_note": (
                "every arm ran with this Horovod environment (the engine's: a Lab's own "
                "EngineSettings, hpclab.core.engine_settings); `cross_check` has B and C once more with "
                "Horovod's own defaults (HOROVOD_CYCLE_TIME / HOROVOD_FUSION_THRESHOLD unset)"
            ),
            "metric": (
                "samples/s the Horovod-benchmark way: per-window rates (engine: one call of "
                "~0.15 s; fit: 8 batches; loop: one call of 8 steps; fit_tuned and graph_loop: one "
                "call of 32 steps), first max(3, 10 %) windows "
                "dropped, summed over ranks, mean; wall = mean all-in rate of epochs 2..E "
                "(the engine's includes its validation pass, B and C validate nothing)"
            ),
            "fit": {
                "script": "benchmarks/plain_horovod_fit.py",
                "optimizer": "tf.keras.optimizers.legacy.SGD(momentum=0.9) in "
                "hvd.DistributedOptimizer",
                "interval_batches": LOOP_STEPS_PER_CALL,
            },
            "loop": {
                "script": "benchmarks/plain_horovod_loop.py",
                "optimizer": "tf.keras.optimizers.SGD(momentum=0.9), hvd.DistributedGradientTape",
                "steps_per_call": LOOP_STEPS_PER_CALL,
            },
            "fit_tuned": {
                "script": "benchmarks/plain_horovod_fit.py",
                "steps_per_execution": TUNED_STEPS,
                "verbose": 0,
            },
            "graph_loop": {
                "script": "benchmarks/plain_horovod_loop.py --input resident --num-groups 1",
                "what": "the ceiling: batches gathered in the graph from resident tensors, "
                "one grouped allreduce, as the engine does",
                "steps_per_call": TUNED_STEPS,
            },
            "ranks": {},
        }
        for n in (1, 2):
            runs: dict[str, list] = {a: [] for a in arms}
            for i, order in enumerate(bl.rotations(arms, self.plan["ab_rounds"])):
                self._quiet("ab")
                for arm in order:
                    if arm == "engine":
                        runs[arm].append(self._engine(n, cfg))
                    else:
                        script, args_of = scripts[arm]
                        runs[arm].append(self._script(script, n, args_of(epochs), hv))
                self.log(
                    f"  {n} rank(s) round {i + 1} ({'/'.join(order)}): "
                    + ", ".join(f"{a} {runs[a][-1]['samples_per_sec']:,.0f}" for a in arms)
                    + " samples/s"
                )
            cross = {
                "fit": self._script(FIT_SCRIPT, n, fit_args(epochs), None),
                "loop": self._script(LOOP_SCRIPT, n, loop_args(epochs), None),
            }
            self.log(
                f"  {n} rank(s) with Horovod's own defaults: fit "
                f"{cross['fit']['samples_per_sec']:,.0f}, loop "
                f"{cross['loop']['samples_per_sec']:,.0f} samples/s"
            )
            rate = {a: [r["samples_per_sec"] for r in runs[a]] for a in arms}
            wall = {a: [r["steady_epoch_samples_per_sec"] for r in runs[a]] for a in arms}
            vs_fit = bl.paired_ratios(rate["engine"], rate["fit"])
            vs_loop = bl.paired_ratios(rate["engine"], rate["loop"])
            wall_fit = bl.paired_ratios(wall["engine"], wall["fit"])
            wall_loop = bl.paired_ratios(wall["engine"], wall["loop"])
            vs_tuned = bl.paired_ratios(rate["engine"], rate["fit_tuned"])
            vs_ceiling = bl.paired_ratios(rate["engine"], rate["graph_loop"])
            out["ranks"][str(n)] = {
                "runs": runs,
                "orders": bl.rotations(arms, self.plan["ab_rounds"]),
                **{a: bl.summarize(rate[a]) for a in arms},
                **{f"{a}_wall": bl.summarize(wall[a]) for a in arms},
                "ratios_fit": vs_fit,
                "ratio_fit_median": bl.median(vs_fit),
                "ratios_loop": vs_loop,
                "ratio_loop_median": bl.median(vs_loop),
                "wall_ratio_fit_median": bl.median(wall_fit),
                "wall_ratio_loop_median": bl.median(wall_loop),
                "ratios_fit_tuned": vs_tuned,
                "ratio_fit_tuned_median": bl.median(vs_tuned),
                "ratios_graph_loop": vs_ceiling,
                "ratio_graph_loop_median": bl.median(vs_ceiling),
                "verdict_graph_loop": bl.verdict(bl.median(vs_ceiling), GOALS["loop"]),
                "cpu_us_per_sample_per_rank": {
                    a: bl.median([r.get("cpu_us_per_sample_per_rank") for r in runs[a]])
                    for a in scripts
                },
                "cross_check": {
                    "horovod_env": "Horovod defaults (HOROVOD_* unset)",
                    "fit": cross["fit"],
                    "loop": cross["loop"],
                    "fit_samples_per_sec": cross["fit"]["samples_per_sec"],
                    "loop_samples_per_sec": cross["loop"]["samples_per_sec"],
                },
                "verdict_fit": bl.verdict(bl.median(vs_fit), GOALS["ab"]),
                "verdict_loop": bl.verdict(bl.median(vs_loop), GOALS["loop"]),
            }
        return out

    def telemetry(self) -> dict:
        from hpclab import RunConfig

        on_cfg = RunConfig(num_samples=40000, batch_per_worker=64, epochs=self.plan["tel_epochs"])
        off_cfg = on_cfg.replace(publish_every_s=0.0, noise_scale=False, time_split=False)
        self.warm_cfg = on_cfg.replace(max_steps=24, publish_every_s=0)
        on, off = [], []
        for rep in range(self.plan["tel_pairs"]):
            self._quiet("telemetry")
            order = ("on", "off") if rep % 2 == 0 else ("off", "on")
            for which in order:
                if which == "on":
                    on.append(self._engine(2, on_cfg))
                else:
                    off.append(self._engine(2, off_cfg))
            self.log(
                f"  pair {rep + 1} ({'/'.join(order)}): on "
                f"{on[-1]['steady_epoch_samples_per_sec']:,.0f} vs off "
                f"{off[-1]['steady_epoch_samples_per_sec']:,.0f} samples/s (epoch wall)"
            )
        ratios = bl.paired_ratios(
            [r["steady_epoch_samples_per_sec"] for r in on],
            [r["steady_epoch_samples_per_sec"] for r in off],
        )
        eratios = bl.paired_ratios(
            [r["samples_per_sec"] for r in on], [r["samples_per_sec"] for r in off]
        )
        med = bl.median(ratios)
        calls = self._stamp_pairs(on_cfg)
        return {
            "goal": GOALS["telemetry"],
            # the split's timestamps on vs off in adjacent calls of one run (stamp_pairs): the
            # load drifts slower than a call, so these pairs resolve 1 % where whole runs do not
            "calls": calls,
            "ranks": 2,
            "config_on": on_cfg.to_dict(),
            "off": "publish_every_s=0, noise_scale=False and time_split=False (no publishing, no "
            "detail gathers, no noise-scale norms, no timestamps in the step)",
            "metric": "mean wall rate of epochs 2..E (all-in: publishing, bookkeeping, validation)",
            "runs_on": on,
            "runs_off": off,
            "on_wall": bl.summarize([r["steady_epoch_samples_per_sec"] for r in on]),
            "off_wall": bl.summarize([r["steady_epoch_samples_per_sec"] for r in off]),
            "ratios": ratios,
            "ratio_median": med,
            "engine_ratios": eratios,
            "engine_ratio_median": bl.median(eratios),
            "verdict": bl.verdict(med, GOALS["telemetry"]),
        }

    def _stamp_pairs(self, on_cfg) -> dict:
        """One 2-rank run whose calls alternate timed / untimed (``stamp_pairs``): each pair's
        throughput ratio timed / untimed, their median and mean with its 95 % interval."""
        cfg = on_cfg.replace(stamp_pairs=True, epochs=self.plan["tel_pair_epochs"])
        lab = self.lab(2)
        s = lab.run(cfg).wait(timeout=RUN_TIMEOUT_S)
        pairs = (s.get("stamp_pairs") or [])[2:]  # past tracing and the calls' first sizing
        ratios = [untimed / timed for timed, untimed in pairs if timed > 0]
        n = len(ratios)
        mean = sum(ratios) / n if n else float("nan")
        sd = (sum((r - mean) ** 2 for r in ratios) / (n - 1)) ** 0.5 if n > 1 else float("nan")
        half = 1.96 * sd / n**0.5 if n > 1 else float("nan")
        self.log(f"  stamp pairs: {n} adjacent calls, on/off {mean:.4f} ± {half:.4f} (95 %)")
        return {
            "pairs": n,
            "ratio_median": bl.median(ratios),
            "ratio_mean": mean,
            "ratio_ci95": [mean - half, mean + half],
            "ms_per_step_timed": 1000 * bl.median([t for t, _ in pairs]),
            "ms_per_step_untimed": 1000 * bl.median([u for _, u in pairs]),
            "verdict": bl.verdict(mean, GOALS["telemetry"]),
        }

    def horovod(self) -> dict:
        from hpclab import EngineSettings, RunConfig

        base = RunConfig(num_samples=40000, batch_per_worker=64, epochs=self.plan["hvd_epochs"])
        chosen_cycle, chosen_fusion = _settings_key(EngineSettings())  # a Lab's own
        self.warm_cfg = base.replace(max_steps=24, publish_every_s=0)
        # (label, cycle ms, fusion MB, allreduce); one Lab (engine restart) per (cycle, fusion)
        settings = [(f"cycle {c:g} ms", c, chosen_fusion, "grouped") for c in HVD_CYCLES_MS] + [
            (f"fusion 0 MB (cycle {chosen_cycle:g} ms)", chosen_cycle, 0.0, "grouped"),
            (f"per_tensor (cycle {chosen_cycle:g} ms)", chosen_cycle, chosen_fusion, "per_tensor"),
        ]
        default_label = f"cycle {chosen_cycle:g} ms"
        envs = sorted({(c, f) for _, c, f, _ in settings}, key=lambda e: (e[1] == 0, e[0]))
        rates: dict[str, list[list[float]]] = {s[0]: [] for s in settings}
        idle: dict[str, list] = {}
        runs: dict[str, list] = {s[0]: [] for s in settings}
        for rnd in range(self.plan["hvd_rounds"]):
            for s in settings:
                rates[s[0]].append([])
            order = envs if rnd % 2 == 0 else envs[::-1]
            for cycle, fusion in order:
                here = [s for s in settings if (s[1], s[2]) == (cycle, fusion)]
                if rnd % 2:
                    here = here[::-1]
                self._quiet("horovod")
                for rep in range(self.plan["hvd_reps"]):
                    for label, c, f, how in here:
                        cfg = base.replace(grad_allreduce=how)
                        hvd = EngineSettings(cycle_time_ms=c, fusion_mb=f)
                        r = self._engine(2, cfg, settings=hvd)
                        r["round"], r["label"] = rnd, label
                        runs[label].append(r)
                        rates[label][-1].append(r["samples_per_sec"])
                    if rnd == 0 and rep == 0 and fusion == chosen_fusion:
                        idle[f"{cycle:g}"] = _idle_engine_cpu(self.lab(2), self.plan["idle_s"])
                self.log(
                    f"  round {rnd + 1}, cycle {cycle:g} ms, fusion {fusion:g} MB: "
                    + ", ".join(f"{lbl} {bl.median(rates[lbl][-1]):,.0f}" for lbl, *_ in here)
                    + " samples/s"
                    + (
                        f"; idle engines {idle[f'{cycle:g}']} of a core"
                        if rnd == 0 and f"{cycle:g}" in idle and fusion == chosen_fusion
                        else ""
                    )
                )
        table = {}
        for label, c, f, how in settings:
            per_round = [bl.median(v) for v in rates[label]]
            ref = [bl.median(v) for v in rates[default_label]]
            ratios = bl.paired_ratios(per_round, ref)
            table[label] = {
                "cycle_time_ms": c,
                "fusion_mb": f,
                "grad_allreduce": how,
                "horovod_env": horovod_env_of(EngineSettings(cycle_time_ms=c, fusion_mb=f)),
                "samples_per_sec": bl.summarize([v for rnd in rates[label] for v in rnd]),
                "ratio_to_default": bl.median(ratios),
                "ratios_per_round": ratios,
            }
        return {
            "ranks": 2,
            "config": base.to_dict(),
            "default": {
                "label": default_label,
                "cycle_time_ms": chosen_cycle,
                "fusion_mb": chosen_fusion,
                "grad_allreduce": base.grad_allreduce,
            },
            "metric": "engine samples/s (per-call windows), median over rounds x repeats; "
            "ratio_to_default = median over rounds of (median this round / default's median)",
            "settings": table,
            "idle_engine_cpu_fraction": idle,
            "idle_note": f"fraction of a core per idle engine over {self.plan['idle_s']:g} s, "
            f"fusion {chosen_fusion:g} MB, by HOROVOD_CYCLE_TIME (ms)",
            "runs": runs,
        }

    def scaling(self) -> dict:
        from hpclab import RunConfig

        steps = self.plan["scale_steps"]
        cfg = RunConfig(
            dataset="synthetic",
            model="resnet20",
            image_shape=(32, 32, 3),
            batch_per_worker=64,
            steps_per_call=2,
            max_steps=steps,
            publish_every_s=0,
            noise_scale=False,
        )
        self.warm_cfg = cfg.replace(max_steps=4)  # the first resnet20 run of each Lab
        for n in list(self.labs):
            self._record(
                self.labs[n], self.warm_cfg, engine_run(self.labs[n], self.warm_cfg), warm=True
            )
            self.lab_env[n] = _settings_key(self.labs[n].engine_settings)
        t1, t2 = [], []
        for rep in range(self.plan["scale_pairs"]):
            self._quiet("scaling")
            order = (1, 2) if rep % 2 == 0 else (2, 1)
            for n in order:
                (t1 if n == 1 else t2).append(self._engine(n, cfg))
            self.log(
                f"  pair {rep + 1}: T1 {t1[-1]['samples_per_sec']:,.1f} T2 "
                f"{t2[-1]['samples_per_sec']:,.1f} samples/s"
            )
        a = [r["samples_per_sec"] for r in t1]
        b = [r["samples_per_sec"] for r in t2]
        effs = [bl.weak_efficiency(y, x, 2) for x, y in zip(a, b)]
        med = bl.median(effs)
        return {
            "goal": GOALS["scaling"],
            "config": cfg.to_dict(),
            "label": "resnet20, synthetic 32x32x3, 64/rank",
            "why_compute_bound": (
                "resnet20 costs ~41 MMAC forward per 32x32 image, so a 64-image step is "
                "~15 GFLOP of arithmetic (~0.1-0.3 s on one core), while its gradient "
                "allreduce is 0.27 M floats (1.1 MB, shared memory, ~1 ms) and the engine's "
                "per-call Python cost is ~1 ms: communication and overhead are < 2 % of a "
                "step, unlike cnn1d (5 k parameters, ~1 ms steps)"
            ),
            "t1": t1,
            "t2": t2,
            "t1_median": bl.median(a),
            "t2_median": bl.median(b),
            "efficiencies": effs,
            "efficiency_median": med,
            "efficiency_of_medians": bl.weak_efficiency(bl.median(b), bl.median(a), 2),
            "verdict": bl.verdict(med, GOALS["scaling"]),
        }

    def resnet50(self) -> dict:
        from hpclab import RunConfig

        batch, per_iter, iters = (
            self.plan["r50_batch"],
            self.plan["r50_batches_per_iter"],
            self.plan["r50_iters"],
        )
        ranks = 2
        # Both sides time `iters` windows of `per_iter` steps after the same warm-up: the engine
        # drops its first 3 calls (of `per_iter` steps) as warm-up, so the script runs its first
        # step plus 3 * per_iter - 1 warm-up batches before timing.
        warm_calls = 3
        cfg = RunConfig(
            dataset="synthetic",
            model="resnet50",
            image_shape=(224, 224, 3),
            synthetic_classes=1000,
            batch_per_worker=batch,
            steps_per_call=per_iter,
            max_steps=per_iter * (warm_calls + iters),
            publish_every_s=0,
            noise_scale=False,
        )
        script_args = [
            "--batch-size",
            batch,
            "--num-warmup-batches",
            warm_calls * per_iter - 1,
            "--num-batches-per-iter",
            per_iter,
            "--num-iters",
            iters,
            "--num-classes",
            1000,
            "--threads",
            1,
        ]
        hv = horovod_env_of()  # the Lab's own settings
        self.warm_cfg = None  # both sides warm up inside the run
        eng, hvs = [], []
        for rep in range(self.plan["r50_pairs"]):
            self._quiet("resnet50")
            order = ("engine", "script") if rep % 2 == 0 else ("script", "engine")
            for who in order:
                if who == "engine":
                    eng.append(self._engine(ranks, cfg))
                else:
                    hvs.append(self._script(SYNTHETIC_SCRIPT, ranks, script_args, hv))
            self.log(
                f"  pair {rep + 1}: engine {eng[-1]['samples_per_sec'] / ranks:.2f} vs "
                f"Horovod-script {hvs[-1]['per_rank_mean']:.2f} img/s per rank"
            )
        e_rank = [r["samples_per_sec"] / ranks for r in eng]
        h_rank = [r["per_rank_mean"] for r in hvs]
        ratios = bl.paired_ratios(e_rank, h_rank)
        med = bl.median(ratios)
        cpu = bl.parse_cpuinfo(Path("/proc/cpuinfo").read_text())
        peak = bl.peak_table(cpu, cores=ranks)  # one thread per rank = one core per rank
        flop = bl.RESNET50_TRAIN_FLOP_PER_IMAGE
        last = eng[-1]

        def mfus(total):  # (against the stated peak: this CPU has two 512-bit FMA pipes)
            return {
                "mfu": bl.mfu(total, flop, peak["peak_flops"]) if peak["peak_flops"] else None,
                "flop_per_image": flop,
            }

        total = bl.median([r["samples_per_sec"] for r in eng])
        ci = bl.median([r["samples_per_sec_ci95"] for r in eng])
        script_total = bl.median([r["total_mean"] for r in hvs])
        return {
            "config": cfg.to_dict(),
            "ranks": ranks,
            "batch_per_rank": batch,
            "threads_per_rank": 1,
            "horovod_env": hv,
            "script": "benchmarks/horovod_synthetic.py",
            "script_args": [str(a) for a in script_args],
            "timing": f"{iters} windows of {per_iter} step(s) after {warm_calls * per_iter} "
            "warm-up steps on both sides",
            "engine_runs": eng,
            "script_runs": hvs,
            "rank_img_per_sec": last["rank_samples_per_sec"],
            "per_rank_mean": total / ranks,
            "per_rank_ci95": ci / ranks,
            "total_mean": total,
            "total_ci95": ci,
            "script_per_rank_mean": script_total / ranks,
            "script_per_rank_ci95": bl.median([r["per_rank_ci95"] for r in hvs]),
            "script_total_mean": script_total,
            "ratios": ratios,
            "ratio_median": med,
            "goal": GOALS["resnet50"],
            "verdict": bl.verdict(med, GOALS["resnet50"]),
            "flop_per_image": flop,
            "achieved_flops": total * flop,
            "peak": peak,
            **mfus(total),
            "script_mfu": mfus(script_total),
        }

    # -- derived from every engine run ------------------------------------------------------------
    def files(self) -> dict:
        """Your own data from files: streamed, resident, staged and a plain tf.data script."""
        import files_bench

        return files_bench.run(self, bl, engine_run, script_run)

    def trace(self) -> dict | None:
        """Trace/compile seconds of the engine runs: the goal is on cnn1d runs after the first on
        each Lab (the first pays one-time imports and kernel set-up)."""
        if not self.traces:
            return None
        later = [t for t in self.traces if t["run_on_lab"] > 0 and t["model"] == "cnn1d"]
        med = bl.median([t["compile_s"] for t in later])
        by_model = {}
        for model in sorted({t["model"] for t in self.traces}):
            mine = [t for t in self.traces if t["model"] == model and t["run_on_lab"] > 0]
            if not mine:
                continue
            by_model[model] = {
                k: bl.median([t[k] for t in mine])
                for k in ("setup_s", "trace_s", "first_call_s", "compile_s")
            }
        firsts = [t for t in self.traces if t["run_on_lab"] == 0]
        return {
            "goal": GOALS["trace"],
            "metric": "compile_s = trace_s + (first_call_s - first-call steps x steady step "
            "time), per run; median over cnn1d runs after the first on each Lab",
            "runs_counted": len(later),
            **({"compile_median_s": med} if later else {}),
            "trace_median_s": bl.median([t["trace_s"] for t in later]),
            "first_call_median_s": bl.median([t["first_call_s"] for t in later]),
            "setup_median_s": bl.median([t["setup_s"] for t in later]),
            "first_run_on_lab_compile_median_s": bl.median([t["compile_s"] for t in firsts]),
            "by_model_after_first": by_model,
            "runs": self.traces,
            "verdict": bl.verdict(med, GOALS["trace"], higher_is_better=False),
        }


RESULT_KEYS = {
    "start": "cold_start",
    "ab": "engine_vs_plain",
    "telemetry": "telemetry",
    "horovod": "horovod",
    "scaling": "weak_scaling",
    "resnet50": "resnet50",
    "files": "files",
}


def goals_summary(results: dict) -> list[dict]:
    """Every goal of hpclab issue 10 with its measured value and verdict (sections run only)."""
    out = []
    ab = results.get("engine_vs_plain") or {}
    for n, r in sorted((ab.get("ranks") or {}).items()):
        out.append(
            {
                "goal": f"engine >= {GOALS['ab']:g}x model.fit at {n} rank(s)",
                "value": r["ratio_fit_median"],
                "verdict": r["verdict_fit"],
            }
        )
        out.append(
            {
                "goal": f"engine >= {GOALS['loop']:g}x hand-written loop at {n} rank(s)",
                "value": r["ratio_loop_median"],
                "verdict": r["verdict_loop"],
            }
        )
    for key, name, field in (
        ("telemetry", f"telemetry on / really off >= {GOALS['telemetry']:g}", "ratio_median"),
        (
            "trace",
            f"trace+compile per run after the first <= {GOALS['trace']:g} s",
            "compile_median_s",
        ),
        ("cold_start", f"2-rank cold start <= {GOALS['start']:g} s", "median_s"),
        ("weak_scaling", f"weak-scaling efficiency >= {GOALS['scaling']:g}", "efficiency_median"),
        ("resnet50", f"ResNet-50 engine / Horovod script >= {GOALS['resnet50']:g}", "ratio_median"),
    ):
        sec = results.get(key)
        if sec and field in sec:
            out.append({"goal": name, "value": sec[field], "verdict": sec["verdict"]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="hpclab benchmark suite")
    p.add_argument("--quick", action="store_true", help="~15 min: fewer repeats, shorter runs")
    p.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="seconds to wait, before each repeat, for a moment when the machine is "
        "less than half busy (default 10, 3 with --quick; 0 = never wait)",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for the engines and the plain scripts (what-if runs; recorded in the "
        "results). HOROVOD_CYCLE_TIME / HOROVOD_FUSION_THRESHOLD are not taken from here: every "
        "arm gets a Lab's own (hpclab.core.engine_settings), the `horovod` section varies them",
    )
    p.add_argument(
        "--out",
        default=None,
        help="results file (default benchmarks/results.json, or results-quick.json with --quick)",
    )
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        p.error(f"--only takes sections from {', '.join(SECTIONS)}; you passed {unknown[0]!r}")
    extra_env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--env takes KEY=VALUE; you passed {item!r}")
        extra_env[key] = value
    os.environ.update(extra_env)  # Lab engines (ipyparallel) and mpiexec inherit os.environ
    mode = "quick" if args.quick else "full"
    out_path = (
        Path(args.out)
        if args.out
        else HERE / ("results-quick.json" if args.quick else "results.json")
    )
    plan = PLANS[mode]

    results: dict = {
        "suite": "hpclab benchmarks",
        "mode": mode,
        "sections": [s for s in SECTIONS if s in only],
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": package_versions(),
        "plan": plan,
        "goals_set": GOALS,
        "noise": {},
        "env": extra_env,
        "horovod_env": horovod_env_of(),
        "errors": {},
    }
    runs_dir = Path(tempfile.mkdtemp(prefix="hpclab-bench-runs-"))
    quiet_wait = args.quiet_wait if args.quiet_wait is not None else (3.0 if args.quick else 10.0)
    suite = Suite(plan, runs_dir, quiet_wait_s=quiet_wait)
    t0 = time.perf_counter()
    print(f"hpclab benchmarks ({mode}): {', '.join(results['sections'])}")
    try:
        for name in results["sections"]:
            print(f"[{name}]")
            suite.section = name
            with Noise() as noise:
                try:
                    results[RESULT_KEYS[name]] = getattr(suite, name)()
                except Exception as exc:  # noqa: BLE001 — record the failure, go on with the other sections
                    results["errors"][name] = f"{type(exc).__name__}: {exc}"
                    traceback.print_exc()
            results["noise"][name] = noise.record
    finally:
        suite.close()
        shutil.rmtree(runs_dir, ignore_errors=True)
    trace = suite.trace()
    if trace is not None:
        results["trace"] = trace
    if suite.engine_versions:
        results["versions"]["engine"] = suite.engine_versions
    results["other_lab_startups_s"] = suite.other_startups
    results["lab_start_failures"] = suite.lab_failures
    results["quiet_waits"] = suite.quiet
    results["duration_s"] = round(time.perf_counter() - t0, 1)
    results["goals"] = goals_summary(results)
    results["table"] = bl.build_table(results)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_clean(results), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, out_path)
    if mode == "full" and not only and out_path == HERE / "results.json":
        import readme_table  # the README's figures: this run's, generated, never hand-edited

        readme_table.update(HERE / "README.md", json.loads(out_path.read_text()))

    m = results["machine"]
    print(
        f"\n{m['cpu_model']}, {m['logical_cpus']} cores @ {m['cpu_mhz']} MHz, "
        f"{m['memory_gb']} GB; TF {results['versions'].get('tensorflow-cpu')}, "
        f"Horovod {results['versions'].get('horovod')}; Horovod env of every arm "
        f"{results['horovod_env']}"
    )
    print(bl.format_table(results["table"]))
    print("\nnoise (others share this machine):")
    for name, rec in results["noise"].items():
        print(
            f"  {name:9s} {rec['seconds']:6.1f} s  load {rec['loadavg_1min_before']:.1f} -> "
            f"{rec['loadavg_1min_after']:.1f}  machine CPU busy "
            f"{100 * rec['machine_cpu_busy_fraction']:.0f} %  steal "
            f"{100 * rec['steal_fraction']:.1f} %"
        )
    for name, err in results["errors"].items():
        print(f"ERROR in {name}: {err}")
    print(f"\nwrote {out_path} in {results['duration_s']:.0f} s")
    return 1 if results["errors"] else 0


def _clean(value):
    """Strict JSON: NaN/inf -> null, numpy scalars/arrays -> Python."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _clean(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


if __name__ == "__main__":
    sys.exit(main())

"""``hpclab plan --replay PATH``: the planner replayed against a real cluster's measurements
(:mod:`hpclab.core.replay`) — a workload folder in the Pollux trace format, or the MLPerf table.

    hpclab plan --replay data/scaling-traces/pollux-osdi21/imagenet --target 0.75
    hpclab plan --replay data/scaling-traces/pollux-osdi21/ncf --target 0.69 --json
    hpclab plan --replay data/scaling-traces/mlperf-v3.0-resnet50-h100.csv
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from hpclab.core.errors import ConfigError


def run_replay(args) -> int:
    """Replay, print (a table or ``--json``), exit 0."""
    from hpclab.core import replay, traces

    path = Path(args.replay)
    if path.is_file():
        rows = replay.replay_mlperf(traces.read_mlperf(path))
        if args.json:
            print(json.dumps({"time_to_train": rows}))
        else:
            _print_mlperf(rows)
        return 0
    if not path.is_dir():
        raise ConfigError(
            f"--replay must name a workload folder in the trace format (placements.csv, "
            f"validation-<B>.csv) or the MLPerf table; {path} is neither."
        )
    if args.target is None:
        raise ConfigError(
            "--replay of a workload folder needs --target VALUE: the metric to reach (its "
            "validation-<B>.csv 'metric' column; add --lower-is-better for a loss)."
        )
    out = replay.replay(path, args.target, args.lower_is_better)
    if args.json:
        print(json.dumps(out))
        return 0
    _print_steps(out)
    _print_statistics(out)
    return 0


def _print_steps(out: dict) -> None:
    s = out["summary"]
    print(f"{s['workload']}: step time fitted on 1-2 GPUs, predicted at every other placement")
    groups = defaultdict(list)
    for r in out["step_time"]:
        if not r["fitted"]:
            groups[r["gpus"]].append(r)
    print(f"  {'GPUs':>5} {'rows':>5} {'median err':>11} {'p90 err':>8} {'in band':>8}")
    for gpus in sorted(groups):
        rows = groups[gpus]
        err = [abs(r["predicted_s"] / r["measured_s"] - 1) for r in rows]
        inside = np.mean([r["band_lo_s"] <= r["measured_s"] <= r["band_hi_s"] for r in rows])
        print(
            f"  {gpus:>5} {len(rows):>5} {np.median(err):>11.1%} "
            f"{np.percentile(err, 90):>8.1%} {inside:>8.0%}"
        )
    far = s["step_time_at_16_gpus_or_more"]
    if far["rows"]:
        print(
            f"  at 16 GPUs or more: median {far['median']:.1%}, p90 {far['p90']:.1%} "
            f"({far['rows']} rows, {far['in_band']:.0%} inside their band)"
        )


def _print_statistics(out: dict) -> None:
    s = out["summary"]
    print()
    print(f"steps to {s['target']:g}, fitted on the three smallest batches:")
    print(f"  {'batch':>7} {'measured':>10} {'predicted':>10} {'band':>21}")
    for r in out["steps_to_target"]:
        if r["predicted"] is None:
            print(f"  {r['batch']:>7} {r['measured']:>10,.0f} {'(fitted)':>10}")
            continue
        band = f"{r['band_lo']:,.0f}-{r['band_hi']:,.0f}"
        tag = " fitted" if r["fitted"] else ""
        print(f"  {r['batch']:>7} {r['measured']:>10,.0f} {r['predicted']:>10,.0f} {band:>21}{tag}")
    if s["statistical_fit"]:
        print(f"  {s['statistical_fit']}")
    if out["statistical_model_warning"]:
        print(f"  WARNING: {out['statistical_model_warning']}")


def _print_mlperf(rows: list[dict]) -> None:
    print("MLPerf time to train, each run predicted from the runs with fewer GPUs:")
    print(
        f"  {'GPUs':>5} {'from':>12} {'measured min':>13} {'predicted':>10} {'band':>13} {'error':>7}"
    )
    for r in rows:
        band = f"{r['band_lo_minutes']:.2f}-{r['band_hi_minutes']:.2f}"
        fitted = ",".join(str(g) for g in r["fitted_on"])
        print(
            f"  {r['gpus']:>5} {fitted:>12} {r['measured_minutes']:>13.3f} "
            f"{r['predicted_minutes']:>10.3f} {band:>13} {r['error']:>+7.1%}"
        )

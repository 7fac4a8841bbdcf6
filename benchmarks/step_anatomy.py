"""The engine's step beside a bare in-graph loop's, as paired calls in one process per rank.

``make bench`` compares whole runs of the engine with whole runs of the in-graph hand loop
(``plain_horovod_loop.py --input resident``) and read 0.90-0.91 at 1 and 2 ranks; whole runs on
two shared cores move ±20 %, so what the gap is made of could not be read from them. This
script runs :func:`hpclab.rank.probes.step_anatomy.anatomy` on a Lab's ranks: the bare loop, the
engine's call, its untimed twin and a lean engine (time split and noise scale off) take turns,
one call of ``--steps`` steps each per round, and each round gives each arm's speed relative to
the bare loop. It prints the median of those ratios with a 95 % interval (rank 0's clock). ::

    .venv/bin/python benchmarks/step_anatomy.py                  # 1 and 2 ranks, 32 steps, 200 rounds
    .venv/bin/python benchmarks/step_anatomy.py --workers 2 --rounds 400

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile

import numpy as np

from hpclab import Lab, RunConfig
from hpclab.rank.probes.step_anatomy import ARMS, anatomy, median_interval


def table(result: dict) -> dict:
    """Per arm: the median ms per step, and its speed / the bare loop's (median over rounds, 95 %
    interval); and the engine's speed / its untimed twin's (the time split's cost), / the lean
    engine's (the time split's and the noise scale's) and / the bare loop with the engine's
    bookkeeping kept."""
    s = {arm: np.asarray(v) for arm, v in result["seconds_per_step"].items()}
    out = {}
    for arm in ARMS:
        row = {"ms_per_step": round(1e3 * float(np.median(s[arm])), 4)}
        if arm != "bare":
            row["speed_vs_bare"] = [round(v, 4) for v in median_interval(s["bare"] / s[arm])]
        out[arm] = row
    out["engine_vs_untimed"] = [round(v, 4) for v in median_interval(s["untimed"] / s["engine"])]
    out["engine_vs_lean"] = [round(v, 4) for v in median_interval(s["lean"] / s["engine"])]
    out["engine_vs_bare_kept"] = [
        round(v, 4) for v in median_interval(s["bare_kept"] / s["engine"])
    ]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--steps", type=int, default=32, help="optimizer steps per call")
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args(argv)
    # make bench's engine arm: the default run, 64 a rank, MNIST-1D 40,000
    cfg = RunConfig(num_samples=40000, batch_per_worker=64)
    report = {"config": cfg.to_dict(), "steps": args.steps, "rounds": args.rounds, "ranks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.workers:
            with Lab(workers=n, runs_dir=tmp, verbose=False) as lab:
                results = lab.apply(
                    anatomy, cfg.to_dict(), tmp, str(lab.data_dir), args.steps, args.rounds
                )
            rows = table(results[0])
            report["ranks"][n] = rows
            print(f"{n} rank(s), {args.rounds} rounds of {args.steps}-step calls (rank 0):")
            for arm, row in rows.items():
                print(f"  {arm:>17}: {row}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

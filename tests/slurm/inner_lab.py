"""Runs inside a Slurm allocation (salloc/sbatch/srun) for tests/slurm/test_modes.py.

Starts a `Lab` the way a user's notebook would (profile from the arguments or auto-detected),
trains a short MNIST-1D run and prints ONE JSON line on stdout: the ranks as the lab saw them,
the launch record, the run's summary, or the error sentence when the lab refused to start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from hpclab import Lab, LabError, RunConfig


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=0)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--runs-dir", required=True)
    args = parser.parse_args()
    out: dict = {"slurm_step": os.environ.get("SLURM_STEP_ID", "")}
    t0 = time.monotonic()
    try:
        lab = Lab(
            workers=args.workers,
            nodes=args.nodes,
            profile=args.profile,
            runs_dir=args.runs_dir,
            verbose=False,
        )
    except LabError as exc:
        out["error"] = str(exc)
        print(json.dumps(out), flush=True)
        return 3
    out["seconds"] = {"start": round(time.monotonic() - t0, 1)}
    with lab:
        out["ranks"] = lab.ranks
        out["plan"] = lab.plan.record()
        out["notes"] = list(lab.plan.notes)
        run = lab.run(RunConfig(epochs=args.epochs, num_samples=4000))
        run.wait()
        out["summary"] = run.summary
        out["status"] = run.status
        out["seconds"]["run"] = round(time.monotonic() - t0 - out["seconds"]["start"], 1)
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

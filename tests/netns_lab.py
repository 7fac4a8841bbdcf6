"""Runs on the "login" host of tests/test_multihost.py (its network namespace and hostname).

Starts a `Lab` from the profile given, as a user on a login node would, checks Horovod across
the hosts with one allreduce, optionally trains a short run, and prints ONE JSON line on stdout:
the ranks, the launch record and notes, the allreduce results and the run's status, or the
error sentence when the lab refused to start.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys

from hpclab import Lab, LabError, RunConfig
from hpclab.rank import engine


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", required=True)
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--train", action="store_true")
    args = parser.parse_args()
    out: dict = {"client_host": socket.gethostname()}
    try:
        lab = Lab(workers=2, nodes=2, profile=args.profile, runs_dir=args.runs_dir, verbose=False)
    except LabError as exc:
        out["error"] = str(exc)
        print(json.dumps(out), flush=True)
        return 3
    with lab:
        out["ranks"] = lab.ranks
        out["plan"] = lab.plan.record()
        out["notes"] = list(lab.plan.notes)
        out["allreduce"] = lab.apply(engine.allreduce_check)
        if args.train:
            run = lab.run(RunConfig(epochs=1, num_samples=1000))
            run.wait()
            out["status"] = run.status
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rank 0's bookkeeping per epoch when epochs are short (issue 31: 64 ranks, ~8-step epochs).

No training and no engines: rank 0's real meters (hpclab.rank.meters) and publisher
(hpclab.rank.publisher) are driven as hpclab.rank.trainer drives them, from generated telemetry
(a ``[world, DETAIL]`` matrix per history row, as the detail allgather returns it), with messages
pickled as ipyparallel's datapub pickles them and the run folder's log written. An epoch of
``steps`` steps lasts ``step_ms`` each (simulated clock); the bookkeeping's own time is measured.

Two policies: ``every_epoch`` (a history row and a publish at every epoch end: the trainer's up
to 16 ranks) and ``when_due`` (a row and a publish only when the publish cadence is due; the
epoch's row rides in the next message: the trainer's above 16 ranks). Not simulated: the detail
allgather (a collective; it runs on the same calls as the row, so it goes with it) and the held-
out evaluation. ::

    .venv/bin/python benchmarks/epoch_overhead.py --world 64 --steps 8 --epochs 2000
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np

from hpclab.core import pop
from hpclab.rank.meters import DETAIL, REDUCED, EpochMeter, WindowMeter
from hpclab.rank.publisher import Publisher

BATCH = 64


def simulate(world: int, steps: int, epochs: int, step_ms: float, every_epoch: bool) -> dict:
    """Rank 0's bookkeeping seconds per epoch (median and mean) under one policy."""
    rng = np.random.default_rng(0)
    sent = []
    with tempfile.TemporaryDirectory() as tmp:
        window = WindowMeter(BATCH, world, steps)
        meter = EpochMeter(world)
        publisher = Publisher(
            lambda m: sent.append(len(pickle.dumps(m))), 0.5, 10**9, folder=Path(tmp), world=world
        )
        parts = [DETAIL.index(f"{p}_s") for p in pop.STEP_PARTS]
        clock, step, took, rows = 0.0, 0, [], 0
        for _ in range(epochs):
            reduced = np.zeros(len(REDUCED))
            count = steps * BATCH * world
            reduced[[REDUCED.index(n) for n in ("loss_sum", "correct", "count")]] = (
                steps * world * rng.uniform(0.5, 2.0),
                0.8 * count,
                count,
            )
            clock += steps * step_ms / 1000
            step += steps
            t0 = time.perf_counter()
            window.add(reduced, steps)
            meter.add(reduced, steps, clock)
            due = publisher.due(clock)
            if every_epoch or due:  # the trainer's _window_end
                detail = np.zeros((world, len(DETAIL)))
                detail[:, DETAIL.index("steps")] = steps
                detail[:, DETAIL.index("samples")] = steps * BATCH
                detail[:, DETAIL.index("call_s")] = steps * step_ms / 1000
                detail[:, DETAIL.index("wall_s")] = steps * step_ms / 1000
                detail[:, parts] = rng.uniform(0.0, 0.002, (world, len(parts)))
                row = window.row(step, clock, 0.1, detail, None)
                row["eval_loss"], row["eval_accuracy"] = (float("nan"),) * 2
                publisher.add_row(row)
                rows += 1
            epoch_row = meter.close(step, clock, clock, 0.1, (1.0, 0.8))  # the trainer's _epoch_end
            publisher.add_epoch(epoch_row)
            if every_epoch or due:
                publisher.publish("running", step, clock)
            took.append(time.perf_counter() - t0)
        publisher.publish("finished", step, clock)
        publisher.close()
    took = np.array(took[epochs // 10 :])  # past the first messages' warm-up
    return {
        "policy": "every_epoch" if every_epoch else "when_due",
        "ms_per_epoch_median": 1000 * float(np.median(took)),
        "ms_per_epoch_mean": 1000 * float(took.mean()),
        "rows": rows,
        "messages": len(sent),
        "message_kib_median": float(np.median(sent)) / 1024 if sent else 0.0,
        "step_ms_per_epoch": steps * step_ms,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=64)
    p.add_argument("--steps", type=int, default=8, help="steps per epoch")
    p.add_argument("--step-ms", type=float, default=1.5)
    p.add_argument("--epochs", type=int, default=2000)
    a = p.parse_args()
    for every in (True, False):
        r = simulate(a.world, a.steps, a.epochs, a.step_ms, every)
        print(
            f"{r['policy']:>12}: rank 0 bookkeeping {r['ms_per_epoch_median']:.3f} ms/epoch median "
            f"({r['ms_per_epoch_mean']:.3f} mean) against {r['step_ms_per_epoch']:.1f} ms of "
            f"steps; {r['rows']} rows, {r['messages']} messages of "
            f"{r['message_kib_median']:.1f} KiB over {a.epochs} epochs"
        )


if __name__ == "__main__":
    main()

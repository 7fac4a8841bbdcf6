"""Sixteen real MPI engines on this 2-core machine (8× oversubscribed): start, run, stop.

What grows with the world size must stay bounded: each call runs one fixed-size allreduce, the
per-rank detail crosses only on publish calls, and a live message carries a bounded number of
rows. Real ipyparallel MPI engines and real Horovod; a tiny model so 16 ranks fit on 2 cores.
The stop bound is the lab's responsiveness promise, not a speed goal: a stop must never wait
for the end of an epoch or of the run (minutes here), however many ranks share the cores. It
takes 0.5-0.6 s on a quiet machine; 2 of ~6 CI runs on this shared VM measured 5.1 and 5.5 s
(16 ranks on 2 vCPUs stall together when the host takes a core), hence STOP_BOUND_S; on a
machine whose calls are slower (8.09 s measured on one 2.2x slower), four calls of its own.
"""

import pickle
import time

import pytest

from hpclab import Lab, RunConfig
from hpclab.rank.data import load_arrays
from hpclab.rank.publisher import Publisher

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

WORKERS = 16
STOP_BOUND_S = 8.0


def test_sixteen_engines_start_train_publish_and_stop_within_a_bound(tmp_path):
    cfg = RunConfig(model="mlp", num_samples=8000, batch_per_worker=8, epochs=500, seed=1)
    # The data set is generated here before the engines start (9 s), not by rank 0 at an eighth
    # of a core while 15 ranks wait in a collective (about 2 minutes): what this test measures
    # is start, run and stop.
    data = tmp_path / "data"
    load_arrays(cfg.to_dict(), data)
    lab = Lab(workers=WORKERS, runs_dir=tmp_path, data_dir=data, start_timeout=600, verbose=False)
    with lab:
        assert [r["rank"] for r in lab.ranks] == list(range(WORKERS))
        assert {r["size"] for r in lab.ranks} == {WORKERS}
        run = lab.run(cfg)
        deadline = time.time() + 300
        arrivals: list[float] = []  # when each live row was first seen: the machine's pace
        while time.time() < deadline and len(run.history) < 4 and not run.done:
            while len(arrivals) < len(run.history):
                arrivals.append(time.perf_counter())
            time.sleep(0.2)
        assert not run.done and len(run.history) >= 4, (
            f"no live rows from 16 ranks: {run.status}, {len(run.history)} rows, {run.error}"
        )
        # A row per call: a stop lands at the next call boundary, so its bound is a few calls of
        # this machine (a 2x slower one measured 8.09 s), never less than STOP_BOUND_S.
        call_s = max(b - a for a, b in zip(arrivals[1:], arrivals[2:]))
        bound_s = max(STOP_BOUND_S, 4 * call_s)

        payload = run._results[0].data["hpclab"]  # what rank 0 published last
        assert len(payload["rows"]) <= Publisher.ROWS_PER_MESSAGE
        assert all(len(r["rank_samples_per_sec"]) == WORKERS for r in payload["rows"])
        size = len(pickle.dumps(payload))
        assert size < 64_000, f"one live message is {size} bytes"

        t0 = time.perf_counter()
        run.stop(timeout=30)
        stop_s = time.perf_counter() - t0
        assert run.status == "stopped", run.error
        assert stop_s <= bound_s, (
            f"16 ranks took {stop_s:.2f} s to stop together (bound {bound_s:.1f} s: "
            f"{STOP_BOUND_S:g} s, or 4 calls of {call_s:.2f} s)"
        )
        assert len(set(run.summary["weights_digest"])) == 1  # all 16 replicas agree
        phases = ", ".join(f"{k} {v:.1f}" for k, v in lab.startup_phases.items())
        print(
            f"\n[scale] 16 engines: start {phases}; message {size} B; stop {stop_s:.2f} s; "
            f"calls {call_s:.2f} s"
        )

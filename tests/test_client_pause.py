"""A paused client does not kill healthy engines (issue 32, item 1), with real processes: a
client process trains on 2 real MPI engines, the test stops it (SIGSTOP, as Ctrl-Z or a VM
pause would) while its run trains, and resumes it. The run must finish, and the record must hold
every row rank 0 published, the ones published while the client was away included."""

import json
import os
import signal
import time
from pathlib import Path

import client_process
import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.own_lab, pytest.mark.timing]

ROOT = Path(__file__).resolve().parents[1]

CLIENT = """
import json, sys, threading
from hpclab import Lab, RunConfig
with Lab(workers=2) as lab:
    run = lab.run(RunConfig(epochs=200, eval_samples=0, publish_every_s=0.25))
    rows = threading.Event()
    run.on_update(lambda r: len(r.history) >= 4 and rows.set())
    rows.wait(240)
    print("ROWS", len(run.history), flush=True)
    sys.stdin.readline()  # the test pauses this process, resumes it, then writes a line
    print("AFTER " + json.dumps({"status": run.status, "error": run.error}), flush=True)
    run.stop(timeout=60)
    run.wait(timeout=120, check=False)
    print("RESULT " + json.dumps({"status": run.status, "error": run.error,
          "steps": run.history["step"].tolist(), "path": str(run.path)}), flush=True)
"""


@pytest.mark.parametrize("pause_s", [40])
def test_a_client_paused_mid_run_finds_its_run_training_and_every_row_recorded(tmp_path, pause_s):
    """40 s is past the watchdog's 8 s bound and past what the live messages reach back
    (Publisher.RESEND messages), so the rows of the pause come from rank 0's log in the run
    folder (hpclab.cluster.intake). A shorter pause past the same two bounds (12 s) takes the
    same path with fewer rows to bring back; the watchdog's rule itself is unit-tested on a moved
    clock (tests/test_watchdog.py)."""
    proc = client_process.start(CLIENT, tmp_path)
    try:
        rows_before = int(client_process.read_line(proc, "ROWS ", timeout=240)[len("ROWS ") :])
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(pause_s)  # the fault itself: the client is away this long
        os.kill(proc.pid, signal.SIGCONT)
        proc.stdin.write("go on\n")
        proc.stdin.flush()
        after = json.loads(client_process.read_line(proc, "AFTER ", timeout=60)[len("AFTER ") :])
        result = json.loads(
            client_process.read_line(proc, "RESULT ", timeout=300)[len("RESULT ") :]
        )
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    steps = result["steps"]
    print(f"[pause {pause_s} s] {rows_before} rows before, {len(steps)} at the end; {after}")
    assert after["status"] == "running", after  # the ranks trained on through the pause
    assert result["status"] == "stopped", result["error"]
    recorded = [json.loads(line)["step"] for line in open(Path(result["path"]) / "metrics.jsonl")]
    assert recorded == sorted(recorded) == steps
    # a row every 0.25 s: no gap much wider than the usual steps between rows (none missing)
    gaps = sorted(b - a for a, b in zip(steps, steps[1:]))
    assert gaps[-1] <= 3 * gaps[len(gaps) // 2], gaps[-5:]
    assert proc.returncode == 0, proc.stderr.read()

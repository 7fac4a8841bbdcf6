"""The distributed engine with real MPI engines and real Horovod (2 ranks). Nothing is mocked."""

import io
import math
import os
import signal
import time

import pandas as pd
import pytest

from hpclab import RunConfig, RunFailed, load_run
from hpclab.cluster.engines import STOP_BOUND_S
from hpclab.cluster.watchdog import HANG_S
from hpclab.core.errors import LabError
from hpclab.rank import bfloat16
from hpclab.rank.heartbeat import EVERY_S as HEARTBEAT_S

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

SMALL = dict(num_samples=4000, epochs=2)  # ~1 s of training: for behaviour, not accuracy


def _wait_for_rows(run, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and not run.done:
        if len(run.history):
            return True
        time.sleep(0.1)
    return False


def test_default_run_learns_and_ranks_agree(lab):
    cfg = RunConfig(
        dataset="mnist1d",
        model="cnn1d",
        batch_per_worker=64,
        epochs=6,
        optimizer="momentum",
        base_lr=0.05,
        base_batch=64,
        lr_scaling="linear",
        warmup_epochs=1,
        precision="float32",
        seed=0,
    )
    run = lab.run(cfg)
    assert not run.done, "lab.run must return while the run trains"
    saw_rows_while_running = _wait_for_rows(run) and not run.done
    summary = run.wait(timeout=600)

    assert saw_rows_while_running, "history rows must arrive while the run is still running"
    assert run.status == "finished"
    assert summary["val_accuracy"] >= 0.90
    assert len(summary["weights_digest"]) == 2
    assert summary["weights_digest"][0] == summary["weights_digest"][1]
    assert summary["world_size"] == 2 and summary["global_batch"] == 128
    assert summary["lr"] == pytest.approx(0.05 * 128 / 64)
    # The optimizer itself took every step and ended on the table's last LR.
    assert summary["optimizer_steps"] == summary["steps"] == cfg.for_workers(2).total_steps
    assert summary["optimizer_last_lr"] == pytest.approx(
        cfg.for_workers(2).lr_at(summary["steps"] - 1)
    )
    assert summary["samples_per_sec"] > 0 and len(summary["rank_samples_per_sec"]) == 2
    assert math.isfinite(summary["noise_scale"])
    assert list(run.epochs["epoch"]) == [1, 2, 3, 4, 5, 6]

    # The LR the ranks used ramps per step during warm-up exactly as RunConfig says.
    warm = cfg.for_workers(2).warmup_steps
    rows = run.history
    assert rows["step"].is_monotonic_increasing
    for step, lr in zip(rows["step"], rows["lr"]):
        assert lr == pytest.approx(cfg.for_workers(2).lr_at(step - 1), rel=1e-6)
    assert (rows["step"] < warm).any(), "no row fell inside warm-up; cannot check the ramp"

    # Held-out evaluations every eval_interval steps (auto: 40 a run) and at the last step.
    every, total = cfg.for_workers(2).eval_every, cfg.for_workers(2).total_steps
    evaluated = rows[rows["eval_accuracy"].notna()]
    expected_steps = sorted({*range(every, total + 1, every), total})
    assert list(evaluated["step"]) == expected_steps and 38 <= len(expected_steps) <= 41
    assert evaluated["eval_accuracy"].iloc[-1] >= 0.85  # the subset agrees with the full set

    # The record on disk is complete and reads back the same (e.g. after a kernel restart).
    rec = load_run(run.path)
    assert rec.summary["status"] == "finished"
    assert rec.summary["val_accuracy"] == pytest.approx(summary["val_accuracy"])
    assert len(rec.history) == len(rows) and len(rec.epochs) == 6
    assert rec.config == cfg.to_dict() and rec.workers == 2
    # the live run exports what the record holds (the record's columns come back in JSON order)
    live, recorded = (pd.read_csv(io.StringIO(r.to_csv())) for r in (run, rec))
    pd.testing.assert_frame_equal(live, recorded, check_like=True)
    assert len(pd.read_csv(io.StringIO(run.to_csv(table="epochs")))) == 6


@pytest.mark.parametrize(
    "rule,expected", [("none", 0.05), ("sqrt", 0.05 * math.sqrt(4)), ("linear", 0.05 * 4)]
)
def test_scaled_lr_is_what_the_ranks_use(lab, rule, expected):
    cfg = RunConfig(
        batch_per_worker=64, base_batch=32, base_lr=0.05, lr_scaling=rule, warmup_epochs=0, **SMALL
    )
    summary = lab.run(cfg).wait(timeout=300)
    assert summary["lr"] == pytest.approx(expected)
    assert summary["optimizer_last_lr"] == pytest.approx(expected, rel=1e-6)  # what it applied
    assert load_run(summary and lab.current_run.path).history["lr"].iloc[-1] == pytest.approx(
        expected, rel=1e-6
    )


def test_mixed_bfloat16_trains_on_cpu(lab):
    """It trains where oneDNN runs bfloat16 (hpclab.rank.bfloat16's child probe, in the engines'
    environment); elsewhere the run fails at set-up with the ranks' sentence."""
    run = lab.run(RunConfig(precision="mixed_bfloat16", **SMALL))
    runs = bfloat16.probe()["ok"]
    assert runs is not None, "the bfloat16 probe timed out: the machine is too busy to tell"
    if not runs:
        with pytest.raises(RunFailed, match="TF_ENABLE_ONEDNN_OPTS=0"):
            run.wait(timeout=300)
        assert run.status == "failed" and lab.healthy
        return
    summary = run.wait(timeout=300)
    assert run.status == "finished"
    assert math.isfinite(run.history["loss"].iloc[-1])
    assert summary["val_accuracy"] > 0.3  # chance is 0.1
    assert summary["precision"] == "mixed_bfloat16"


def test_mixed_float16_with_loss_scaling_and_fp16_allreduce(lab):
    run = lab.run(RunConfig(precision="mixed_float16", fp16_allreduce=True, **SMALL))
    run.wait(timeout=300)
    assert run.status == "finished"
    assert run.summary["weights_digest"][0] == run.summary["weights_digest"][1]
    # It learned: steps skipped by the loss scaler would leave it at chance (0.1).
    assert run.summary["val_accuracy"] > 0.3
    # The loss-scale optimizer counts the steps it skips too: the LR table stays aligned.
    assert run.summary["optimizer_steps"] == run.summary["steps"]


def test_float16_without_loss_scaling_runs_and_counts_zero_gradients(lab):
    """loss_scaling=False trains float16 without the scaler; every run counts the gradient
    elements that are exactly 0 (dead units, or float16 underflow) on its sampled steps."""
    short = dict(num_samples=4000, batch_per_worker=64, max_steps=12, steps_per_call=3)
    f16 = lab.run(RunConfig(precision="mixed_float16", loss_scaling=False, **short))
    f16.wait(timeout=300)
    f32 = lab.run(RunConfig(**short)).wait(timeout=300)
    assert f16.status == "finished" and f16.summary["optimizer_steps"] == 12
    for summary in (f16.summary, f32):
        assert 0.0 <= summary["grad_zero_fraction"] < 1.0
    # four calls of three steps: one sampled step per call, one row per call at least
    fractions = f16.history["grad_zero_fraction"].dropna()
    assert len(fractions) >= 1 and fractions.between(0.0, 1.0).all()


@pytest.mark.parametrize("change", [{"grad_allreduce": "per_tensor"}, {"xla": True}])
def test_per_tensor_allreduce_and_xla_train_the_same_model(lab, change):
    # Same data, seed and updates: the replicas agree, and the result matches the default path to
    # float tolerance in accuracy (XLA may fuse differently, so not bit for bit).
    base = lab.run(RunConfig(**SMALL)).wait(timeout=300)
    other = lab.run(RunConfig(**SMALL, **change)).wait(timeout=300)
    assert other["status"] == "finished"
    assert other["weights_digest"][0] == other["weights_digest"][1]
    assert other["val_accuracy"] == pytest.approx(base["val_accuracy"], abs=0.02)


def test_lars_and_lamb_train(lab):
    # Short runs: the point is that each optimizer runs distributed and learns (chance is 0.1).
    for opt, lr in (("lars", 0.1), ("lamb", 0.005)):
        run = lab.run(RunConfig(optimizer=opt, base_lr=lr, lars_eta=0.1, **SMALL))
        run.wait(timeout=300)
        assert run.status == "finished", (opt, run.error)
        assert run.summary["val_accuracy"] > 0.25, opt


def test_one_run_at_a_time(lab):
    run = lab.run(RunConfig(num_samples=4000, epochs=50))
    assert _wait_for_rows(run), run.error
    try:
        with pytest.raises(LabError, match="still running"):
            lab.run(RunConfig(**SMALL))
    finally:
        run.stop()
    assert run.status == "stopped"


def test_stop_ends_every_rank_within_two_seconds(lab):
    run = lab.run(RunConfig(num_samples=8000, epochs=200))
    assert _wait_for_rows(run), run.error
    t0 = time.perf_counter()
    run.stop(timeout=10)
    latency = time.perf_counter() - t0
    assert run.done and run.status == "stopped"
    print(f"stop latency {latency:.2f} s")
    assert latency < 2.0, f"stop took {latency:.2f} s"
    assert run.summary["steps"] < RunConfig(num_samples=8000, epochs=200).for_workers(2).total_steps
    rec = load_run(run.path)
    assert rec.summary["status"] == "stopped" and len(rec.history) > 0
    assert not (run.path / "STOP").exists()
    # the engines are still healthy: the next run works without a restart
    assert lab.healthy
    assert lab.run(RunConfig(**SMALL)).wait(timeout=300)["status"] == "finished"


def test_nan_loss_ends_the_run_as_diverged(lab):
    cfg = RunConfig(
        optimizer="sgd",
        base_lr=100.0,
        base_batch=1,
        lr_scaling="linear",
        warmup_epochs=0,
        num_samples=4000,
        epochs=20,
    )
    run = lab.run(cfg)
    with pytest.raises(RunFailed, match="NaN or infinite"):
        run.wait(timeout=300)
    assert run.status == "diverged"
    assert run.summary["steps"] < cfg.for_workers(2).total_steps
    assert load_run(run.path).summary["status"] == "diverged"
    assert lab.healthy


def _lab_processes(lab) -> list:
    """The lab's processes on this machine: controller, mpiexec and its tree (engines, nannies)."""
    import psutil

    root = psutil.Process(lab._engines.cluster.controller.process.pid)
    launcher = psutil.Process(lab._engines._engine_set.process.pid)
    return [root, launcher, *launcher.children(recursive=True)]


def test_a_hung_rank_is_named_and_every_process_of_the_engine_set_goes(lab):
    import psutil

    run = lab.run(RunConfig(num_samples=8000, epochs=200))
    assert _wait_for_rows(run), run.error
    victim = lab.ranks[1]
    engines = [p for p in _lab_processes(lab)[1:] if p.pid != victim["pid"]]
    t0 = time.perf_counter()
    os.kill(victim["pid"], signal.SIGSTOP)
    with pytest.raises(RunFailed) as info:
        run.wait(timeout=HANG_S + 30)
    named_after = time.perf_counter() - t0
    print(f"\nhung rank 1 named {named_after:.1f} s after SIGSTOP (watchdog bound {HANG_S:g} s)")
    # silence counts from the last beat seen, up to one beat before the SIGSTOP
    assert HANG_S - HEARTBEAT_S <= named_after < HANG_S + 10
    message = str(info.value)
    assert f"rank 1 (pid {victim['pid']} on {victim['host']}) stopped responding" in message, (
        message
    )
    assert "SIGSTOP" in message and "rank 0" not in message and "lab.restart()" in message
    assert load_run(run.path).summary["status"] == "failed"
    # the stopped rank is killed too, and nothing of the engine set survives it
    _, alive = psutil.wait_procs([psutil.Process(victim["pid"]), *engines], timeout=15)
    assert not alive, [p.info if hasattr(p, "info") else p for p in alive]
    assert not lab.healthy
    lab.restart()
    assert lab.run(RunConfig(**SMALL)).wait(timeout=300)["status"] == "finished"


def test_a_killed_controller_fails_the_run_and_stop_leaves_nothing(lab):
    import psutil

    run = lab.run(RunConfig(num_samples=8000, epochs=200))
    assert _wait_for_rows(run), run.error
    processes = _lab_processes(lab)
    controller = [processes[0], *processes[0].children(recursive=True)]  # hub, schedulers
    processes += controller[1:]
    t0 = time.perf_counter()
    for p in controller:  # kill -9 of the controller and the processes it started
        p.kill()
    with pytest.raises(RunFailed) as info:
        run.wait(timeout=HANG_S + 30)
    noticed_after = time.perf_counter() - t0
    assert "no rank sent a heartbeat" in str(info.value)
    assert "controller" in str(info.value) and "exited" in str(info.value), str(info.value)
    t1 = time.perf_counter()
    lab.stop()
    stop_s = time.perf_counter() - t1
    _, alive = psutil.wait_procs(processes, timeout=15)
    print(f"\ncontroller death noticed after {noticed_after:.1f} s; lab.stop() took {stop_s:.1f} s")
    assert not alive, alive
    assert stop_s < STOP_BOUND_S
    lab.start()
    assert lab.run(RunConfig(**SMALL)).wait(timeout=300)["status"] == "finished"


def test_a_killed_mpiexec_is_named_and_nothing_is_left(lab):
    import psutil

    run = lab.run(RunConfig(num_samples=8000, epochs=200))
    assert _wait_for_rows(run), run.error
    processes = _lab_processes(lab)
    t0 = time.perf_counter()
    processes[1].kill()  # mpiexec (hydra): MPI ends every rank
    with pytest.raises(RunFailed, match="mpiexec exited with status -9"):
        run.wait(timeout=HANG_S + 30)
    print(f"\nkill -9 of mpiexec named after {time.perf_counter() - t0:.1f} s")
    lab.stop()
    _, alive = psutil.wait_procs(processes[1:], timeout=15)
    assert not alive, alive
    lab.start()


def test_killed_rank_fails_the_run_and_restart_recovers(lab):
    run = lab.run(RunConfig(num_samples=8000, epochs=200))
    assert _wait_for_rows(run), run.error
    victim = lab.ranks[1]
    t0 = time.perf_counter()
    os.kill(victim["pid"], signal.SIGKILL)
    with pytest.raises(RunFailed) as info:
        run.wait(timeout=15)
    elapsed = time.perf_counter() - t0
    assert elapsed < 15
    assert run.status == "failed"
    assert "rank 1" in str(info.value) and "lab.restart()" in str(info.value)
    assert load_run(run.path).summary["status"] == "failed"
    assert not lab.healthy
    lab.restart()
    assert lab.healthy
    assert lab.run(RunConfig(**SMALL)).wait(timeout=300)["status"] == "finished"


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs (needs root and mount rights: CI has both), unmounted afterwards."""
    import subprocess

    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(folder) -> None:
    """Write into `folder` until its file system is full."""
    with open(folder / "ballast", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_full_disk_or_a_deleted_run_folder_keeps_the_run_going_and_stop_still_works(
    lab, small_tmpfs, caplog
):
    runs_dir = lab.runs_dir
    try:
        _faults_on_disk(lab, small_tmpfs, caplog)
    finally:
        lab.runs_dir = runs_dir


def _faults_on_disk(lab, small_tmpfs, caplog):
    import shutil

    for fault in ("full", "deleted"):
        lab.runs_dir = small_tmpfs / fault
        run = lab.run(RunConfig(num_samples=8000, epochs=200))
        assert _wait_for_rows(run), run.error
        if fault == "full":
            _fill(small_tmpfs)
        else:
            shutil.rmtree(run.path)
        time.sleep(3)  # more rows arrive and cannot be written
        assert not run.done and run.disk_error, (fault, run.status, run.error)
        rows_before_stop = len(run.history)
        run.stop(timeout=30)
        assert run.status == "stopped", (fault, run.status, run.error)
        assert "the run folder stopped taking rows" in run.error
        written = run.path / "metrics.jsonl"
        kept = len(load_run(run.path).history) if written.exists() else 0
        assert kept < rows_before_stop <= len(run.history)  # memory has what disk lost
        assert run.record().history.shape[0] == len(run.history)
        assert lab.healthy  # the engines are fine: the next run trains
        (small_tmpfs / "ballast").unlink(missing_ok=True)
    warnings = [r for r in caplog.records if "keeps its rows in memory" in r.getMessage()]
    assert len(warnings) == 2  # once per run, not once per row
    lab.runs_dir = small_tmpfs / "after"
    assert lab.run(RunConfig(**SMALL)).wait(timeout=300)["status"] == "finished"

"""Checkpoints and resume (hpclab.rank.checkpoint, hpclab.cluster.resume).

Unit tests write and read checkpoints and check a resume's refusals and rescale rules without
engines; the MPI test stops a real 2-rank run after its first checkpoint, resumes it, and
compares its final weights with an uninterrupted run of the same seed, bit for bit. A run that
loses a rank and resumes on one worker by a rule is notebook 11's, checked by its claim
(tests/test_notebooks.py, _claim_11: the rule's batch and LR, recorded); a SIGUSR1 under Slurm
and the follow-up job, tests/slurm/test_resume_job.py.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from hpclab.cluster import resume
from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError
from hpclab.rank import checkpoint
from hpclab.records.store import RunStore, load_run

# -- checkpoints on disk (no engines) ----------------------------------------------------------


def _values(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(3, 4)).astype(np.float32), np.array(seed, dtype=np.int64)]


def test_write_is_atomic_keeps_the_last_two_and_reads_back(tmp_path):
    for step in (10, 20, 30):
        out = checkpoint.write(tmp_path, step, _values(step), {"model": "cnn1d"})
        assert out["bytes"] > 0 and out["seconds"] >= 0
    files = checkpoint.listed(tmp_path)
    assert [p.name for p in files] == [checkpoint.name(20), checkpoint.name(30)]
    assert not [p for p in checkpoint.folder(tmp_path).iterdir() if p.suffix == ".tmp"]
    values, meta = checkpoint.load(checkpoint.latest(tmp_path))
    assert meta["step"] == 30 and meta["model"] == "cnn1d"
    for got, want in zip(values, _values(30)):
        assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path, caplog, damage):
    checkpoint.write(tmp_path, 10, _values(10), {})
    checkpoint.write(tmp_path, 20, _values(20), {})
    newest = checkpoint.listed(tmp_path)[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"x" * len(data))
    with caplog.at_level(logging.WARNING, logger="hpclab.rank.checkpoint"):
        found = checkpoint.latest(tmp_path)
    assert found is not None and found.name == checkpoint.name(10)
    warned = [r.getMessage() for r in caplog.records]
    assert any(newest.name in m and "falling back" in m for m in warned), warned


def test_no_checkpoint_is_none(tmp_path):
    assert checkpoint.latest(tmp_path) is None


# -- a resume's refusals (no engines) ------------------------------------------------------------

CFG = RunConfig(num_samples=4096, epochs=2, checkpoint_every=10)


def _recorded(tmp_path, status: str | None, cfg: RunConfig = CFG, workers: int = 2, ckpt=True):
    store = RunStore(tmp_path)
    store.create({"config": cfg.to_dict(), "workers": workers})
    if status is not None:
        store.write_summary({"status": status, "stop_reason": "requested"})
    if ckpt:
        checkpoint.write(store.path, 20, _values(1), {"model": cfg.model})
    return store.path


def test_a_resume_with_another_model_or_workers_names_each_field(tmp_path):
    path = _recorded(tmp_path, "stopped")
    other = CFG.replace(model="mlp", base_lr=0.1)
    with pytest.raises(ConfigError) as err:
        resume.prepare(path, other, 3, tmp_path)
    text = str(err.value)
    assert "model recorded 'cnn1d', asked 'mlp'" in text
    assert "base_lr recorded 0.05, asked 0.1" in text
    assert "workers recorded 2, asked 3" in text
    assert text.count(".") <= 3 and text.endswith(".")  # one sentence (numbers hold dots)


def test_a_resume_of_a_run_without_checkpoint_or_finished_is_refused(tmp_path):
    bare = _recorded(tmp_path, "stopped", ckpt=False)
    with pytest.raises(ConfigError, match="has no checkpoint to resume from"):
        resume.prepare(bare, None, 2, tmp_path)
    done = _recorded(tmp_path, "finished")
    with pytest.raises(ConfigError, match="ended finished; only a stopped, failed or abandoned"):
        resume.prepare(done.name, None, 2, tmp_path)  # (a run id, under the runs folder)


def test_a_resume_may_change_only_labels_and_cadences(tmp_path):
    path = _recorded(tmp_path, "stopped")
    asked = CFG.replace(name="again", publish_every_s=1.0, checkpoint_every=5)
    checked = resume.prepare(path, asked, 2, tmp_path)
    assert checked.cfg is asked and checked.from_step == 20
    assert checked.resumed == [
        {
            "from_step": 20,
            "previous_status": "stopped",
            "stop_reason": "requested",
            "detail": None,
            "exact": True,
        }
    ]


def test_a_resume_of_a_model_averaging_run_warns_it_is_not_exact(tmp_path, caplog):
    cfg = CFG.replace(update="local_sgd", average_every=4)
    path = _recorded(tmp_path, "stopped", cfg=cfg)
    with caplog.at_level(logging.WARNING, logger="hpclab.cluster.resume"):
        checked = resume.prepare(path, None, 2, tmp_path)
    assert checked.resumed[-1]["exact"] is False
    assert any("update='local_sgd'" in r.getMessage() for r in caplog.records)


def test_reopening_a_run_folder_drops_rows_past_the_checkpoint(tmp_path):
    path = _recorded(tmp_path, "stopped")
    store = RunStore(tmp_path, path.name)
    store.append_history([{"step": s} for s in (10, 20, 30)])
    store.append_epochs([{"epoch": 1, "step": 15}, {"epoch": 2, "step": 30}])
    store.request_stop()
    store.reopen(20, {"resumed": [{"from_step": 20}]})
    record = load_run(path)
    assert list(record.history["step"]) == [10, 20]
    assert list(record.epochs["epoch"]) == [1]
    assert record.summary == {} and not store.stop_file.exists()
    assert record.meta["resumed"] == [{"from_step": 20}]


def test_checkpoints_by_minutes_and_the_number_kept(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(checkpoint.time, "monotonic", lambda: clock[0])
    saver = checkpoint.Checkpointer(tmp_path, 0, 0, {}, minutes=2.0, keep=3)
    assert saver.steps_to(5, 100) == 100  # minutes do not cut calls
    assert not saver.due(5, "finished", 100)
    clock[0] += 119.0
    assert not saver.due(6, "finished", 100)
    clock[0] += 1.0
    assert saver.due(7, "finished", 100) and not saver.due(100, "finished", 100)
    for step in range(1, 6):
        saver.save(step, _values(step), {})
    assert [p.name for p in checkpoint.listed(tmp_path)] == [checkpoint.name(s) for s in (3, 4, 5)]
    assert not saver.due(8, "finished", 100)  # the save restarted the clock
    assert saver.due(8, "stopped", 100)  # a stop always saves (to resume from)
    assert saver.summary()["keep"] == 3 and saver.summary()["minutes"] == 2.0
    off = checkpoint.Checkpointer(tmp_path, 0, 0, {})
    assert not off.due(8, "stopped", 100) and off.summary() is None


def test_a_resume_on_other_workers_needs_a_rule_and_records_it(tmp_path, caplog):
    path = _recorded(tmp_path, "failed")  # 2 workers, batch 64 each: global 128
    with pytest.raises(ConfigError, match="choose rescale= one of keep_global_batch"):
        resume.prepare(path, None, 1, tmp_path)
    with caplog.at_level(logging.WARNING, logger="hpclab.cluster.resume"):
        kept = resume.prepare(path, None, 1, tmp_path, "keep_global_batch")
    assert any("not bit for bit" in r.getMessage() for r in caplog.records)
    assert kept.cfg.batch_per_worker == 2 * CFG.batch_per_worker
    entry = kept.resumed[-1]
    assert entry["exact"] is False and kept.start_step == 20 and kept.workers == 1
    two, one = CFG.for_workers(2), kept.cfg.for_workers(1)
    assert entry["rescale"]["global_batch"] == [two.global_batch, one.global_batch]
    assert entry["rescale"]["peak_lr"] == [two.peak_lr, one.peak_lr] and one.peak_lr == two.peak_lr

    per_rank = resume.prepare(path, None, 1, tmp_path, "keep_per_rank_batch")
    one = CFG.for_workers(1)
    assert per_rank.cfg == CFG and per_rank.resumed[-1]["rescale"]["peak_lr"][1] == one.peak_lr
    assert per_rank.start_step == 20 * two.global_batch // one.global_batch
    with pytest.raises(ConfigError, match="global batch 128 to split evenly over 3 workers"):
        resume.prepare(path, None, 3, tmp_path, "keep_global_batch")
    with pytest.raises(ConfigError, match="rescale='half' is not a rule"):
        resume.prepare(path, None, 1, tmp_path, "half")


def test_a_resume_falls_back_past_a_damaged_newest_checkpoint_with_a_warning(tmp_path, caplog):
    path = _recorded(tmp_path, "stopped")  # a checkpoint at step 20
    checkpoint.write(path, 40, _values(2), {"model": CFG.model})
    newest = checkpoint.listed(path)[-1]
    newest.write_bytes(newest.read_bytes()[:100])  # a walltime kill mid-copy, say
    with caplog.at_level(logging.WARNING, logger="hpclab.rank.checkpoint"):
        checked = resume.prepare(path, None, 2, tmp_path)
    assert checked.from_step == 20 and checked.checkpoint.name == checkpoint.name(20)
    assert any(newest.name in r.getMessage() for r in caplog.records)


def test_hpclab_run_resume_on_other_workers_refuses_a_rule_that_cannot_hold(tmp_path, capsys):
    from hpclab.tools import cli

    path = _recorded(tmp_path, "failed")
    argv = ["run", "--resume", str(path), "--workers", "3", "--no-progress"]
    assert cli.main([*argv, "--runs-dir", str(tmp_path)]) == 2
    assert "choose rescale= one of keep_global_batch, keep_per_rank_batch" in (
        capsys.readouterr().err
    )
    rule = ["--rescale", "keep_global_batch", "--runs-dir", str(tmp_path)]
    assert cli.main([*argv, *rule]) == 2
    assert "global batch 128 to split evenly over 3 workers" in capsys.readouterr().err


# -- real ranks --------------------------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.slow
def test_a_stopped_run_resumed_ends_with_the_weights_of_an_uninterrupted_one(lab):
    """Resumed by a sweep of that one point (a sweep under a walltime resumes its unfinished
    point; the sweep calls lab.run(resume=...)); the uninterrupted run carries another name,
    a label only, so the sweep does not take it for the point's result."""
    every = 20
    cfg = RunConfig(num_samples=8192, epochs=5, checkpoint_every=every, seed=3, max_steps=0)
    whole = lab.run(cfg.replace(name="whole")).wait(300)
    assert whole["status"] == "finished"
    assert whole["checkpoints"]["written"] == whole["steps"] // every - (
        whole["steps"] % every == 0
    )

    run = lab.run(cfg)
    past = threading.Event()

    def on_row(r):
        row = r.last_row
        if row is not None and row["step"] > every:
            past.set()

    run.on_update(on_row)
    assert past.wait(120), "no history row past the first checkpoint arrived"
    run.stop(timeout=60)
    stopped = run.wait(60, check=False)
    assert stopped["status"] == "stopped", stopped.get("error")
    stop_step = stopped["steps"]
    assert checkpoint.read_meta(checkpoint.latest(run.path))["step"] == stop_step

    seen = []
    [record] = lab.sweep(cfg, seed=[3], progress=lambda *a: seen.append(a[-1]))
    assert seen == ["running", "finished"] and record.path == run.path
    end = record.summary
    assert end["status"] == "finished"
    assert end["steps"] == whole["steps"] and end["start_step"] == stop_step
    assert end["weights_digest"] == whole["weights_digest"]  # every rank, bit for bit
    assert end["resumed"] == [
        {
            "from_step": stop_step,
            "previous_status": "stopped",
            "stop_reason": "requested",
            "detail": "stopped on request (run.stop())",
            "exact": True,
        }
    ]
    steps = list(load_run(run.path).history["step"])
    assert steps == sorted(set(steps)) and steps[-1] == whole["steps"]
    with pytest.raises(ConfigError, match="ended finished"):
        lab.run(resume=run)


def test_hpclab_run_resume_refuses_a_finished_run_before_any_engine(tmp_path, capsys):
    from hpclab.tools import cli

    done = _recorded(tmp_path, "finished")
    code = cli.main(["run", "--resume", done.name, "--runs-dir", str(tmp_path), "--no-progress"])
    assert code == 2
    assert f"run {done.name} ended finished" in capsys.readouterr().err

"""hpclab.records.sweep: the grid (pure), its validation before anything starts, ordering, resuming.

The real sweep (MPI engines, Horovod) runs through the CLI in tests/test_cli.py. Here a small
stand-in lab records what the sweep asks of it, so ordering, restarts, skipping and failure
handling are checked in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpclab.core.config import ConfigError, RunConfig
from hpclab.core.engine_settings import EngineSettings
from hpclab.core.errors import RunFailed
from hpclab.records.store import RunStore
from hpclab.records.sweep import check_staged, describe, expand_grid, plan, run_sweep

BASE = RunConfig(num_samples=4000, epochs=1)


# ---------------------------------------------------------------------------------------------
# expand_grid: pure
# ---------------------------------------------------------------------------------------------


def test_product_in_key_order_first_key_slowest():
    points = expand_grid(BASE, batch_per_worker=[32, 256], lr_scaling=["none", "linear", "sqrt"])
    assert [(c.batch_per_worker, c.lr_scaling, w) for c, w in points] == [
        (32, "none", None),
        (32, "linear", None),
        (32, "sqrt", None),
        (256, "none", None),
        (256, "linear", None),
        (256, "sqrt", None),
    ]
    assert all(c.num_samples == 4000 and c.epochs == 1 for c, _ in points)  # base kept


def test_workers_group_the_points_in_the_order_given():
    points = expand_grid(BASE, batch_per_worker=[32, 64], workers=[2, 1])
    assert [(c.batch_per_worker, w) for c, w in points] == [(32, 2), (64, 2), (32, 1), (64, 1)]


def test_empty_grid_is_the_base_config_once():
    assert expand_grid(BASE) == [(BASE, None)]
    assert expand_grid(BASE, workers=[4]) == [(BASE, 4)]


def test_duplicates_are_run_once():
    points = expand_grid(BASE, batch_per_worker=[32, 32, 64], workers=[2, 2])
    assert [(c.batch_per_worker, w) for c, w in points] == [(32, 2), (64, 2)]


def test_tuple_valued_field_takes_a_list_of_tuples():
    cfg = RunConfig(dataset="synthetic", model="resnet20", num_samples=1000)
    points = expand_grid(cfg, image_shape=[(32, 32, 3), (16, 16, 1)])
    assert [c.image_shape for c, _ in points] == [(32, 32, 3), (16, 16, 1)]


@pytest.mark.parametrize(
    "grid, names",
    [
        ({"batch_per_worker": [32, 0]}, ["batch_per_worker=0"]),
        ({"lr_scaling": ["none", "cubic"]}, ["lr_scaling", "cubic"]),
        ({"batch": [32]}, ["'batch'"]),
        ({"workers": [2, 0]}, ["workers=0"]),
        ({"workers": [1.5]}, ["workers=1.5"]),
        ({"batch_per_worker": 256}, ["batch_per_worker=256", "lists"]),
        ({"lr_scaling": "linear"}, ["lr_scaling='linear'", "lists"]),
        ({"optimizer": []}, ["optimizer=[]"]),
    ],
)
def test_a_bad_key_or_value_is_named(grid, names):
    with pytest.raises(ConfigError) as err:
        expand_grid(BASE, **grid)
    for name in names:
        assert name in str(err.value)


def test_a_bad_combination_is_found_whatever_its_position():
    # each value is fine alone; the last combination is not (a model for images on 1-D data)
    with pytest.raises(ConfigError, match="model"):
        expand_grid(BASE, dataset=["mnist1d", "synthetic"], model=["mlp", "resnet20"])


def test_check_staged_names_the_missing_file(tmp_path):
    check_staged(RunConfig(), tmp_path)  # MNIST-1D is generated, nothing to stage
    with pytest.raises(FileNotFoundError, match="cifar10.npz"):
        check_staged(RunConfig(dataset="cifar10", model="resnet20"), tmp_path)
    (tmp_path / "cifar10.npz").write_bytes(b"")
    check_staged(RunConfig(dataset="cifar10", model="resnet20"), tmp_path)


def test_describe_names_swept_fields_the_label_does_not_show():
    point = plan(
        BASE, "/nonexistent", current_workers=2, lars_eta=[0.02, 0.1], batch_per_worker=[256]
    )[0]
    text = describe(point, ["lars_eta", "batch_per_worker"])
    assert text.startswith("b256 linear+wu1 ×2 lars_eta=0.02 (global batch 512, peak lr 0.4)")


# ---------------------------------------------------------------------------------------------
# run_sweep with a stand-in lab (records what it is asked; writes records like the real one)
# ---------------------------------------------------------------------------------------------


class _Run:
    def __init__(self, store: RunStore, status: str):
        self.path, self.run_id, self.status = store.path, store.run_id, status

    def wait(self, timeout=None):
        if self.status in ("failed", "diverged"):
            raise RunFailed(f"run {self.run_id} {self.status}")
        return {}


class _Lab:
    """Just enough of hpclab.Lab for run_sweep: workers, runs_dir, data_dir, run, restart."""

    def __init__(self, root: Path, workers: int = 2, outcomes: dict | None = None):
        self.workers, self.runs_dir, self.data_dir = workers, root, root / "data"
        self.engine_settings = EngineSettings()
        self.healthy = True
        self.calls: list = []
        self.outcomes = outcomes or {}  # batch_per_worker -> status

    def restart(self, workers=None, cfg=None):
        self.calls.append(("restart", workers))
        self.workers = workers or self.workers

    def run(self, cfg):
        self.calls.append(("run", cfg.batch_per_worker, self.workers))
        status = self.outcomes.get(cfg.batch_per_worker, "finished")
        store = RunStore(self.runs_dir)
        store.create(
            {
                "config": cfg.to_dict(),
                "workers": self.workers,
                "derived": cfg.for_workers(self.workers).derived(),
            }
        )
        store.write_summary(
            {
                "status": status,
                "val_accuracy": 0.5,
                "wall_time_s": 1.0,
                "error": None if status == "finished" else "lr too high",
            }
        )
        return _Run(store, status)


def test_runs_current_size_first_and_restarts_once_per_other_size(tmp_path, capsys):
    lab = _Lab(tmp_path, workers=2)
    records = run_sweep(lab, BASE, batch_per_worker=[32, 64], workers=[1, 2])
    assert lab.calls == [
        ("run", 32, 2),
        ("run", 64, 2),
        ("restart", 1),
        ("run", 32, 1),
        ("run", 64, 1),
    ]
    assert [(r.config["batch_per_worker"], r.workers, r.status) for r in records] == [
        (32, 2, "finished"),
        (64, 2, "finished"),
        (32, 1, "finished"),
        (64, 1, "finished"),
    ]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[1/4] b32 linear ×2 (global batch 64")  # = base_batch: no ramp
    assert " finished val_acc 0.500 (" in lines[0] and lines[0].endswith(" s)")
    assert len(lines) == 4


def test_a_second_sweep_skips_what_finished_and_starts_nothing(tmp_path):
    lab = _Lab(tmp_path, workers=2, outcomes={64: "failed", 128: "diverged"})
    run_sweep(lab, BASE, batch_per_worker=[32, 64, 128])
    assert [c[1] for c in lab.calls] == [32, 64, 128]  # the failed one did not stop the sweep

    seen = []
    lab2 = _Lab(tmp_path, workers=1, outcomes={64: "failed"})
    records = run_sweep(
        lab2, BASE, progress=lambda *a: seen.append(a), batch_per_worker=[32, 64, 128], workers=[2]
    )
    # only the point without a result runs again (resuming; the diverged one is a result and is
    # reused); the lab was at 1 worker, so it restarts once, for that point
    assert lab2.calls == [("restart", 2), ("run", 64, 2)]
    assert [r.status for r in records] == ["finished", "failed", "diverged"]
    assert [(i, n, c.batch_per_worker, w, s) for i, n, c, w, s in seen] == [
        (1, 3, 32, 2, "skipped"),
        (2, 3, 64, 2, "running"),
        (2, 3, 64, 2, "failed"),
        (3, 3, 128, 2, "skipped"),
    ]


def test_a_finished_sweep_needs_no_restart(tmp_path):
    lab = _Lab(tmp_path, workers=2)
    run_sweep(lab, BASE, progress=lambda *a: None, batch_per_worker=[32], workers=[1])
    again = _Lab(tmp_path, workers=2)
    run_sweep(again, BASE, progress=lambda *a: None, batch_per_worker=[32], workers=[1])
    assert again.calls == []


def test_nothing_starts_when_any_point_is_invalid(tmp_path):
    lab = _Lab(tmp_path)
    with pytest.raises(ConfigError, match="batch_per_worker=-1"):
        run_sweep(lab, BASE, batch_per_worker=[32, 64, -1])
    with pytest.raises(FileNotFoundError, match="mnist.npz"):
        run_sweep(lab, BASE.replace(model="mlp"), dataset=["mnist1d", "mnist"])
    assert lab.calls == []


def test_lost_engines_are_restarted_before_the_next_point(tmp_path):
    lab = _Lab(tmp_path, outcomes={32: "failed"})
    original_run = lab.run

    def run_and_lose(cfg):
        run = original_run(cfg)
        lab.healthy = cfg.batch_per_worker != 32  # this run "killed" the engines
        return run

    lab.run = run_and_lose
    records = run_sweep(lab, BASE, progress=lambda *a: None, batch_per_worker=[32, 64])
    assert lab.calls == [("run", 32, 2), ("restart", None), ("run", 64, 2)]
    assert [r.status for r in records] == ["failed", "finished"]

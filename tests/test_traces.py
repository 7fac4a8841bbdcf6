"""The trace reader (hpclab/core/traces.py) on the real files in data/scaling-traces/: every
source read into the lab's quantities, and the figures the issues quote read back exactly."""

from __future__ import annotations

import pytest

from hpclab.core import traces
from hpclab.core.errors import ConfigError

POLLUX = traces.traces_dir() / "pollux-osdi21"


@pytest.mark.parametrize(
    "workload, rows, batches",
    [
        ("cifar10", 1512, [128, 256, 512, 1024, 2048, 4096]),
        ("imagenet", 1152, [200, 400, 800, 1600, 3200, 6400, 12800]),
        ("bert", 720, [12, 24, 48, 96, 192, 384]),
        ("ncf", 2119, [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]),
    ],
)
def test_every_pollux_workload_reads_whole(workload, rows, batches):
    steps = traces.read_steps(POLLUX / workload)
    assert len(steps) == rows
    assert max(r.gpus for r in steps) == 64 and max(r.nodes for r in steps) == 16
    assert all(r.step_s >= r.sync_s >= 0 and r.samples_per_s > 0 for r in steps)
    assert sorted(traces.read_runs(POLLUX / workload)) == batches


def test_placements_become_gpus_nodes_and_the_fullest_node():
    steps = traces.read_steps(POLLUX / "imagenet")
    one = [r for r in steps if r.gpus == 1 and r.local_batch == 20]
    assert len(one) == 1 and one[0].step_s == pytest.approx(0.14740917682647706)
    # "1223": 8 GPUs on 4 nodes, 3 on the fullest, not uniform
    (r,) = [
        r
        for r in steps
        if r.source == "placements"
        and r.gpus == 8
        and r.nodes == 4
        and r.per_node == 3
        and r.local_batch == 20
        and not r.uniform
    ][:1]
    assert r.global_batch == 160
    # a scalability row of 7 replicas on 6 nodes: 2 on the fullest
    (s,) = [r for r in steps if r.source == "scalability" and r.gpus == 7 and r.local_batch == 20]
    assert (s.nodes, s.per_node, s.uniform) == (6, 2, False)


def test_synchronisation_at_16_nodes_falls_as_the_local_batch_grows():
    """Issue 44's figure: ImageNet on 16 nodes (one T4 each), sync 0.39 s at local batch 20 and
    0.009 s at 200 — the allreduce hides behind a longer backward pass."""
    steps = traces.read_steps(POLLUX / "imagenet")
    at = {r.local_batch: r.sync_s for r in steps if r.nodes == 16 and r.gpus == 16}
    assert at[20] == pytest.approx(0.39, abs=0.005) and at[200] == pytest.approx(0.009, abs=0.0005)


def test_steps_to_target_and_b_simple_from_the_validation_runs():
    runs = traces.read_runs(POLLUX / "imagenet")
    steps = traces.steps_to_target(runs, 0.75)
    assert all(s is not None and s > 0 for s in steps.values())
    assert steps[200] > steps[400] > steps[800]  # more steps at smaller batches
    assert traces.steps_to_target(runs, 0.99)[200] is None  # never reached
    # lower is better: the first evaluation at or below the target
    assert runs[200].steps_to(10.0, lower_is_better=True) == int(runs[200].iteration[0])
    # B_simple = B0 · grad_var / grad_sqr at the first evaluation of the B = 200 run
    first = runs[200].b_simple(200)[0]
    assert first == pytest.approx(200 * 5.227778350418925 / 1.1263841568054573)


def test_mlperf_rows_give_steps_time_and_gpu_hours():
    """Issue 44's reading: 8 → 64 GPUs at the same batch is 5.1x faster; 8 → 768 GPUs is 36.8x
    faster for 2.6x the GPU-hours."""
    rows = traces.read_mlperf()
    assert [r.gpus for r in rows] == [8, 64, 512, 768]
    by = {r.gpus: r for r in rows}
    assert by[8].minutes_median / by[64].minutes_median == pytest.approx(5.1, abs=0.05)
    assert by[8].minutes_median / by[768].minutes_median == pytest.approx(36.8, abs=0.1)
    assert by[768].gpu_hours / by[8].gpu_hours == pytest.approx(2.6, abs=0.05)
    assert by[8].steps == pytest.approx(35 * traces.IMAGENET_TRAIN / 3200)


def test_a_malformed_folder_is_named_in_one_sentence(tmp_path):
    with pytest.raises(ConfigError, match="placements.csv does not exist"):
        traces.read_steps(tmp_path)
    (tmp_path / "placements.csv").write_text("placement,local_bsz,step_time\n1,2,0.1\n")
    with pytest.raises(ConfigError, match="lacks the column"):
        traces.read_steps(tmp_path)
    (tmp_path / "placements.csv").write_text("placement,local_bsz,step_time,sync_time\nx,2,1,0\n")
    with pytest.raises(ConfigError, match="placement must be"):
        traces.read_steps(tmp_path)


def test_the_traces_are_found_in_hpclab_data_when_staged_there(tmp_path, monkeypatch):
    """An install without the checkout finds them where the centre stages its data."""
    monkeypatch.setenv("HPCLAB_DATA", str(tmp_path))
    assert traces.traces_dir() == POLLUX.parent  # nothing staged: the checkout's
    (tmp_path / "scaling-traces").mkdir()
    assert traces.traces_dir() == tmp_path / "scaling-traces"

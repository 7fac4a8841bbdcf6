"""Summarising a Horovod timeline file (hpclab.core.timeline): json only, no Horovod."""

import json

import pytest

from hpclab.core.timeline import read_events, summarise


def _write(path, events, closed=False, trailing=","):
    """Horovod's way: '[' then one event per line with a trailing comma, array left open."""
    text = "[\n" + "".join(json.dumps(e) + trailing + "\n" for e in events)
    path.write_text(text + ("]" if closed else ""))
    return path


EVENTS = [
    {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grads_0"}},
    {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": 1, "ts": 1000},
    {"name": "NEGOTIATE_ALLREDUCE", "ph": "E", "pid": 1, "ts": 1600},  # 600 µs
    {"name": "ALLREDUCE", "ph": "B", "pid": 1, "ts": 1700},
    {"name": "MPI_ALLREDUCE", "ph": "B", "pid": 1, "ts": 1750},
    {"name": "MPI_ALLREDUCE", "ph": "E", "pid": 1, "ts": 1950},  # 200 µs, nested
    {"name": "ALLREDUCE", "ph": "E", "pid": 1, "ts": 2000},  # 300 µs
    {"name": "CYCLE_START", "ph": "X", "pid": 0, "ts": 2100, "dur": 40},
]


@pytest.mark.parametrize("closed", [False, True])
def test_an_open_or_closed_timeline_sums_each_activity_per_step(tmp_path, closed):
    path = _write(tmp_path / "timeline.json", EVENTS, closed=closed)
    out = summarise(path, steps=2)
    assert out["ms_per_step"] == pytest.approx(
        {"NEGOTIATE_ALLREDUCE": 0.3, "ALLREDUCE": 0.15, "MPI_ALLREDUCE": 0.1, "CYCLE_START": 0.02}
    )
    assert out["tensors"] == ["grads_0"] and out["steps"] == 2 and out["events"] == len(EVENTS)


def test_a_torn_last_event_is_dropped_and_an_empty_file_is_no_events(tmp_path):
    path = _write(tmp_path / "t.json", EVENTS[:3])
    path.write_text(path.read_text() + '{"name": "ALLRED')  # the writer was mid-line
    assert len(read_events(path)) == 3
    (tmp_path / "e.json").write_text("")
    assert read_events(tmp_path / "e.json") == []
    assert summarise(tmp_path / "e.json", 10)["ms_per_step"] == {}


def test_each_tensor_groups_own_times_stack_to_its_time_in_the_timeline(tmp_path):
    """by_tensor: a parent activity keeps only its own time (its nested parts taken out), so a
    tensor's parts add up to the span it occupied; rank readiness marks ("0", "1") are left out;
    events of no named tensor (the cycle marks) count only in the activity totals."""
    second = [
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "grads_1"}},
        {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": 2, "ts": 1000},
        {"name": "0", "ph": "X", "pid": 2, "ts": 1010, "dur": 0},
        {"name": "1", "ph": "X", "pid": 2, "ts": 1390, "dur": 0},
        {"name": "NEGOTIATE_ALLREDUCE", "ph": "E", "pid": 2, "ts": 1400},  # 400 µs
        {"name": "ALLREDUCE", "ph": "B", "pid": 2, "ts": 1700},
        {"name": "MEMCPY_IN_FUSION_BUFFER", "ph": "B", "pid": 2, "ts": 1700},
        {"name": "MEMCPY_IN_FUSION_BUFFER", "ph": "E", "pid": 2, "ts": 1720},
        {"name": "MPI_ALLREDUCE", "ph": "B", "pid": 2, "ts": 1720},
        {"name": "MPI_ALLREDUCE", "ph": "E", "pid": 2, "ts": 1980},
        {"name": "ALLREDUCE", "ph": "E", "pid": 2, "ts": 2000},
    ]
    out = summarise(_write(tmp_path / "timeline.json", EVENTS + second), steps=1)
    by = out["by_tensor"]
    assert set(by) == {"grads_0", "grads_1"} and out["tensors"] == ["grads_0", "grads_1"]
    assert by["grads_0"] == pytest.approx(
        {"NEGOTIATE_ALLREDUCE": 0.6, "ALLREDUCE": 0.1, "MPI_ALLREDUCE": 0.2}
    )
    assert by["grads_1"] == pytest.approx(
        {
            "NEGOTIATE_ALLREDUCE": 0.4,
            "ALLREDUCE": 0.02,
            "MEMCPY_IN_FUSION_BUFFER": 0.02,
            "MPI_ALLREDUCE": 0.26,
        }
    )
    spans = {"grads_0": (1600 - 1000) + (2000 - 1700), "grads_1": (1400 - 1000) + (2000 - 1700)}
    for tensor, parts in by.items():
        assert sum(parts.values()) == pytest.approx(spans[tensor] / 1000)
    assert out["ms_per_step"]["CYCLE_START"] == pytest.approx(0.04)

"""Summarising a Horovod timeline file (hpclab.timeline): json only, no Horovod."""

import json

import pytest

from hpclab.timeline import read_events, summarise


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

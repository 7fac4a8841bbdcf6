"""The time split's clock (hpclab.core.devices.split_method, hpclab.rank.step.Stamp), on CPU.

What a CPU can check: which method each rank picks, and that a device-synced stamp waits for a
host copy of what it stamps (ops in the graph) while a host-clock stamp does not. What only a
GPU can check, that the synced parts then match the device's own timings, is in
docs/cluster.md (GPU section) and scripts/gpu-check.sh.
"""

from __future__ import annotations

import pytest

from hpclab.core.devices import SPLIT_METHODS, TIME_SYNCS, split_method
from hpclab.core.errors import ConfigError


@pytest.mark.parametrize(
    ("sync", "gpu", "on", "method"),
    [
        ("auto", True, True, "device_sync"),  # a GPU: the host clock would read dispatch times
        ("auto", False, True, "host_clock"),  # a CPU: an op has finished when it returns
        ("device", False, True, "device_sync"),  # forced, to measure the sync's cost on CPU
        ("host", True, True, "host_clock"),  # never: dispatch times on a GPU, said so
        ("auto", True, False, "off"),  # time_split off: no stamps at all
    ],
)
def test_split_method(sync, gpu, on, method):
    assert split_method(sync, gpu, on) == method
    assert method in SPLIT_METHODS


def test_unknown_time_sync_is_refused_by_name():
    with pytest.raises(ConfigError, match="time_sync must be one of auto, device, host"):
        split_method("gpu", True)
    assert TIME_SYNCS == ("auto", "device", "host")


def test_time_sync_is_a_run_knob():
    from hpclab.core.config import RunConfig

    assert RunConfig().time_sync == "auto"
    with pytest.raises(ConfigError, match="time_sync"):
        RunConfig(time_sync="sometimes")


def _ops(method: str) -> set[str]:
    import tensorflow as tf

    from hpclab.rank.step import Stamp

    stamp = Stamp(tf, method)
    w = tf.Variable(tf.ones([64, 64]))

    @tf.function
    def step():
        t0 = stamp([])  # no tensors: nothing to sync with
        with tf.control_dependencies([t0]):
            y = tf.matmul(w, w)
        return stamp([y, tf.constant(3, tf.int64)]) - t0

    graph = step.get_concrete_function().graph
    assert float(step()) >= 0.0  # runs on CPU, the second stamp after the first
    return {op.type for op in graph.get_operations()}


def test_device_sync_stamp_waits_for_a_host_copy_and_host_clock_does_not():
    synced, plain = _ops("device_sync"), _ops("host_clock")
    assert {"ConcatV2", "Timestamp"} <= synced
    assert "ConcatV2" not in plain and "Timestamp" in plain
    assert {op for op in _ops("off")} & {"Timestamp"} == set()

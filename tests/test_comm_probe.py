"""The allreduce size sweep on real ranks (hpclab/studies/comm_probe.py, hpclab/rank/probes/collectives.py):
small messages are latency-bound, large ones bandwidth-bound — the curve behind tensor fusion."""

from __future__ import annotations

import pytest

from hpclab.core.errors import ConfigError
from hpclab.studies import comm_probe


@pytest.mark.mpi
def test_small_allreduces_are_latency_bound_large_ones_bandwidth_bound(lab):
    frame = comm_probe.allreduce_sweep(lab, sizes=[1024, 16 * 1024, 4 * 2**20, 64 * 2**20])
    print("[allreduce]", frame[["bytes", "ms", "busbw_GBps"]].round(4).to_dict("records"))
    assert list(frame["bytes"]) == [1024, 16 * 1024, 4 * 2**20, 64 * 2**20]
    assert (frame["where"] == "intra-node").all() and (frame["ranks"] == 2).all()
    ms, bw = frame["ms"].tolist(), frame["busbw_GBps"].tolist()
    assert ms[1] < 4 * ms[0]  # 16x the bytes, nowhere near 16x the time: latency-bound
    assert ms[3] > 8 * ms[2]  # 16x the bytes, close to 16x the time: bandwidth-bound
    assert bw[3] > 20 * bw[0]  # a 1 kB message uses a sliver of the bandwidth
    fig = comm_probe.figure(frame)
    assert [t.y.tolist() for t in fig.data] == [ms, bw]


@pytest.mark.parametrize(
    "kwargs, field",
    [({"sizes": []}, "sizes"), ({"sizes": [2**31]}, "sizes"), ({"repeats": 0}, "repeats")],
)
def test_sweep_arguments_are_checked_first(kwargs, field):
    with pytest.raises(ConfigError, match=f"{field} must be"):
        comm_probe.allreduce_sweep(None, **kwargs)

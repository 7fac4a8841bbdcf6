"""`allreduce_sweep(lab)`: the cost of one allreduce from 1 kB to 64 MB on the lab's real
ranks, as a table and a log-log chart (`hpclab.rank.probes.collectives` does the timing).

Every rank of a lab on one machine talks through shared memory, so the result is labelled
``intra-node``; across nodes the same sweep measures the network (InfiniBand, Slingshot), whose
latency is microseconds higher and whose bandwidth is lower than memory's. Each sweep is
recorded as a CSV under ``<runs_dir>/.comm/``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hpclab.core.errors import ConfigError

SIZES = tuple(2**k for k in range(10, 27, 2))  # 1 KiB, 4 KiB, ..., 64 MiB
TIMEOUT_S = 300.0


def allreduce_sweep(lab, sizes=SIZES, repeats: int = 10) -> pd.DataFrame:
    """Rank 0's median time per size and its bandwidths; ``where`` says intra- or inter-node."""
    from hpclab.rank.probes import collectives

    sizes = list(sizes)
    if not sizes or not all(isinstance(s, int) and 4 <= s <= 2**30 for s in sizes):
        raise ConfigError(f"sizes must be byte counts from 4 to 2**30; you passed {sizes!r}.")
    if not (isinstance(repeats, int) and 1 <= repeats <= 1000):
        raise ConfigError(f"repeats must be an integer from 1 to 1000; you passed {repeats!r}.")
    per_rank = lab.apply(collectives.allreduce_times, sizes, repeats, timeout=TIMEOUT_S)
    frame = pd.DataFrame([row for rows in per_rank for row in rows if row["rank"] == 0])
    hosts = {r.get("node") or r.get("host") for r in lab.ranks}
    frame["where"] = "intra-node" if len(hosts) <= 1 else f"{len(hosts)} nodes"
    record = Path(lab.runs_dir) / ".comm"
    record.mkdir(mode=0o700, exist_ok=True)
    frame.to_csv(record / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.csv", index=False)
    return frame


def figure(frame: pd.DataFrame) -> go.Figure:
    """Time (left) and bus bandwidth (right) against message size, both log-scaled."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("time per allreduce (ms)", "bus bandwidth (GB/s)"),
    )
    label = f"{frame['ranks'].iloc[0]} ranks, {frame['where'].iloc[0]}"
    for col, y in ((1, "ms"), (2, "busbw_GBps")):
        fig.add_trace(
            go.Scatter(
                x=frame["bytes"],
                y=frame[y],
                mode="lines+markers",
                name=label,
                showlegend=col == 1,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(type="log", title_text="message size (bytes)", row=1, col=col)
        fig.update_yaxes(type="log", row=1, col=col)
    fig.update_layout(height=360, margin=dict(t=60, b=40, l=50, r=20))
    return fig

"""Horovod's timeline of a few steps, summarised: where each collective spends its time.

With ``RunConfig.timeline_steps = n`` every rank calls ``hvd.start_timeline`` after the run's
first call (graph optimisation is over) and ``hvd.stop_timeline`` ``n`` steps later; Horovod's
coordinator (rank 0) writes ``timeline.json`` into the run folder in Chrome's trace format (Horovod
docs, "Analyze Performance": open it in ``chrome://tracing`` or https://ui.perfetto.dev). The
first run of a lab that asks for one restarts the engines with ``HOROVOD_TIMELINE=DYNAMIC``
(:meth:`hpclab.core.engine_settings.EngineSettings.for_run`), which lets a run switch it on and off.

:func:`summarise` turns the file into milliseconds per step of each activity Horovod records:
``NEGOTIATE_ALLREDUCE`` (ranks reporting a tensor ready: the wait for the last rank shows here),
``ALLREDUCE`` (the operation as a whole) and its parts — ``QUEUE``, ``MEMCPY_IN_FUSION_BUFFER``,
``MPI_ALLREDUCE``, ``MEMCPY_OUT_FUSION_BUFFER`` … — summed over tensors. json only, no Horovod.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

FILE = "timeline.json"


def read_events(path: Path | str) -> list[dict]:
    """The trace events of a Horovod timeline file (Horovod leaves the JSON array unclosed while
    it writes, and sometimes after: the text is closed here before parsing)."""
    text = Path(path).read_text(encoding="utf-8", errors="replace").strip()
    if not text:
        return []
    text = text.rstrip(",")
    if not text.endswith("]"):
        text += "]"
    try:
        events = json.loads(text)
    except json.JSONDecodeError:  # a torn last event: drop it
        cut = text.rstrip("]").rstrip().rstrip(",")
        events = json.loads(cut[: cut.rfind("}") + 1] + "]") if "}" in cut else []
    return [e for e in events if isinstance(e, dict)]


def summarise(path: Path | str, steps: int) -> dict:
    """Milliseconds per step of each timeline activity, summed over tensors; the same split per
    tensor group; the tensors seen.

    Begin/end pairs ("ph": "B"/"E") nest per tensor (``pid``); complete events ("ph": "X") carry
    their duration. Activities are keyed by name (NEGOTIATE_ALLREDUCE, ALLREDUCE, …).
    ``ms_per_step`` sums each activity's whole duration, nested ones included (an ALLREDUCE holds
    its MPI_ALLREDUCE); ``by_tensor`` gives each tensor's activities their *own* time (children
    taken out), so one tensor's parts add up to its time in the timeline and stack in a chart.
    The per-rank readiness marks inside a negotiation (events named by a rank number) are left
    out of ``by_tensor``."""
    events = read_events(path)
    names = {
        e.get("pid"): (e.get("args") or {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    total: dict[str, float] = defaultdict(float)
    own: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    open_: dict = defaultdict(list)  # pid -> stack of [name, ts, time of its children]

    def close(pid, name: str, took: float, children: float) -> None:
        total[name] += took
        if names.get(pid) and not name.isdigit():
            own[names[pid]][name] += took - children
        if open_[pid]:
            open_[pid][-1][2] += took

    for e in events:
        ph, pid = e.get("ph"), e.get("pid")
        if ph == "B":
            open_[pid].append([e.get("name", "?"), float(e.get("ts", 0)), 0.0])
        elif ph == "E" and open_[pid]:
            name, ts, children = open_[pid].pop()
            close(pid, name, float(e.get("ts", 0)) - ts, children)
        elif ph == "X":
            close(pid, e.get("name", "?"), float(e.get("dur", 0)), 0.0)
    per = 1000.0 * max(int(steps), 1)  # µs in all steps → ms per step
    return {
        "file": FILE,
        "steps": int(steps),
        "ms_per_step": {k: v / per for k, v in sorted(total.items())},
        "by_tensor": {
            t: {k: v / per for k, v in sorted(a.items())} for t, a in sorted(own.items())
        },
        "tensors": sorted(n for n in names.values() if n),
        "events": len(events),
    }


__all__ = ["FILE", "read_events", "summarise"]

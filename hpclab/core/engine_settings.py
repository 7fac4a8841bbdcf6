"""`EngineSettings`: what Horovod reads once, at ``hvd.init()``, on every engine of a `Lab`.

A run's knobs travel with each run (:class:`hpclab.core.config.RunConfig`); these do not:
Horovod's background loop takes them from the engines' environment when it starts, so other
values need fresh engines. The `Lab` owns one `EngineSettings` (``lab.engine_settings``), starts
its engines with :meth:`EngineSettings.env`, records both in every run's ``config.json``
(``meta["lab"]``), and restarts the engines when a run needs other settings
(:meth:`EngineSettings.for_run`, the one rule).

- ``cycle_time_ms``: the pause between the background loop's negotiation rounds
  (``HOROVOD_CYCLE_TIME``). Horovod's own default of 1 ms costs the lab's small model about a
  third of its 2-rank throughput; 0.1 ms does not (benchmarks/README.md).
- ``fusion_mb``: the tensor-fusion buffer (``HOROVOD_FUSION_THRESHOLD``; Horovod docs, "Tensor
  Fusion"): small tensors are packed into one allreduce of up to this size; 0 turns fusion off.
- ``timeline``: a dynamic Horovod timeline a run may switch on (``RunConfig.timeline_steps``,
  :mod:`hpclab.core.timeline`).
- ``groups``: the synchronous groups of hybrid runs, registered as Horovod process sets
  (``HPCLAB_HOROVOD_GROUPS``; hpclab.rank.features.groups).
- ``stall_s``: how long a rank may make no progress — stay in one stage of a run, such as
  reading its data — before the client's watchdog names it and ends the run
  (:mod:`hpclab.cluster.watchdog`: a first compile may take 5×, a training call 10× the longest
  so far); Horovod's stall check warns in the engines' log after the same time, naming the
  ranks that did not join a collective (``HOROVOD_STALL_CHECK_TIME_SECONDS``; Horovod docs,
  "Troubleshooting").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpclab.core.catalog import MAX_WORKERS
from hpclab.core.errors import ConfigError

#: the engines' environment variable naming the groups to register at hvd.init()
#: (read on the rank by hpclab.rank.features.groups.at_init)
GROUPS_ENV = "HPCLAB_HOROVOD_GROUPS"

#: The RunConfig fields two of these settings were before the Lab owned them: records written
#: then keep them in their config (hpclab.records.store.settle_engine_settings moves them out).
FORMER_RUN_CONFIG_FIELDS = {"hvd_cycle_time_ms": "cycle_time_ms", "hvd_fusion_mb": "fusion_mb"}

#: The settings that change a run's throughput (the scaling charts never average across them,
#: a sweep never reuses a record made with others); timeline and groups are kept on engines
#: that no longer need them, at no measurable cost (see EngineSettings.for_run).
THROUGHPUT_FIELDS = ("cycle_time_ms", "fusion_mb")


def needs_process_sets(world: int, groups: int) -> bool:
    """Whether ``groups`` groups of ``world`` ranks need Horovod process sets: one group is the
    global set, and groups of one rank need no gradient allreduce at all (local SGD)."""
    return 1 < groups < world and world % groups == 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fail(name: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"EngineSettings.{name} must be {allowed}; you passed {name}={value!r}.")


@dataclass(frozen=True)
class EngineSettings:
    """The settings Horovod reads at ``hvd.init()``: one set per `Lab`, changed by a restart.

    >>> Lab(workers=2, engine_settings=EngineSettings(cycle_time_ms=1.0))
    """

    cycle_time_ms: float = 0.1  # Horovod: background cycle between negotiation rounds (ms)
    fusion_mb: float = 64.0  # Horovod: tensor-fusion buffer (MB; 0 = no fusion)
    timeline: bool = False  # a dynamic timeline runs may switch on (timeline_steps)
    groups: int = 1  # synchronous groups of hybrid runs, registered as process sets
    stall_s: float = 120.0  # a rank making no progress this long is named (and Horovod warns)

    def __post_init__(self) -> None:
        if not _is_number(self.cycle_time_ms) or not 0 < self.cycle_time_ms <= 1000:
            _fail("cycle_time_ms", self.cycle_time_ms, "a finite number > 0 and <= 1000")
        if not _is_number(self.fusion_mb) or not 0 <= self.fusion_mb <= 4096:
            _fail("fusion_mb", self.fusion_mb, "a finite number >= 0 and <= 4096 (0 = no fusion)")
        if not isinstance(self.timeline, bool):
            _fail("timeline", self.timeline, "True or False")
        g = self.groups
        if not isinstance(g, int) or isinstance(g, bool) or not 1 <= g <= MAX_WORKERS:
            _fail("groups", g, f"an integer from 1 to {MAX_WORKERS}")
        if not _is_number(self.stall_s) or not 1 <= self.stall_s <= 86400:
            _fail("stall_s", self.stall_s, "a finite number of seconds from 1 to 86400")

    def env(self) -> dict[str, str]:
        """The engines' environment that gives Horovod these settings at ``hvd.init()``.

        The groups are always set (a stray value in the client's environment must not leak in).
        The timeline only when on: a dynamic timeline makes every negotiation cycle carry its
        state (16 ranks on 2 cores took 5.5 s instead of < 2 s to stop a run with it on)."""
        env = {
            "HOROVOD_CYCLE_TIME": f"{self.cycle_time_ms:g}",
            "HOROVOD_FUSION_THRESHOLD": str(int(self.fusion_mb * 1024 * 1024)),
            GROUPS_ENV: str(self.groups),
            "HOROVOD_STALL_CHECK_TIME_SECONDS": str(max(1, round(self.stall_s))),
        }
        return {**env, "HOROVOD_TIMELINE": "DYNAMIC"} if self.timeline else env

    def for_run(self, cfg, workers: int) -> EngineSettings:
        """The settings engines with these ones must have read at ``hvd.init()`` to run ``cfg``
        on ``workers`` ranks; ``Lab.run`` restarts the engines when they differ.

        - Cycle time and fusion buffer are the lab's: a run never changes them.
        - A hybrid run whose groups need process sets (:func:`needs_process_sets`) needs its
          own grouping registered; registered groups stay while no hybrid run asks for others:
          a process set nobody uses costs nothing measurable (4 ranks, 1000 grouped allreduces,
          with and without: within the noise), and a restart costs seconds.
        - A run with ``timeline_steps`` needs the dynamic timeline; once on it stays on, for the
          same reason."""
        groups = self.groups
        if cfg.update == "hybrid" and needs_process_sets(workers, cfg.groups):
            groups = cfg.groups
        return self.replace(timeline=self.timeline or cfg.timeline_steps > 0, groups=groups)

    def for_workers(self, workers: int) -> EngineSettings:
        """These settings for a lab of ``workers`` ranks: groups that no longer divide them are
        dropped (one group; a hybrid run registers its own again)."""
        return self if workers % self.groups == 0 else self.replace(groups=1)

    def describe(self) -> str:
        """One line for a log: ``cycle time 0.1 ms, fusion buffer 64 MB, timeline off, 1 group``."""
        plural = "s" if self.groups != 1 else ""
        return (
            f"cycle time {self.cycle_time_ms:g} ms, fusion buffer {self.fusion_mb:g} MB, "
            f"dynamic timeline {'on' if self.timeline else 'off'}, "
            f"{self.groups} synchronous group{plural}"
        )

    def replace(self, **changes: Any) -> EngineSettings:
        """A copy with some settings changed (validated like new settings)."""
        unknown = sorted(set(changes) - set(field_names()))
        if unknown:
            raise ConfigError(
                f"EngineSettings has no field {unknown[0]!r}; known: {', '.join(field_names())}."
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineSettings:
        return cls().replace(**dict(data))


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(EngineSettings)]


__all__ = [
    "EngineSettings",
    "FORMER_RUN_CONFIG_FIELDS",
    "GROUPS_ENV",
    "THROUGHPUT_FIELDS",
    "field_names",
    "needs_process_sets",
]

"""Synchronous groups for hybrid updates: Horovod process sets of consecutive ranks.

``update="hybrid"`` with ``groups=G`` (hpclab.rank.features.averaging) splits the k ranks into G groups
of k/G consecutive ranks: inside a group the gradients are averaged every step (synchronous
SGD), across groups the *models* are averaged every ``average_every`` steps (local SGD between
groups). This is the shape of NERSC's 15-PF climate run (Kurth et al., "Deep learning at 15PF",
SC17, arXiv:1708.05256: synchronous groups, asynchronous exchange between them) with the
exchange made periodic and synchronous, as in Lin et al.'s hierarchical local SGD (ICLR 2020,
arXiv:1808.07217). Consecutive ranks are the ranks of one node under mpiexec and srun's block
placement, so when a node's ranks are a multiple of a group's size, a group's every-step
allreduce stays inside a node and only the rare model average crosses the network (6 ranks on 2
nodes in 3 groups would put ranks 2-3 on two nodes).

A group's allreduce runs over a Horovod *process set* (Horovod ≥ 0.23; "Process Sets" in its
docs). Process sets are fixed at ``hvd.init()`` unless ``HOROVOD_DYNAMIC_PROCESS_SETS`` is set,
which Horovod's own tests note slows every collective; so the engines register the groups when
they start (:func:`at_init`, from :data:`hpclab.core.engine_settings.GROUPS_ENV` in the engine environment) and ``Lab.run``
restarts them when a hybrid run asks for a grouping they lack (hpclab.core.engine_settings.EngineSettings.for_run).
"""

from __future__ import annotations

import os

from hpclab.core.engine_settings import GROUPS_ENV, needs_process_sets

_REGISTERED: dict[int, list] = {}  # on an engine: groups -> the ProcessSets registered at init


def members(world: int, groups: int) -> list[list[int]]:
    """The ranks of each of ``groups`` groups of consecutive ranks (``groups`` divides
    ``world``): ``members(4, 2) == [[0, 1], [2, 3]]``."""
    size = world // groups
    return [list(range(g * size, (g + 1) * size)) for g in range(groups)]


def across_nodes(hosts: list[str], groups: int) -> list[list[int]]:
    """The groups (their ranks) with ranks on more than one node, given each rank's host in
    rank order: their every-step allreduce crosses the network, which the grouping is meant to
    spare (``across_nodes(["a", "a", "b", "b"], 2) == []``)."""
    if not needs_process_sets(len(hosts), groups):
        return []
    return [g for g in members(len(hosts), groups) if len({hosts[r] for r in g}) > 1]


def at_init(hvd, world: int) -> list:
    """The ProcessSets to pass to ``hvd.init(process_sets=...)`` on every rank alike: the groups
    the engine environment names (none without it), remembered for :func:`of_rank`."""
    groups = int(os.environ.get(GROUPS_ENV, "1") or 1)
    if not needs_process_sets(world, groups):
        return []
    sets = [hvd.ProcessSet(ranks) for ranks in members(world, groups)]
    _REGISTERED[groups] = sets
    return sets


def of_rank(hvd, world: int, groups: int, rank: int):
    """The process set of ``rank``'s group: Horovod's global set for one group, None for groups
    of one rank (local SGD: nothing to average each step). Raises if the engines did not
    register this grouping at start (``Lab.run`` restarts them first, so this means a bug)."""
    if groups == 1:
        return hvd.global_process_set
    if groups == world:
        return None
    if groups not in _REGISTERED:
        raise RuntimeError(
            f"the engines registered no Horovod process sets for {groups} groups "
            f"({GROUPS_ENV}={os.environ.get(GROUPS_ENV)!r}); Lab.run restarts the engines for a new grouping."
        )
    return _REGISTERED[groups][rank // (world // groups)]


__all__ = ["members", "across_nodes", "at_init", "of_rank"]

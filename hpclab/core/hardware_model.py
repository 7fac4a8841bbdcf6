"""Time per optimizer step on p ranks: compute + exposed allreduce + the rest, fitted or entered.

The model (every term in seconds per step, ``b`` the local batch, ``p`` the ranks)::

    T(b, p) = [compute(b) · s_c(p) + rest(b)] / LB(p) + exposed(b, p)
    exposed(b, p) = max(allreduce(n, p) · (1 − overlap) − φ · compute(b) · s_c(p), 0)

* ``compute(b) = c0 + c1·b`` — forward and backward, affine in the local batch (a fixed cost per
  step plus a cost per sample), fitted from the time split of short 1-rank runs
  (:mod:`hpclab.core.pop`'s ``compute`` part) or entered from a per-device rate. ``s_c(p)`` is POP's
  computation scalability inverted (how much slower each rank computes when p of them run at
  once; 1 when each rank has a device of its own).
* ``rest(b) = r0 + r1·b`` — the input, the loop, the optimizer's update, the call's rest and the
  host's Python (POP ``input + loop + apply + sync + host``), fitted the same way.
* ``LB(p)`` — POP's load balance, mean/max of the ranks' useful time: the slowest rank sets the
  step, so useful time divides by it. Measured from the spread of a multi-rank run's per-rank
  useful time, or entered (1: perfectly balanced).
* ``allreduce(n, p)`` — ``n`` the bytes of the model's gradients. Ring allreduce (Thakur,
  Rabenseifner and Gropp, "Optimization of Collective Communication Operations in MPICH",
  IJHPCA 19(1), 2005, sec. 4.4: reduce-scatter then allgather, each p − 1 steps)::

      ring(n, p) = 2(p − 1)·α + 2 (p − 1)/p · n/β

  with α the latency of one message and β the bandwidth of one link. Across nodes of g ranks
  each, a hierarchical allreduce (reduce-scatter inside the node, allreduce of n/g across the
  N nodes by each of the g ranks, allgather inside the node; Horovod's
  ``HOROVOD_HIERARCHICAL_ALLREDUCE``, NCCL's intra/inter split; Goyal et al. 2017, sec. 4.1).
  The g inter-node allreduces share the node's link (β_inter is *per node*, as network cards
  are quoted), so together they cost one ring of n over the nodes::

      hierarchical(n, p) = ring_intra(n, g) + ring_inter(n, N)

  and a flat ring through every rank runs at the slowest link: ``ring_inter(n, p)``.
  α and β are fitted from a measured allreduce size sweep (:mod:`hpclab.studies.comm_probe`) by
  least squares on relative residuals (:func:`fit_link`), or entered for a target cluster.
* ``overlap`` — the share of the allreduce hidden behind backprop: 0 for the lab's grouped
  allreduce (one fused op after the backward pass); per-tensor allreduces can overlap.
* ``overlap_window`` (φ) — where the allreduce runs bucket by bucket *during* backprop (PyTorch
  DDP, Horovod's per-tensor ops), it hides behind up to φ·compute(b) of the step, and only what
  is left shows (Qiao et al., "Pollux", OSDI 2021, whose throughput model combines compute and
  synchronisation as (T_grad^γ + T_sync^γ)^(1/γ); this is its γ → ∞ limit, the bound of perfect
  overlap)::

      exposed(b, p) = max(allreduce(n, p)·(1 − overlap) − φ·compute(b), 0)

  φ ≈ backprop's share of compute less the last bucket's tail (about 1/3 to 1/2); it is fitted
  where the allreduce first crosses a link (one GPU on each of two nodes: how the exposed
  synchronisation falls as the local batch grows, :mod:`hpclab.core.replay`). It is 0 for the
  lab's grouped allreduce, which runs after the backward pass.

Scaling efficiency (weak scaling, the local batch fixed) is ``T(b, 1) / T(b, p)``. NumPy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hpclab.core.errors import ConfigError

ALGORITHMS = ("ring", "hierarchical")
#: POP parts (hpclab.core.pop.PARTS) the model calls ``rest``: everything but compute and the
#: gradient allreduce.
REST_PARTS = ("input", "loop", "apply", "sync", "host")


def _number(name: str, value, *, lo: float = 0.0, open_lo: bool = True, hi=None) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    ok = math.isfinite(v) and (v > lo if open_lo else v >= lo) and (hi is None or v <= hi)
    if not ok:
        bound = f"{'>' if open_lo else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
        raise ConfigError(f"{name} must be a finite number {bound}; you passed {value!r}.")
    return v


@dataclass(frozen=True)
class Affine:
    """``seconds(b) = fixed_s + per_sample_s · b``: a per-step cost and a per-sample cost."""

    fixed_s: float
    per_sample_s: float
    source: str = "entered"

    def __post_init__(self) -> None:
        _number("fixed_s", self.fixed_s, open_lo=False)
        _number("per_sample_s", self.per_sample_s, open_lo=False)

    def __call__(self, batch) -> np.ndarray | float:
        out = self.fixed_s + self.per_sample_s * np.asarray(batch, dtype=float)
        return float(out) if np.ndim(out) == 0 else out

    @classmethod
    def from_rate(cls, samples_per_s: float, source: str = "entered") -> Affine:
        """A device that processes ``samples_per_s`` with no fixed cost per step."""
        return cls(0.0, 1.0 / _number("samples_per_s", samples_per_s), source)


def fit_affine(batches: Sequence, seconds: Sequence, source: str = "measured") -> Affine:
    """Least-squares ``seconds = fixed + per_sample · batch`` on relative residuals, both
    coefficients kept ≥ 0 (a negative fixed cost is noise, not physics). Needs two batches."""
    from scipy.optimize import lsq_linear

    b = np.asarray(list(batches), dtype=float)
    t = np.asarray(list(seconds), dtype=float)
    if b.shape != t.shape or b.ndim != 1:
        raise ConfigError(
            f"batches and seconds must be two lists of the same length; you passed {b.size} "
            f"and {t.size}."
        )
    if not (np.all(np.isfinite(b) & (b > 0)) and np.all(np.isfinite(t) & (t > 0))):
        raise ConfigError(
            f"batches and seconds must all be finite and > 0; you passed {b.tolist()!r} and "
            f"{t.tolist()!r}."
        )
    if np.unique(b).size < 2:
        raise ConfigError(
            f"batches must hold at least 2 different local batches to fit a fixed and a "
            f"per-sample cost; you passed {sorted(set(b.tolist()))!r}."
        )
    design = np.stack([np.ones_like(b), b], axis=1) / t[:, None]
    res = lsq_linear(design, np.ones_like(t), bounds=(0.0, np.inf))
    return Affine(float(res.x[0]), float(res.x[1]), source)


@dataclass(frozen=True)
class Link:
    """One kind of link: ``latency_s`` (α, per message) and ``bandwidth_Bps`` (β, bytes/s)."""

    latency_s: float
    bandwidth_Bps: float
    source: str = "entered"

    def __post_init__(self) -> None:
        _number("latency_s", self.latency_s, open_lo=False)
        _number("bandwidth_Bps", self.bandwidth_Bps)

    @classmethod
    def from_gbit(cls, gbit_per_s: float, latency_us: float, source: str = "entered") -> Link:
        """A network link as vendors quote it: Gbit/s and microseconds."""
        bw = _number("gbit_per_s", gbit_per_s) * 1e9 / 8
        return cls(_number("latency_us", latency_us, open_lo=False) * 1e-6, bw, source)


def ring_allreduce_s(n_bytes: float, ranks: int, link: Link) -> float:
    """Thakur et al. 2005: 2(p − 1)α + 2(p − 1)/p · n/β; 0 on one rank."""
    p = int(ranks)
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * link.latency_s + 2 * (p - 1) / p * float(n_bytes) / link.bandwidth_Bps


def fit_link(sizes: Sequence, seconds: Sequence, ranks: int, source: str = "measured") -> Link:
    """α and β of :func:`ring_allreduce_s` from a measured allreduce size sweep on ``ranks``
    ranks (least squares on relative residuals, α ≥ 0). The model is linear in α and 1/β."""
    from scipy.optimize import lsq_linear

    p = int(ranks)
    if p < 2:
        raise ConfigError(
            f"ranks must be at least 2 to fit an allreduce model (one rank sends nothing); "
            f"you passed {ranks!r}."
        )
    n = np.asarray(list(sizes), dtype=float)
    t = np.asarray(list(seconds), dtype=float)
    if n.shape != t.shape or np.unique(n).size < 2:
        raise ConfigError(
            f"sizes and seconds must be two lists of the same length with at least 2 different "
            f"sizes; you passed {n.tolist()!r} and {t.tolist()!r}."
        )
    if not (np.all(np.isfinite(t) & (t > 0)) and np.all(n > 0)):
        raise ConfigError(f"seconds must all be finite and > 0; you passed {t.tolist()!r}.")
    a, c = 2.0 * (p - 1), 2.0 * (p - 1) / p
    design = np.stack([a * np.ones_like(n), c * n], axis=1) / t[:, None]
    res = lsq_linear(design, np.ones_like(t), bounds=([0.0, 1e-18], [np.inf, np.inf]))
    alpha, inv_beta = (float(x) for x in res.x)
    return Link(alpha, 1.0 / inv_beta, source)


@dataclass(frozen=True)
class Network:
    """Where the ranks sit and how they talk: ``per_node`` ranks (GPUs) per node (0: every
    rank on one node, as in a lab on one machine), the links inside a node and between nodes
    (``inter``: one node's link, as network cards are quoted), and the allreduce algorithm."""

    intra: Link
    inter: Link | None = None
    per_node: int = 0
    algorithm: str = "hierarchical"

    def __post_init__(self) -> None:
        if not (isinstance(self.per_node, int) and self.per_node >= 0):
            raise ConfigError(
                f"per_node must be a whole number of ranks >= 1, or 0 for every rank on one "
                f"node; you passed {self.per_node!r}."
            )
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"algorithm must be one of {', '.join(ALGORITHMS)}; you passed {self.algorithm!r}."
            )

    def nodes(self, ranks: int) -> int:
        return math.ceil(int(ranks) / self.per_node) if self.per_node else 1

    def allreduce_s(self, n_bytes: float, ranks: int, nodes: int | None = None) -> float:
        """Seconds of one allreduce of ``n_bytes`` over ``ranks`` ranks (module doc); ``nodes``
        where a placement is uneven (``per_node`` then counts the fullest node's ranks)."""
        p = int(ranks)
        nodes = self.nodes(p) if nodes is None else int(nodes)
        if nodes <= 1:
            return ring_allreduce_s(n_bytes, p, self.intra)
        if self.inter is None:
            raise ConfigError(
                f"{p} ranks at {self.per_node} per node span {nodes} nodes, and the network "
                "has no inter-node link; enter one (Network(inter=Link.from_gbit(...)))."
            )
        if self.algorithm == "ring":
            return ring_allreduce_s(n_bytes, p, self.inter)
        # each of the g rings across nodes carries n/g, and the g of them share the node's
        # link: the same seconds as one ring of n over the nodes
        g = min(p, self.per_node)
        return ring_allreduce_s(n_bytes, g, self.intra) + ring_allreduce_s(
            n_bytes, nodes, self.inter
        )


@dataclass(frozen=True)
class HardwareModel:
    """Seconds per optimizer step for a local batch on a number of ranks (module doc)."""

    compute: Affine
    rest: Affine
    network: Network
    gradient_bytes: float
    load_balance: float = 1.0
    compute_slowdown: float = 1.0  # s_c(p) for p > 1: compute time at p ranks / at one
    overlap: float = 0.0
    overlap_window: float = 0.0  # φ: compute time the allreduce can hide behind (module doc)
    notes: dict = field(default_factory=dict, compare=False)
    # s_c measured at several local batches, ((batch, slowdown), ...): how much a rank's compute
    # slows beside the others depends on how long it computes, so where given it replaces the
    # single figure, interpolated in log(batch) and held flat beyond the ends
    slowdown_by_batch: tuple = ()

    def __post_init__(self) -> None:
        _number("gradient_bytes", self.gradient_bytes)
        _number("load_balance", self.load_balance, hi=1.0)
        _number("compute_slowdown", self.compute_slowdown, lo=1.0, open_lo=False)
        _number("overlap", self.overlap, open_lo=False, hi=1.0)
        _number("overlap_window", self.overlap_window, open_lo=False, hi=1.0)
        for b, sc in self.slowdown_by_batch:
            _number("slowdown_by_batch's batch", b)
            _number("slowdown_by_batch's slowdown", sc, lo=1.0, open_lo=False)

    def slowdown_at(self, local_batch: float) -> float:
        """s_c at ``local_batch``: from ``slowdown_by_batch`` where measured, else the single
        ``compute_slowdown``."""
        if not self.slowdown_by_batch:
            return self.compute_slowdown
        pts = sorted(self.slowdown_by_batch)
        x = np.log([b for b, _ in pts])
        return float(np.interp(math.log(local_batch), x, [sc for _, sc in pts]))

    def parts(self, local_batch: float, ranks: int, nodes: int | None = None) -> dict[str, float]:
        """The step's parts in seconds: compute, rest, imbalance (the wait the slowest rank
        causes), allreduce (exposed) and their sum, ``step``; ``nodes`` where a placement is
        uneven (:meth:`Network.allreduce_s`)."""
        b = _number("local_batch", local_batch)
        p = int(ranks)
        if p < 1:
            raise ConfigError(f"ranks must be a whole number >= 1; you passed {ranks!r}.")
        multi = p > 1
        compute = float(self.compute(b)) * (self.slowdown_at(b) if multi else 1.0)
        rest = float(self.rest(b))
        lb = self.load_balance if multi else 1.0
        imbalance = (compute + rest) * (1.0 / lb - 1.0)
        allreduce = self.network.allreduce_s(self.gradient_bytes, p, nodes) * (1.0 - self.overlap)
        allreduce = max(allreduce - self.overlap_window * compute, 0.0)
        return {
            "compute": compute,
            "rest": rest,
            "imbalance": imbalance,
            "allreduce": allreduce,
            "step": compute + rest + imbalance + allreduce,
        }

    def step_s(self, local_batch: float, ranks: int, nodes: int | None = None) -> float:
        return self.parts(local_batch, ranks, nodes)["step"]

    def samples_per_s(self, local_batch: float, ranks: int) -> float:
        return int(ranks) * float(local_batch) / self.step_s(local_batch, ranks)

    def efficiency(self, local_batch: float, ranks: int) -> float:
        """Weak-scaling efficiency T(b, 1) / T(b, p)."""
        return self.step_s(local_batch, 1) / self.step_s(local_batch, ranks)

    def with_network(self, network: Network, **changes) -> HardwareModel:
        """The same ranks on another network (a target cluster), other fields as given."""
        return replace(self, network=network, **changes)


def load_balance_of(useful_s: Sequence) -> float:
    """POP load balance mean/max of the ranks' useful time (hpclab.core.pop)."""
    u = np.asarray(list(useful_s), dtype=float)
    if u.size == 0 or not np.all(np.isfinite(u) & (u > 0)):
        raise ConfigError(
            f"useful_s must be one finite time > 0 per rank; you passed {u.tolist()!r}."
        )
    return float(u.mean() / u.max())


__all__ = [
    "ALGORITHMS",
    "REST_PARTS",
    "Affine",
    "fit_affine",
    "Link",
    "ring_allreduce_s",
    "fit_link",
    "Network",
    "HardwareModel",
    "load_balance_of",
]

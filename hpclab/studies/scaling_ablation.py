"""Where weak scaling's lost efficiency goes, by ablation: E(2) of the same step with one cost
after another switched off, and the loss split into parts that multiply (and add) up exactly.

At one per-rank batch, each variant runs on 1 and on 2 ranks and gives its throughput E(2) =
T_2 / (2 T_1). The variants switch the costs off cumulatively, in this order::

    full        the run as configured (the MLP on MNIST-1D: batches cut from a resident shard)
    synthetic   the same arithmetic on one random batch made once (dataset "synthetic", image
                shape (40, 1, 1): the 40 inputs of MNIST-1D), as Horovod's synthetic benchmark
    no_comm     + the gradient allreduce skipped (knob ``skip_allreduce``: a measuring device
                only; the replicas drift apart, their weight digests differ at the end)
    bare        + live telemetry off (``publish_every_s=0``)

Each step's factor is the ratio of neighbouring E's, and what is left with everything off is the
remainder — computation scalability and contention, POP's name for two ranks computing more
slowly side by side than one alone (Wagner et al. 2017; pop-coe.eu)::

    E_full = (E_full / E_synthetic) (E_synthetic / E_no_comm) (E_no_comm / E_bare) E_bare
           =  input x communication x telemetry x remainder

a telescoping product, so it holds exactly — POP's model is multiplicative too. To read the
*lost* efficiency 1 - E_full in points that add up, each factor gets the share of
-ln E_full that its own -ln holds (logs turn the product into a sum). A factor above 1 (a cost
that switching off made *slower*: noise, or a real interaction) shows as a negative part. The
order matters when costs interact (an ablation attributes to each cost what switching it off
*after the previous ones* gained); the passes' spread is the yardstick for any part.

The model is the MLP because it accepts both the 1-D signals and the synthetic images (the CNN
takes 1-D signals only); evaluation every few steps and the gradient noise scale are off in
every variant, and E comes from the training throughput, which leaves out the real data's
validation at epoch ends: the variants differ in nothing but the cost they switch off.
"""

from __future__ import annotations

import math

import pandas as pd

from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError

#: The variants in ablation order: what each switches off on top of the previous ones.
VARIANTS = ("full", "synthetic", "no_comm", "bare")
#: The part of the loss each variant's switch attributes (the last row: what remains).
PARTS = {
    "input": ("full", "synthetic"),
    "communication": ("synthetic", "no_comm"),
    "telemetry": ("no_comm", "bare"),
}
REMAINDER = "computation scalability"
TAG = "ablation"


def variant(base: RunConfig, name: str, repeat: int = 0) -> RunConfig:
    """``base`` (a mnist1d run) with the costs before ``name`` in :data:`VARIANTS` switched off,
    tagged with the pass so a repeat trains again instead of reusing the recorded run."""
    if name not in VARIANTS:
        raise ConfigError(f"variant must be one of {', '.join(VARIANTS)}; you passed {name!r}.")
    cfg = base.replace(
        model="mlp",
        eval_samples=0,
        noise_scale=False,
        tags=(TAG, name, f"pass {repeat}"),
    )
    k = VARIANTS.index(name)
    if k >= 1:
        cfg = cfg.replace(dataset="synthetic", image_shape=(40, 1, 1), num_samples=base.num_samples)
    if k >= 2:
        cfg = cfg.replace(skip_allreduce=True)
    if k >= 3:
        cfg = cfg.replace(publish_every_s=0.0)
    return cfg


def attribute(e: dict[str, float]) -> dict[str, float]:
    """The factors (``<part>``) and lost E points (``<part> loss``) of E_full from the four
    variants' E(2) (module doc). The factors multiply to E_full and the losses add up to
    1 - E_full exactly (both up to rounding)."""
    missing = [v for v in VARIANTS if not (e.get(v) or 0) > 0]
    if missing:
        raise ConfigError(f"E of every variant must be > 0; missing or not positive: {missing}.")
    factors = {part: e[a] / e[b] for part, (a, b) in PARTS.items()}
    factors[REMAINDER] = e["bare"]
    out = {"E": e["full"], **factors}
    lost = 1.0 - e["full"]
    total = -math.log(e["full"])
    for part, f in factors.items():
        # E_full = 1 splits nothing; its parts' logs then cancel, so each loses 0 points
        out[f"{part} loss"] = lost * (-math.log(f) / total) if total else 0.0
    return out


def efficiencies(records) -> pd.DataFrame:
    """E(2) = T_2 / (2 T_1) per variant and pass, from the study's records (tags say which);
    T from the runs' training throughput (``samples_per_sec``)."""
    rate: dict = {}
    for r in records:
        tags = tuple(r.config.get("tags") or ())
        if TAG not in tags or not r.summary.get("samples_per_sec"):
            continue
        name = next(t for t in tags if t in VARIANTS)
        repeat = next(int(t.split()[1]) for t in tags if t.startswith("pass "))
        rate[(name, repeat, r.workers)] = float(r.summary["samples_per_sec"])
    rows = []
    for (name, repeat, n), t in sorted(rate.items()):
        if n == 2 and (name, repeat, 1) in rate:
            t1 = rate[(name, repeat, 1)]
            rows.append({"variant": name, "pass": repeat, "T_1": t1, "T_2": t, "E": t / (2 * t1)})
    return pd.DataFrame(rows)


def table(records) -> pd.DataFrame:
    """One row per pass (and one for their mean E's): E(2) of every variant, the factors and
    the lost E points of :func:`attribute`, and the passes' spread (max - min) as the last row."""
    e = efficiencies(records)
    if e.empty:
        return pd.DataFrame()
    rows = []
    for repeat, group in e.groupby("pass"):
        es = dict(zip(group["variant"], group["E"]))
        if all(v in es for v in VARIANTS):
            rows.append(
                {"pass": str(repeat), **{f"E {v}": es[v] for v in VARIANTS}, **attribute(es)}
            )
    out = pd.DataFrame(rows)
    if len(out) > 1:
        numbers = out.drop(columns="pass")
        spread = (numbers.max() - numbers.min()).to_dict()
        out = pd.concat([out, pd.DataFrame([{"pass": "spread", **spread}])], ignore_index=True)
    return out


def largest_loss(row: dict) -> str:
    """The part of :data:`PARTS` (or the remainder) that lost the most E points in ``row``."""
    parts = [*PARTS, REMAINDER]
    return max(parts, key=lambda p: row[f"{p} loss"])


def measure(lab, base: RunConfig, *, passes: int = 2, workers=None, progress=None) -> list:
    """Run every variant of ``base`` ``passes`` times on each size of ``workers`` (default: the
    lab's current size, then the other of 1 and 2: one restart); return the records. A lesson
    that restarts the engines anyway can take one size at a time (``workers=[1]`` now,
    ``workers=[2]`` later) and restart nothing more. Passes alternate with the variants so that
    a drift in the machine's load moves a pass, not one variant."""
    sizes = list(workers) if workers is not None else [lab.workers, 3 - lab.workers]
    if not sizes or any(n not in (1, 2) for n in sizes):
        raise ConfigError(f"workers must be a list of 1 and/or 2; you passed {workers!r}.")
    if not (isinstance(passes, int) and 1 <= passes <= 5):
        raise ConfigError(f"passes must be an integer from 1 to 5; you passed {passes!r}.")
    configs = [variant(base, v, p) for p in range(passes) for v in VARIANTS]  # validated first
    records = []
    for n in sizes:
        for cfg in configs:
            records += lab.sweep(cfg, workers=[n], progress=progress)
    return records


__all__ = [
    "VARIANTS",
    "PARTS",
    "REMAINDER",
    "variant",
    "attribute",
    "efficiencies",
    "table",
    "largest_loss",
    "measure",
]

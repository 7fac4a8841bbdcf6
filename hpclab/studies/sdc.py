"""`monte_carlo(lab)`: how often one bit flip in one weight breaks training, bit by bit.

P(failure) = P(failure | SDC) × P(SDC) (Zhang, Huang, Huang, Xu and Katz, "Quantifying the impact of memory errors in
deep learning", IEEE Cluster 2019): the second factor is the hardware's (an error rate per GB
and hour, per job), the first is measured here by injection. The lab's ranks train one state
with the study's config, then run ``trials`` short injections per bit from it
(:mod:`hpclab.rank.probes.sdc_trials`): each flips bit ``b`` of one seeded weight of one layer on rank
``rank``, trains ``steps`` steps and evaluates the held-out subset. A trial fails when its loss
went non-finite or its accuracy fell more than ``tolerance`` below a clean trial's from the same
state. Rates carry Wilson score intervals (Wilson 1927: they stay inside [0, 1] and are honest
at 0 of 10 or 10 of 10, where the normal approximation collapses to a point).

Each study is recorded as a CSV under ``<runs_dir>/.sdc/``.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from hpclab.core.catalog import FLOAT32_BITS
from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError, LabError

BITS = (31, 30, 29, 27, 22, 0)  # sign, three exponent bits, two mantissa bits
TIMEOUT_S = 900.0


def bit_field(bit: int) -> str:
    """Which field of a float32 ``bit`` belongs to."""
    return "sign" if bit == 31 else "exponent" if bit >= 23 else "mantissa"


def monte_carlo(
    lab,
    cfg: RunConfig | None = None,
    *,
    bits=BITS,
    trials: int = 10,
    steps: int = 20,
    tolerance: float = 0.02,
    rank: int = 1,
    layers=None,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per trial: ``bit``, ``field``, ``layer_name``, ``element``, ``before``/``after``
    (the weight's value), ``val_accuracy``, ``finite``, ``detected`` (the loss-spike detector
    fired), ``failed``; ``clean_accuracy`` is the clean trial's. ``cfg`` (default: 2 epochs,
    detector on at 3x) trains the state the trials start from."""
    from hpclab.rank.probes import sdc_trials

    cfg = cfg or RunConfig(epochs=2, eval_samples=1024, spike_factor=3.0)
    bits = list(bits)
    if not bits or not all(isinstance(b, int) and 0 <= b < FLOAT32_BITS for b in bits):
        raise ConfigError(f"bits must be float32 bit positions 0 to 31; you passed {bits!r}.")
    for name, value, lo, hi in (("trials", trials, 1, 1000), ("steps", steps, 1, 1000)):
        if not (isinstance(value, int) and lo <= value <= hi):
            raise ConfigError(f"{name} must be an integer from {lo} to {hi}; you passed {value!r}.")
    if not (isinstance(rank, int) and 0 <= rank < lab.workers):
        raise ConfigError(
            f"rank must be a rank of this lab (0 to {lab.workers - 1}); you passed {rank!r}."
        )
    if not 0 <= tolerance < 1:
        raise ConfigError(f"tolerance must be from 0 to 1 (accuracy); you passed {tolerance!r}.")
    if not cfg.eval_samples or cfg.dataset == "synthetic":
        raise ConfigError(
            "monte_carlo judges trials on held-out data: eval_samples > 0, real data."
        )
    run_plan = cfg.for_workers(lab.workers)  # (checks cfg fits the lab)
    if steps > run_plan.steps_per_epoch:
        raise ConfigError(f"steps must be at most an epoch ({run_plan.steps_per_epoch}).")
    lab.ready_for(cfg)  # (engines with the process sets of a hybrid study, say)
    record = Path(lab.runs_dir) / ".sdc"
    record.mkdir(mode=0o700, exist_ok=True)
    plan = {
        "bits": bits,
        "trials": trials,
        "steps": steps,
        "rank": rank,
        "layers": layers,
        "seed": seed,
    }
    outs = lab.apply(
        sdc_trials.run,
        cfg.to_dict(),
        run_plan.to_dict(),
        str(record),
        str(lab.data_dir),
        plan,
        timeout=TIMEOUT_S,
    )
    out = outs[rank]  # (the flipping rank knows the values it flipped; the rest is global)
    if out["clean"] is None:
        raise LabError(f"the study's training run did not finish: {out['warmup']}")
    frame = pd.DataFrame(out["trials"])
    frame.insert(1, "field", frame["bit"].map(bit_field))
    frame["clean_accuracy"] = out["clean"]["val_accuracy"]
    frame["failed"] = ~frame["finite"] | (
        frame["val_accuracy"] < frame["clean_accuracy"] - tolerance
    )
    frame.to_csv(record / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.csv", index=False)
    return frame


def runs_table(runs) -> pd.DataFrame:
    """One row per run: what was flipped (``after`` the flip, from ``before``), when the
    detector fired, whether the replicas were equal right after the flip and at the end, the
    rollbacks, the run's status and held-out accuracy."""
    rows = []
    for run in runs:
        s = run.summary or {}
        f = s.get("sdc") or {}
        after = f.get("digest_after") or []
        rows.append(
            {
                "label": run.label,
                "status": run.status,
                "flipped": f.get("target", "none"),
                "bit": f.get("bit"),
                "before": f.get("before"),
                "after": f.get("after"),
                "detected_step": f.get("detected_step"),
                "replicas_equal_after_flip": len(set(after)) == 1 if after else None,
                "replicas_equal_at_end": len(set(s.get("weights_digest") or [])) == 1,
                "rollbacks": len([e for e in f.get("spikes", []) if "restored_step" in e]),
                "val_accuracy": s.get("val_accuracy"),
            }
        )
    return pd.DataFrame(rows)


def wilson(failures: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95 % by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = failures / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def failure_rates(frame: pd.DataFrame, p_sdc: float | None = None) -> pd.DataFrame:
    """Per bit: trials, failures, P(failure | SDC) with its 95 % interval, the share of
    failures the detector caught; with ``p_sdc``, P(failure) = P(failure | SDC) × P(SDC)."""
    rows = []
    for bit, group in frame.groupby("bit", sort=False):
        n, k = len(group), int(group["failed"].sum())
        low, high = wilson(k, n)
        caught = group.loc[group["failed"], "detected"]
        rows.append(
            {
                "bit": int(bit),
                "field": bit_field(int(bit)),
                "trials": n,
                "failures": k,
                "p_fail_given_sdc": k / n,
                "ci_low": low,
                "ci_high": high,
                "detected_share": float(caught.mean()) if len(caught) else float("nan"),
            }
        )
    rates = pd.DataFrame(rows)
    if p_sdc is not None:
        if not 0 <= p_sdc <= 1:
            raise ConfigError(f"p_sdc must be a probability from 0 to 1; you passed {p_sdc!r}.")
        rates["p_failure"] = rates["p_fail_given_sdc"] * p_sdc
    return rates


def figure(rates: pd.DataFrame) -> go.Figure:
    """P(failure | SDC) per bit, with its 95 % Wilson interval."""
    labels = [f"bit {b} ({f})" for b, f in zip(rates["bit"], rates["field"])]
    p = rates["p_fail_given_sdc"]
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=p,
            error_y={
                "type": "data",
                "symmetric": False,
                "array": rates["ci_high"] - p,
                "arrayminus": p - rates["ci_low"],
            },
            text=[f"{k}/{n}" for k, n in zip(rates["failures"], rates["trials"])],
        )
    )
    fig.update_layout(
        title="one bit flip in one weight: P(training fails | SDC), 95 % interval",
        yaxis={"title": "P(failure | SDC)", "range": [0, 1.05]},
        template="plotly_white",
        height=360,
    )
    return fig


__all__ = ["BITS", "monte_carlo", "runs_table", "failure_rates", "figure", "wilson", "bit_field"]

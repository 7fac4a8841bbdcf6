"""What a set of runs shows, in sentences computed from their measured numbers (never canned text).

The report opens with these findings, so a reader sees the lesson *and* where it did not hold:

* **batch without scaling** — with the learning rate kept, does accuracy fall as the batch grows
  (the same epochs are fewer steps; Goyal et al. 2017, arXiv:1706.02677)?
* **linear scaling + warm-up** — at which batches it helped, where it did not, and where the
  scaled LR diverged or collapsed (:mod:`hpclab.core.health`);
* **LARS / LAMB** — at a batch and peak LR where momentum SGD failed, did the layer-wise trust ratio
  train (You et al. 2017, arXiv:1708.03888; 2019, arXiv:1904.00962)? Where SGD trained, which was
  better (Nado et al. 2021, arXiv:2102.06356, found well-tuned momentum matching LARS/LAMB)?
* **the learning-rate window** — runs tagged ``lr-window`` (:data:`WINDOW_TAG`), one batch and
  several peak LRs per optimizer: the range of peak LRs at which each optimizer trained.

Pure functions of :class:`~hpclab.views.charts.facts.RunFacts`; nothing here draws.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpclab.views.charts.facts import RunFacts, facts_of
from hpclab.views.charts.outcomes import final_val_accuracy

#: Runs carrying this tag form learning-rate windows (one batch, several peak LRs), drawn and
#: described apart from the batch sweep (`hpclab sweep --tags lr-window --base-lr ...`).
WINDOW_TAG = "lr-window"
PLAIN = ("sgd", "momentum")  # SGD without layer-wise adaptation
FAILED = ("diverged", "collapsed")
SAME = 0.01  # accuracies closer than this are "about the same"


def in_window(f: RunFacts) -> bool:
    return WINDOW_TAG in (f.config.get("tags") or ())


def optimizer_name(f: RunFacts) -> str:
    opt = str(f.config.get("optimizer", "?"))
    if opt == "lars":
        return f"LARS (η {f.config.get('lars_eta', 0):g})"
    return {"momentum": "momentum SGD", "lamb": "LAMB"}.get(opt, opt)


def peak_lr(f: RunFacts) -> float | None:
    return f.derived.get("peak_lr") or f.summary.get("lr")


def _acc(f: RunFacts) -> str:
    a = final_val_accuracy(f)
    return "no accuracy" if a is None else f"{a:.3f}"


def _by_batch(runs: Iterable[RunFacts]) -> dict[int, RunFacts]:
    return {f.global_batch: f for f in sorted(runs, key=lambda f: f.global_batch or 0)}


def _no_scaling(runs: list[RunFacts]) -> list[str]:
    none = _by_batch(
        f
        for f in runs
        if f.config.get("optimizer") in PLAIN and f.config.get("lr_scaling") == "none"
    )
    trained = {b: f for b, f in none.items() if final_val_accuracy(f) is not None}
    if len(trained) < 2:
        return []
    (b0, f0), (b1, f1) = list(trained.items())[0], list(trained.items())[-1]
    a0, a1 = final_val_accuracy(f0), final_val_accuracy(f1)
    trend = "fell" if a1 < a0 - SAME else ("rose" if a1 > a0 + SAME else "stayed about the same")
    return [
        f"Without learning-rate scaling ({optimizer_name(f0)}, lr {peak_lr(f0):.4g} at every batch), "
        f"validation accuracy {trend} from {a0:.3f} at global batch {b0:,} to {a1:.3f} at "
        f"{b1:,}: the same epochs are {b1 // b0}x fewer steps at the larger batch."
    ]


def _linear(runs: list[RunFacts]) -> list[str]:
    plain = [f for f in runs if f.config.get("optimizer") in PLAIN]
    none = _by_batch(f for f in plain if f.config.get("lr_scaling") == "none")
    linear = _by_batch(f for f in plain if f.config.get("lr_scaling") == "linear")
    helped, hurt, failed = [], [], []
    for b, f in linear.items():
        if f.status in FAILED:
            failed.append(f"at global batch {b:,} (peak lr {peak_lr(f):.4g}) it {f.status}")
            continue
        base = none.get(b)
        a, a0 = final_val_accuracy(f), final_val_accuracy(base) if base else None
        if a is None or a0 is None or base.status in FAILED:
            continue
        pair = f"{b:,} ({a0:.3f} → {a:.3f}, peak lr {peak_lr(f):.4g})"
        if a > a0 + SAME:
            helped.append(pair)
        elif a < a0 - SAME:
            hurt.append(pair)
    out = []
    if helped:
        out.append(
            "Linear scaling with warm-up raised accuracy at global batch " + "; ".join(helped)
        )
    if hurt:
        out.append("It did not help at global batch " + "; ".join(hurt))
    if failed:
        out.append("Linear scaling's window ended: " + "; ".join(failed))
    return [s + "." for s in out]


def _adaptive(runs: list[RunFacts]) -> list[str]:
    plain = _by_batch(
        f
        for f in runs
        if f.config.get("optimizer") in PLAIN and f.config.get("lr_scaling") != "none"
    )
    out = []
    for f in sorted(runs, key=lambda f: f.global_batch or 0):
        if f.config.get("optimizer") not in ("lars", "lamb"):
            continue
        sgd = plain.get(f.global_batch)
        if sgd is None:
            continue
        where = f"global batch {f.global_batch:,}"
        if sgd.status in FAILED:
            verb = "also " + f.status if f.status in FAILED else f"trained, to {_acc(f)},"
            if peak_lr(f) == peak_lr(sgd):
                out.append(
                    f"At {where} and peak lr {peak_lr(f):.4g}, where {optimizer_name(sgd)} "
                    f"{sgd.status}, {optimizer_name(f)} {verb} with the same schedule."
                )
            else:  # (LAMB's learning rates live on another scale than SGD's)
                out.append(
                    f"At {where}, where {optimizer_name(sgd)} {sgd.status} (peak lr "
                    f"{peak_lr(sgd):.4g}), {optimizer_name(f)} {verb} at peak lr {peak_lr(f):.4g}."
                )
        elif f.status not in FAILED and sgd.status not in FAILED:
            a, a0 = final_val_accuracy(f), final_val_accuracy(sgd)
            if a is None or a0 is None:
                continue
            cmp = "above" if a > a0 + SAME else "below" if a < a0 - SAME else "about level with"
            out.append(
                f"At {where}, {optimizer_name(f)} reached {a:.3f}, {cmp} {optimizer_name(sgd)}'s {a0:.3f}."
            )
    return out


def _windows(runs: list[RunFacts]) -> list[str]:
    groups: dict[tuple, list[RunFacts]] = {}
    widths: dict[int, list[tuple[float, str]]] = {}
    for f in runs:
        groups.setdefault((optimizer_name(f), f.global_batch), []).append(f)
    out = []
    for (name, batch), members in groups.items():
        members = sorted((f for f in members if peak_lr(f)), key=peak_lr)
        if len(members) < 2:
            continue
        ok = [f for f in members if f.status not in FAILED and final_val_accuracy(f) is not None]
        span = (
            f"{len(members)} peak LRs from {peak_lr(members[0]):.4g} to {peak_lr(members[-1]):.4g}"
        )
        if not ok:
            out.append(f"At global batch {batch:,}, {name} trained at none of {span}.")
            continue
        best = max(ok, key=final_val_accuracy)
        bad = [f for f in members if f not in ok and peak_lr(f) > peak_lr(ok[-1])]
        tail = f"; from {peak_lr(bad[0]):.4g} it {bad[0].status}" if bad else ""
        out.append(
            f"At global batch {batch:,}, {name} trained at peak lr {peak_lr(ok[0]):.4g}–"
            f"{peak_lr(ok[-1]):.4g} (best {_acc(best)} at {peak_lr(best):.4g}){tail} ({span})."
        )
        widths.setdefault(batch, []).append((peak_lr(ok[-1]) / peak_lr(ok[0]), name))
    for batch, ranked in widths.items():
        if len(ranked) >= 2:
            ranked.sort(reverse=True)
            out.append(
                f"At global batch {batch:,} the band of peak learning rates that trained spanned "
                + " and ".join(f"{w:.3g}x for {name}" for w, name in ranked)
                + " (highest over lowest peak LR that trained)."
            )
    return out


def findings(records: Iterable[Any]) -> list[str]:
    """The sentences the report opens with; empty when the runs hold no such comparison."""
    runs = [f for f in facts_of(records) if f.global_batch]
    batch = [f for f in runs if not in_window(f)]
    return (
        _no_scaling(batch)
        + _linear(batch)
        + _adaptive(batch)
        + _windows([f for f in runs if in_window(f)])
    )


def findings_markdown(records: Iterable[Any]) -> str:
    """:func:`findings` as a Markdown list (for ``IPython.display.Markdown`` in a notebook)."""
    said = findings(records)
    if not said:
        return "*These runs hold no comparison of batch sizes, rules or learning rates.*"
    return "\n".join(f"* {s}" for s in said)


__all__ = [
    "WINDOW_TAG",
    "FAILED",
    "findings",
    "findings_markdown",
    "in_window",
    "optimizer_name",
    "peak_lr",
]

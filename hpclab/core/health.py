"""A run's health verdict: did a run that ran to its end actually learn?

A run can end two ways that are results rather than crashes, and both are lessons about the
learning rate (Goyal et al. 2017, arXiv:1706.02677, sec. 2.2; You et al. 2017, arXiv:1708.03888):

* ``diverged`` — the loss became NaN or infinite (the trainer sees it in the call's telemetry);
* ``collapsed`` — the loss stayed finite but, past warm-up, the run ends at *chance level*: the
  training loss at or above ``CHANCE_LOSS_FRACTION`` x ln(C), the cross-entropy of a uniform guess
  over C classes, and the accuracy at most ``CHANCE_ACCURACY_FACTOR`` / C. Typically a learning
  rate so high that the network's units die (ReLUs that never fire) or its logits saturate, and
  SGD never recovers; a learning rate far too low ends the same way (nothing was learned), and
  the sentence says both. A plain ``finished`` status would hide it.

Pure Python: the trainer applies it to its last epoch row; tests feed it constructed rows.
"""

from __future__ import annotations

import math

CHANCE_LOSS_FRACTION = 0.9  # loss >= 0.9 ln C counts as "at chance" (ln 10 = 2.30 -> 2.07)
CHANCE_ACCURACY_FACTOR = 1.5  # accuracy <= 1.5 / C (0.15 with 10 classes)


def at_chance(loss: float | None, accuracy: float | None, num_classes: int) -> bool:
    """True when a finite `loss` is at or above chance level and `accuracy` is near 1/C."""
    if loss is None or accuracy is None or num_classes < 2:
        return False
    if not (math.isfinite(loss) and math.isfinite(accuracy)):
        return False
    chance = math.log(num_classes)
    return (
        loss >= CHANCE_LOSS_FRACTION * chance and accuracy <= CHANCE_ACCURACY_FACTOR / num_classes
    )


def collapse_message(
    last_epoch: dict | None, *, warmup_steps: int, num_classes: int, peak_lr: float | None = None
) -> str | None:
    """The sentence for a run whose last epoch, ended after warm-up, is at chance; else None.

    `last_epoch` is an epoch row (``loss``, ``accuracy``, ``val_accuracy``, ``step``): the
    training loss decides, with the validation accuracy when there is one (else training's).
    `peak_lr`, the LR the run reached after warm-up, is named in the sentence.
    """
    if not last_epoch or last_epoch.get("step", 0) <= warmup_steps:
        return None  # nothing to judge yet: a run that stops during warm-up may still learn
    loss = last_epoch.get("loss")
    acc = last_epoch.get("val_accuracy")
    if acc is None or not math.isfinite(acc):
        acc = last_epoch.get("accuracy")
    if not at_chance(loss, acc, num_classes):
        return None
    at_lr = f" at peak lr {peak_lr:.4g}" if peak_lr is not None else ""
    return (
        f"the run collapsed: after warm-up its loss stayed at chance level (loss {loss:.3f}, "
        f"ln {num_classes} = {math.log(num_classes):.3f}; accuracy {acc:.3f}, 1/{num_classes} = "
        f"{1 / num_classes:.3f}){at_lr}: nothing was learned. A learning rate too high for the "
        "batch does this (lower it, warm up longer, or use LARS); so does one far too low"
    )


def judge(
    status: str,
    error: str | None,
    last_epoch: dict | None,
    *,
    warmup_steps: int,
    num_classes: int,
    peak_lr: float | None = None,
) -> tuple[str, str | None]:
    """(status, error) after the verdict: a ``finished`` run at chance becomes ``collapsed``."""
    if status != "finished":
        return status, error
    message = collapse_message(
        last_epoch, warmup_steps=warmup_steps, num_classes=num_classes, peak_lr=peak_lr
    )
    return ("collapsed", message) if message else (status, error)


__all__ = [
    "CHANCE_LOSS_FRACTION",
    "CHANCE_ACCURACY_FACTOR",
    "at_chance",
    "collapse_message",
    "judge",
]

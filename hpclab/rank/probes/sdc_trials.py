"""The Monte-Carlo of silent data corruption, on the ranks: many short injections from one state.

A normal training run (:class:`hpclab.rank.trainer.Trainer`, the study's config) ends in a
trained state; each trial restores that state on every rank, flips one bit of one weight on one
rank (:class:`hpclab.rank.features.sdc.Fault`, on the host), trains ``steps`` more steps with the run's
own compiled call and evaluates the held-out subset. A trial *fails* when its training loss went
non-finite or its held-out accuracy fell more than ``tolerance`` below a clean trial's from the
same state: the outcomes Zhang et al. (IEEE Cluster 2019) tell apart, seen over a short horizon.
One trial costs a few dozen milliseconds, so a notebook can afford tens per bit.

Weights only: a gradient or activation flip is compiled into the call (its element is a
constant of the traced graph), so trials of those would retrace each time; single runs show
them (``RunConfig.sdc_target``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def run(cfg_dict: dict, plan_dict: dict, run_dir: str, data_dir: str, plan: dict) -> dict:
    """Train ``cfg_dict`` (planned as ``plan_dict``), then the trials of ``plan`` (``bits``,
    ``trials`` per bit, ``steps``,
    ``rank``, ``layers`` or None for every layer with weights, ``seed``); rank 0's table."""
    from hpclab.core.config import RunConfig
    from hpclab.rank.features.sdc import Fault, assign_all, weighted_layers
    from hpclab.rank.meters import R, decisions
    from hpclab.rank.trainer import Trainer

    trainer = Trainer(cfg_dict, plan_dict, Path(run_dir), Path(data_dir))
    summary = trainer.run()
    warmup = {k: summary.get(k) for k in ("status", "error", "steps", "val_accuracy")}
    if summary["status"] != "finished" or trainer.val is None or trainer.val.sub is None:
        return {"warmup": warmup, "clean": None, "trials": []}
    tf, cfg, model = trainer.tf, RunConfig.from_dict(cfg_dict), trainer.model
    variables = trainer.watch.variables  # the model's and the optimizer's
    state = [v.numpy() for v in variables]
    names = [layer.name for layer in weighted_layers(model)]
    layers = list(plan["layers"]) if plan["layers"] is not None else list(range(len(names)))
    epoch = tf.constant(summary["steps"] // trainer.steps_per_epoch + 1)  # batches not yet seen
    call = (tf.constant(0), tf.constant(int(plan["steps"])), tf.constant(decisions()))

    def trial(layer: int | None = None, bit: int = 0, seed: int = 0) -> dict:
        assign_all(variables, state)
        row: dict = {}
        if layer is not None:
            fault = Fault(
                cfg.replace(
                    sdc_target="weights",
                    sdc_layer=layer,
                    sdc_bit=bit,
                    sdc_rank=plan["rank"],
                    sdc_step=0,
                    seed=seed,
                ),
                model,
                trainer.rank,
            )
            fault.flip_weights(model, 0)
            row = {"layer": layer, "layer_name": names[layer], "element": fault.element}
            row.update({k: fault.record.get(k, np.nan) for k in ("before", "after")})
        guard = tf.constant(trainer.watch.detector_state())
        reduced, _, guard = trainer.train_call(epoch, *call, guard, tf.constant(0))
        loss, accuracy = trainer.val.subset()
        row.update(
            finite=bool(reduced.numpy()[R["nonfinite"]] == 0),
            val_loss=loss,
            val_accuracy=accuracy,
            detected=bool(guard.numpy()[2] >= 0),
        )
        return row

    clean = trial()
    rng = np.random.default_rng(plan["seed"])
    rows = []
    for bit in plan["bits"]:
        for t in range(int(plan["trials"])):
            layer = layers[int(rng.integers(len(layers)))]
            seed = int(rng.integers(2**31 - 1))  # the element: drawn inside Fault from it
            rows.append({"bit": int(bit), "trial": t, **trial(layer, int(bit), seed)})
    assign_all(variables, state)  # (leave the trained state as it was)
    return {"warmup": warmup, "clean": clean, "trials": rows}


__all__ = ["run"]

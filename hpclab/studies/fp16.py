"""float16's underflow, measured (lesson 14): the gradient-exponent probe of
:mod:`hpclab.rank.probes.fp16_exponents` at two seeds, saved in the runs folder.

Micikevicius et al. 2018 ("Mixed Precision Training", ICLR, arXiv:1710.03740): gradients below
float16's smallest subnormal (2^-24) become 0 unless the loss is scaled up before backprop. The
probe counts, against a float32 reference, the activation- and weight-gradient elements float16
flushes to 0 with the loss unscaled and scaled; two seeds give the noise a difference is judged
against.
"""

from __future__ import annotations

from pathlib import Path

from hpclab.rank.probes import fp16_exponents
from hpclab.records.jsonio import read_json, write_json_atomic

FILE = "fp16_exponents.json"


def measure(lab, cfg, epochs=(0, 3), seeds: int = 2, batch: int = 512) -> dict:
    """The probe on rank 0 of ``lab`` for ``cfg`` at ``cfg.seed`` and the ``seeds - 1`` next
    seeds; saved as ``<runs_dir>/fp16_exponents.json`` (without the weights) and returned as
    ``{"seeds": [...], "results": [...]}``."""
    results = []
    for k in range(int(seeds)):
        one = cfg.replace(seed=cfg.seed + k).to_dict()
        (result, *_) = lab.apply(
            fp16_exponents.gradient_exponents,
            one,
            str(lab.data_dir),
            epochs=tuple(epochs),
            batch=batch,
        )
        for point in result["points"]:
            point.pop("weights")
        result["seed"] = one["seed"]
        results.append(result)
    saved = {"seeds": [r["seed"] for r in results], "results": results}
    write_json_atomic(Path(lab.runs_dir) / FILE, saved)
    return saved


def load(runs_dir: str | Path) -> dict:
    """What :func:`measure` saved in ``runs_dir``."""
    return read_json(Path(runs_dir) / FILE)


def flushed(saved: dict, kind: str = "activation") -> dict:
    """``{(seed, epoch, "unscaled"|"scaled"): share flushed to 0}`` for ``kind`` gradients."""
    return {
        (r["seed"], p["epoch"], scaling): p[scaling][kind]["flushed"]
        for r in saved["results"]
        for p in r["points"]
        for scaling in ("unscaled", "scaled")
    }

"""The scaling ablation (hpclab/studies/scaling_ablation.py): its arithmetic on hand-made E's, and
the one switch it adds to the rank step (knob skip_allreduce) on real ranks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError
from hpclab.studies import scaling_ablation as ab

PARTS = [*ab.PARTS, ab.REMAINDER]


def test_the_factors_multiply_and_the_losses_add_up_to_e_full():
    e = {"full": 0.48, "synthetic": 0.5, "no_comm": 0.64, "bare": 0.72}
    out = ab.attribute(e)
    assert math.prod(out[p] for p in PARTS) == pytest.approx(e["full"], rel=1e-12)
    assert sum(out[f"{p} loss"] for p in PARTS) == pytest.approx(1 - e["full"], rel=1e-12)
    # each factor is the neighbouring E's ratio; the remainder is E with everything off
    assert out["communication"] == pytest.approx(0.5 / 0.64)
    assert out[ab.REMAINDER] == 0.72
    assert ab.largest_loss(out) == ab.REMAINDER


def test_a_switch_that_made_things_slower_shows_as_a_negative_part():
    out = ab.attribute({"full": 0.6, "synthetic": 0.55, "no_comm": 0.8, "bare": 0.8})
    assert out["input loss"] < 0 and out["telemetry loss"] == pytest.approx(0.0)
    assert sum(out[f"{p} loss"] for p in PARTS) == pytest.approx(0.4)


def test_perfect_scaling_loses_nothing_anywhere():
    out = ab.attribute(dict.fromkeys(ab.VARIANTS, 1.0))
    assert all(out[f"{p} loss"] == 0 for p in PARTS)


def test_every_variant_needs_a_positive_e():
    with pytest.raises(ConfigError, match="missing or not positive: \\['bare'\\]"):
        ab.attribute({"full": 0.5, "synthetic": 0.6, "no_comm": 0.7})


def _record(name, repeat, workers, rate):
    return SimpleNamespace(
        config={"tags": [ab.TAG, name, f"pass {repeat}"]},
        summary={"samples_per_sec": rate},
        workers=workers,
    )


def test_the_table_pairs_1_and_2_ranks_per_variant_and_pass_and_adds_the_spread():
    e = [
        {"full": 0.5, "synthetic": 0.52, "no_comm": 0.7, "bare": 0.75},
        {"full": 0.45, "synthetic": 0.5, "no_comm": 0.66, "bare": 0.7},
    ]
    records = [
        r
        for repeat, es in enumerate(e)
        for v, ev in es.items()
        for r in (_record(v, repeat, 1, 1000.0), _record(v, repeat, 2, 2000.0 * ev))
    ]
    t = ab.table(records)
    assert list(t["pass"]) == ["0", "1", "spread"]
    assert t["E full"].tolist() == pytest.approx([0.5, 0.45, 0.05])
    assert t.loc[0, "communication"] == pytest.approx(0.52 / 0.7)


def test_the_variants_switch_off_one_cost_after_another():
    base = RunConfig(max_steps=100)
    full, syn, no_comm, bare = (ab.variant(base, v) for v in ab.VARIANTS)
    assert (full.dataset, syn.dataset) == ("mnist1d", "synthetic") and full.model == "mlp"
    assert (syn.skip_allreduce, no_comm.skip_allreduce) == (False, True)
    assert (no_comm.publish_every_s > 0, bare.publish_every_s) == (True, 0.0)
    with pytest.raises(ConfigError, match="variant must be one of"):
        ab.variant(base, "nothing")


def test_skip_allreduce_is_refused_where_replicas_must_stay_equal():
    with pytest.raises(ConfigError, match="skip_allreduce must be False unless update"):
        RunConfig(skip_allreduce=True, update="local_sgd")


@pytest.mark.mpi
def test_skipping_the_allreduce_lets_the_replicas_drift(lab):
    """The measuring device on 2 real ranks: with the allreduce the replicas end equal, without
    it each trains on its own shard and their weight digests differ."""
    cfg = RunConfig(max_steps=30, eval_samples=0, publish_every_s=0, noise_scale=False)
    on = lab.run(cfg).wait(timeout=300)
    off = lab.run(cfg.replace(skip_allreduce=True)).wait(timeout=300)
    assert len(set(on["weights_digest"])) == 1 and len(set(off["weights_digest"])) == 2

"""Beyond synchronous SGD with real ranks: local SGD (H = 1 is synchronous SGD), hybrid groups
(Horovod process sets), Crossbow's model averaging, stale gradients (real MPI engines with
Horovod, 2 ranks and 4; nothing is mocked; hpclab issue 15)."""

import json
import logging

import numpy as np
import pytest

from hpclab import Lab, RunConfig
from hpclab.rank import engine

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

BASE = RunConfig(epochs=1, max_steps=60, eval_samples=0, optimizer="momentum", publish_every_s=0)


def _weights(lab, central: bool = False) -> list[list[np.ndarray]]:
    """Every rank's weights after the last run (or its copy of Crossbow's central model)."""
    return lab.client[sorted(lab.client.ids)].apply_sync(engine.last_weights, central)


def test_averaging_the_models_every_step_is_synchronous_sgd(lab):
    """Momentum SGD is linear in the gradient, so averaging the replicas after every local step
    gives synchronous SGD's weights, to float rounding (the sums run in another order)."""
    lab.run(BASE).wait(timeout=600)
    sync = _weights(lab)
    summary = lab.run(BASE.replace(update="local_sgd", average_every=1)).wait(timeout=600)
    local = _weights(lab)
    assert summary["steps"] == 60 and len(set(summary["weights_digest"])) == 1
    worst = 0.0
    for a, b in zip(sync[0], local[0]):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
        worst = max(worst, float(np.max(np.abs(a - b))))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(sync[0], sync[1]))
    assert moved == 0.0  # (synchronous replicas are equal bit for bit)
    print(f"[averaging] H=1 vs sync: largest weight difference {worst:.2e}")
    # hybrid, one group of both ranks: its gradients are averaged over Horovod's global process
    # set every step, and the average of equal models is the model: synchronous SGD, bit for bit
    lab.run(BASE.replace(update="hybrid", groups=1, average_every=4)).wait(timeout=600)
    for a, b in zip(sync[0], _weights(lab)[0]):
        np.testing.assert_array_equal(b, a)


def test_with_h_above_one_replicas_drift_between_averages_and_meet_at_them(lab):
    """H = 4: after step 58 (not a multiple of 4) the replicas differ; at step 60 they agree."""
    local = BASE.replace(update="local_sgd", average_every=4)
    off = lab.run(local.replace(max_steps=58)).wait(timeout=600)
    on = lab.run(local).wait(timeout=600)
    assert len(set(off["weights_digest"])) == 2 and len(set(on["weights_digest"])) == 1
    # hybrid with groups of one rank is local SGD (no gradient allreduce), bit for bit
    groups_of_one = lab.run(local.replace(update="hybrid", groups=2)).wait(timeout=600)
    assert groups_of_one["weights_digest"] == on["weights_digest"]


@pytest.mark.own_lab
def test_hybrid_groups_are_synchronous_inside_and_averaged_across_every_h_steps(tmp_path, caplog):
    """4 ranks in 2 groups of 2 (Horovod process sets registered at start): after step 58, not
    a multiple of H = 4, the replicas of a group are equal (their gradients were averaged over
    the group's process set every step) and the two groups differ; at step 60 all four agree.
    Horovod fixes process sets at hvd.init(): Lab(groups=2) registers them at start, so the runs
    restart nothing (a Lab without them restarts once: EngineSettings.for_run, tested in
    test_engine_settings.py; one 4-rank start fewer here, about 30 s of CI). With the ranks' hosts
    relabelled as two nodes, a run warns when a group spans both (round robin) and not when
    each node holds whole groups (blocks)."""
    hybrid = BASE.replace(update="hybrid", groups=2, average_every=4)
    with Lab(workers=4, groups=2, runs_dir=tmp_path, verbose=False) as lab:
        pids = [r["pid"] for r in lab.ranks]
        run = lab.run(hybrid.replace(max_steps=58))
        off = run.wait(timeout=600)
        on = lab.run(hybrid).wait(timeout=600)
        assert [r["pid"] for r in lab.ranks] == pids  # no restart
        hosts = [r["host"] for r in lab.ranks]
        try:  # two nodes: blocks keep each group on one, round robin splits both groups
            for placement, split in (("aabb", False), ("abab", True)):
                for r, node in zip(lab.ranks, placement):
                    r["host"] = node
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="hpclab.cluster.lab"):
                    lab.ready_for(hybrid)
                assert ("[[0, 1], [2, 3]] have ranks on more than one node" in caplog.text) == split
        finally:
            for r, host in zip(lab.ranks, hosts):
                r["host"] = host
    a, b, c, d = off["weights_digest"]
    assert a == b and c == d and a != c, off["weights_digest"]
    assert len(set(on["weights_digest"])) == 1
    meta = json.loads((run.path / "config.json").read_text())
    assert meta["lab"]["horovod_env"]["HPCLAB_HOROVOD_GROUPS"] == "2"


def test_crossbow_learners_differ_around_one_central_model_and_train(lab):
    """Synchronous model averaging: each rank is a learner with its own replica; the central
    model z is computed from allreduced corrections, so every rank holds the same z; it is what
    the held-out evaluation uses, and it trains."""
    cfg = RunConfig(epochs=2, eval_samples=1024, update="crossbow", optimizer="sgd",
                    lr_scaling="none", base_lr=0.4, batch_per_worker=16)  # fmt: skip
    summary = lab.run(cfg).wait(timeout=600)
    replicas, central = _weights(lab), _weights(lab, central=True)
    assert len(set(summary["weights_digest"])) == 2  # the learners' own replicas
    for a, b in zip(central[0], central[1]):
        np.testing.assert_array_equal(a, b)  # one central model, bit for bit
    # (cnn1d has no non-trainable weights: the replica's list lines up with z's)
    assert not any(np.array_equal(w, z) for w, z in zip(replicas[0], central[0]))
    assert summary["val_accuracy"] > 0.8, summary["val_accuracy"]  # measured 0.85 (chance 0.1)


def test_a_stale_update_applies_the_gradient_of_tau_steps_ago(lab):
    """Plain SGD at a constant learning rate, staleness 3: steps 0-2 apply zeros (nothing is old
    enough) and step 3 applies step 0's gradient, taken at the initial weights on batch 0 — the
    very update one synchronous step makes."""
    plain = BASE.replace(optimizer="sgd", warmup_epochs=0.0, lr_schedule="constant")
    lab.run(plain.replace(max_steps=1)).wait(timeout=600)
    one_step = _weights(lab)
    summary = lab.run(plain.replace(max_steps=4, staleness=3)).wait(timeout=600)
    stale = _weights(lab)
    assert summary["optimizer_steps"] == 4 and len(set(summary["weights_digest"])) == 1
    for a, b in zip(one_step[0], stale[0]):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    lab.run(plain.replace(max_steps=5, staleness=3)).wait(timeout=600)
    assert any(not np.allclose(a, b) for a, b in zip(stale[0], _weights(lab)[0]))  # step 1's

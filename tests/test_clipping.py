"""Gradient clipping (hpclab/rank/features/clipping.py): the arithmetic on constructed gradients,
and the knob end to end on 2 real ranks (the replicas stay equal; a tiny bound stalls training)."""

import numpy as np
import pytest

from hpclab import ConfigError, RunConfig

tf = pytest.importorskip("tensorflow")

from hpclab.rank.features.clipping import GradientClipping  # noqa: E402
from hpclab.rank.features.hooks import Traced  # noqa: E402


class _Scaled:
    loss_scale = tf.constant(128.0)


def _clip(grads, norm, loss_scaled=False):
    s = Traced(clock=None, grads=[tf.constant(g, tf.float32) for g in grads])
    GradientClipping(norm, _Scaled(), loss_scaled, tf).after_allreduce(s)
    return [g.numpy() for g in s.grads]


def test_a_gradient_above_the_bound_is_scaled_to_it_over_all_variables():
    # |g| = sqrt(3² + 4² + 12²) = 13 over two variables: scaled by 1/13
    out = _clip([[3.0, 4.0], [12.0]], 1.0)
    assert np.concatenate(out) == pytest.approx(np.array([3, 4, 12]) / 13, rel=1e-6)
    assert _clip([[0.3, 0.4]], 1.0)[0] == pytest.approx([0.3, 0.4])  # below the bound: as is


def test_a_loss_scaled_gradient_is_clipped_at_the_scaled_bound():
    """128 x a true gradient of norm 2, clipped at 1: the result is 128 x the true one at norm 1."""
    out = _clip([[128 * 1.2, 128 * 1.6]], 1.0, loss_scaled=True)[0]
    assert out == pytest.approx([128 * 0.6, 128 * 0.8], rel=1e-6)


def test_the_knob_refuses_a_negative_bound():
    with pytest.raises(ConfigError, match="grad_clip_norm must be 0 \\(off\\) or"):
        RunConfig(grad_clip_norm=-1.0)


@pytest.mark.mpi
def test_clipping_on_real_ranks_keeps_the_replicas_equal_and_a_tiny_bound_stalls_training(lab):
    base = RunConfig(max_steps=60, eval_samples=0, publish_every_s=0.5)
    runs = {}
    for norm in (0.0, 1e-4):
        run = lab.run(base.replace(grad_clip_norm=norm))
        runs[norm] = run.wait(timeout=300)
        assert len(set(runs[norm]["weights_digest"])) == 1  # every rank applied the same update
    free, stalled = runs[0.0]["train_accuracy"], runs[1e-4]["train_accuracy"]
    print(f"[clip] train accuracy after 60 steps: free {free:.3f}, clipped at 1e-4 {stalled:.3f}")
    # 60 steps of lr <= 0.1 x a gradient of norm 1e-4 move the weights by < 1e-3: near chance
    assert stalled < 0.2 < free

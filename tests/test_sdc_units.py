"""Silent data corruption, the arithmetic: bit flips, the fault plan, the spike detector and
rollback bookkeeping (real TensorFlow on CPU, no engines; the real 2-rank runs are in
tests/test_sdc.py)."""

import numpy as np
import pytest
import tensorflow as tf

from hpclab import ConfigError, RunConfig
from hpclab.rank.features.sdc import ARM_STEPS, NO_SPIKE, Fault, Guard, flip_bit, mask_int32
from hpclab.rank.models import build_model


def test_flipping_a_bit_follows_ieee_754_binary32():
    x = 0.05
    assert flip_bit(x, 31) == np.float32(-x)  # the sign
    # bit 30, the exponent's top bit: 0.05 = 1.6 x 2^-5, exponent 122 -> 250: 1.6 x 2^123
    assert flip_bit(x, 30) == pytest.approx(1.6 * 2.0**123, rel=1e-6)
    # bit 23, the exponent's lowest bit: 122 -> 123, the value doubles
    assert flip_bit(x, 23) == pytest.approx(2 * x, rel=1e-6)
    # bit 0: a neighbouring float32 (one unit in the last place away)
    assert abs(flip_bit(x, 0) - np.float32(x)) == np.spacing(np.float32(x))
    assert flip_bit(1.0, 30) == np.inf  # exponent 127 -> 255 with a zero mantissa
    assert flip_bit(flip_bit(x, 27), 27) == np.float32(x)  # an XOR: twice is nothing


def test_the_tensorflow_flip_matches_the_numpy_one_and_touches_one_element():
    cfg = RunConfig(sdc_target="weights", sdc_bit=27, sdc_layer=1)
    model = build_model("cnn1d", (40,), 10, seed=0)
    fault = Fault(cfg, model, rank=0)
    kernel = model.trainable_variables[fault.var_index]
    assert kernel is fault.layer.kernel and fault.layer.name.startswith("conv1d")
    before = kernel.numpy()
    out = fault.flip_tensor(tf, tf.constant(before), tf.constant(mask_int32(27))).numpy()
    changed = np.flatnonzero(out.reshape(-1) != before.reshape(-1))
    assert changed.tolist() == [fault.element]
    assert out.reshape(-1)[fault.element] == flip_bit(before.reshape(-1)[fault.element], 27)
    same = fault.flip_tensor(tf, tf.constant(before), tf.constant(0)).numpy()
    assert np.array_equal(same, before)  # a zero mask is no flip
    assert mask_int32(31) == -(2**31) and mask_int32(0) == 1


def test_the_fault_is_seeded_lands_on_call_boundaries_and_happens_once():
    model = build_model("cnn1d", (40,), 10, seed=0)
    grads = RunConfig(sdc_target="gradients", sdc_step=10, sdc_rank=1, seed=3)
    a, b = Fault(grads, model, rank=1), Fault(grads, model, rank=0)
    assert a.element == b.element == Fault(grads, model, rank=1).element  # same on every rank
    # a gradient flips in the last step of a call: the call from step 4 may run 7 steps (4..10)
    assert a.steps_to_cut(4) == 7 and a.mask(4, 7) == mask_int32(30) and b.mask(4, 7) == 0
    assert a.mask(4, 6) == 0  # a call that ends before step 10 carries no flip
    a.flipped(4, 7)
    assert a.done and a.mask(4, 7) == 0 and a.steps_to_cut(4) > 10**6  # never again
    # weights flip on the host before step sdc_step: the call from step 4 stops at 10
    weights = Fault(grads.replace(sdc_target="weights"), model, rank=1)
    assert weights.steps_to_cut(4) == 6
    kernel = weights.layer.kernel
    original = kernel.numpy().reshape(-1)[weights.element]
    weights.flip_weights(model, step=9)
    assert not weights.done
    weights.flip_weights(model, step=10)
    assert weights.done and weights.record["before"] == pytest.approx(original)
    assert kernel.numpy().reshape(-1)[weights.element] == flip_bit(original, 30)
    assert weights.record["after"] == pytest.approx(float(flip_bit(original, 30)))


def test_a_layer_out_of_range_is_refused_with_the_layers_named():
    model = build_model("cnn1d", (40,), 10, seed=0)
    with pytest.raises(ValueError, match=r"sdc_layer .* 0 to 3 \(conv1d.*logits\)"):
        Fault(RunConfig(sdc_target="weights", sdc_layer=4), model, rank=0)


def _run_guard(guard, losses):
    state = tf.constant(guard.state_in())
    for i, loss in enumerate(losses):
        state = guard.check(tf, state, tf.constant(loss, tf.float32), i)
    return state.numpy()


def test_the_detector_fires_on_a_spike_or_a_non_finite_loss_only_once_armed():
    guard = Guard(factor=3.0, rollback=False)
    steady = [2.0 - 0.01 * i for i in range(ARM_STEPS + 5)]
    mean, seen, first = _run_guard(guard, steady)
    assert first == NO_SPIKE and seen == len(steady) and 1.8 < mean < 2.0
    # a loss above 3x the running mean (~1.9) fires; the mean ignores it; 5.5 does not
    assert _run_guard(guard, [*steady, 5.5])[2] == NO_SPIKE
    mean2, seen2, first2 = _run_guard(guard, [*steady, 6.0, 1.9])
    assert first2 == len(steady) and seen2 == len(steady) + 1
    # non-finite fires even before the detector is armed; a high loss before then does not
    assert _run_guard(guard, [2.0, float("nan"), 2.0])[2] == 1
    assert _run_guard(guard, [2.0, 100.0, 2.0])[2] == NO_SPIKE


def test_after_a_call_the_guard_keeps_clean_states_and_restores_the_newest_before_a_spike():
    v = tf.Variable([1.0, 2.0])
    guard = Guard(factor=3.0, rollback=True, variables=[v])
    guard.snapshot(0)
    assert guard.after_call(np.array([2.0, 12.0, NO_SPIKE], np.float32), 0, 8) is None
    v.assign([5.0, 6.0])
    assert guard.after_call(np.array([1.9, 20.0, NO_SPIKE], np.float32), 8, 8) is None
    v.assign([np.nan, 7.0])
    spike = guard.after_call(np.array([1.9, 20.0, 0.0], np.float32), 16, 8)
    assert spike == 16  # the call's first step: the state saved at 16 may hold the fault
    assert guard.restore(spike, max_times=2) == 8
    # (the state saved after the call [0, 8), before v became [5, 6])
    assert v.numpy().tolist() == [1.0, 2.0] and guard.mean.tolist() == pytest.approx([2.0, 12.0])
    assert [s[0] for s in guard.snapshots] == [8]  # the newest two were 8 and 16; 16 is gone
    assert guard.restore(spike, max_times=2) == 8
    assert guard.restore(spike, max_times=2) is None  # the same spike again: not transient


def test_sdc_settings_are_validated_before_any_engine_starts():
    with pytest.raises(ConfigError, match=r"RunConfig.sdc_bit must be an integer from 0 to 31"):
        RunConfig(sdc_target="weights", sdc_bit=32)
    with pytest.raises(ConfigError, match="sdc_target must be one of 'none', 'weights'"):
        RunConfig(sdc_target="bias")
    with pytest.raises(ConfigError, match="rollback must be False unless spike_factor > 0"):
        RunConfig(rollback=True)
    with pytest.raises(ConfigError, match="spike_factor must be 0 .off. or a factor > 1"):
        RunConfig(spike_factor=0.5)
    with pytest.raises(ConfigError, match="'weights' or 'gradients' with a mixed precision"):
        RunConfig(sdc_target="activations", precision="mixed_bfloat16")
    cfg = RunConfig(sdc_target="weights", sdc_rank=2, epochs=1)
    with pytest.raises(ConfigError, match=r"sdc_rank must be a rank of this 2-worker run"):
        cfg.for_workers(2).derived()
    assert cfg.for_workers(3).derived()["workers"] == 3
    with pytest.raises(ConfigError, match=r"sdc_step must be a step of this run \(0 to 7\)"):
        RunConfig(sdc_target="weights", sdc_step=8, max_steps=8).for_workers(2).derived()

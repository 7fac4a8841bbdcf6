"""Named models: shapes, parameter counts, float32 logits under mixed precision (real TF, CPU)."""

import numpy as np
import pytest
import tensorflow as tf

from hpclab.core.config import RunConfig
from hpclab.core.errors import LabError
from hpclab.rank import bfloat16
from hpclab.rank.models import build_model
from hpclab.rank.optimizers import build_optimizer, set_precision


@pytest.fixture(autouse=True)
def float32_policy():
    set_precision("float32")
    yield
    set_precision("float32")


def test_cnn1d_is_the_mnist1d_paper_convnet():
    """Greydanus 2020 ConvBase: 3 x Conv1d(25, stride 2, padding 1), 5 x 25 = 125 features."""
    model = build_model("cnn1d", (40,), 10, seed=0)
    convs = [ln for ln in model.layers if isinstance(ln, tf.keras.layers.Conv1D)]
    assert [c.kernel_size[0] for c in convs] == [5, 3, 3]
    assert [c.strides[0] for c in convs] == [2, 2, 2]
    assert [c.output.shape[1:] for c in convs] == [(19, 25), (10, 25), (5, 25)]  # torch lengths
    flat = [ln for ln in model.layers if isinstance(ln, tf.keras.layers.Flatten)][0]
    assert flat.output.shape[-1] == 125
    assert model.count_params() == 5210  # 150 + 1900 + 1900 + 1260, as printed by ConvBase


def test_mlp_matches_mnist1d_mlpbase_size():
    # MLPBase(40, 10, hidden 100): 4100 + 10100 + 1010 parameters
    assert build_model("mlp", (40,), 10, seed=0).count_params() == 15210


def test_resnet20_size():
    model = build_model("resnet20", (32, 32, 3), 10, seed=0)
    convs = [ln for ln in model.layers if isinstance(ln, tf.keras.layers.Conv2D)]
    assert len(convs) == 19  # 1 + 3 stages x 3 blocks x 2 convs; + the dense = 20 layers
    assert 0.26e6 < model.count_params() < 0.28e6  # He et al. 2016, Table 6: 0.27M


@pytest.mark.parametrize(
    "name,shape",
    [
        ("mlp", (40,)),
        ("mlp", (28, 28, 1)),
        ("cnn1d", (40,)),
        ("resnet20", (32, 32, 3)),
        ("resnet20", (28, 28, 1)),
        # ResNet-50 builds in 1.4-1.7 s each: in `make test`, out of the sub-minute `make check`
        pytest.param("resnet50", (32, 32, 3), marks=pytest.mark.slow),
        pytest.param("resnet50", (28, 28, 1), marks=pytest.mark.slow),
    ],
)
def test_every_model_gives_logits(name, shape):
    model = build_model(name, shape, 7, seed=1)
    out = model(np.random.rand(3, *shape).astype(np.float32), training=False)
    assert out.shape == (3, 7)
    assert out.dtype == tf.float32
    # logits, not probabilities: nothing forces rows to sum to one
    assert model.layers[-1].get_config()["activation"] == "linear"


def test_same_seed_same_weights_different_seed_different():
    a = build_model("cnn1d", (40,), 10, seed=3).get_weights()
    b = build_model("cnn1d", (40,), 10, seed=3).get_weights()
    c = build_model("cnn1d", (40,), 10, seed=4).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_wrong_input_kind_is_a_sentence():
    with pytest.raises(ValueError, match="needs image inputs"):
        build_model("resnet20", (40,), 10)
    with pytest.raises(ValueError, match="needs 1-D signals"):
        build_model("cnn1d", (28, 28, 1), 10)
    with pytest.raises(ValueError, match="model='vgg'"):
        build_model("vgg", (40,), 10)


def _train(model, opt, x, y, steps, loss_scaling=False):
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    losses = []
    for _ in range(steps):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
            scaled = opt.get_scaled_loss(loss) if loss_scaling else loss
        grads = tape.gradient(scaled, model.trainable_variables)
        if loss_scaling:
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        losses.append(float(loss))
    return logits, losses


@pytest.mark.slow  # asks a child process whether bfloat16 runs here (a TensorFlow import, ~3 s)
@pytest.mark.parametrize("optimizer", ["lars", "momentum"])
def test_mixed_bfloat16_trains_on_cpu(optimizer):
    """Where oneDNN runs bfloat16 (the child probe says so) it trains; where it does not (a CPU
    below AVX-512, or ONEDNN_MAX_CPU_ISA=AVX2) the rank's check raises the sentence instead."""
    cfg = RunConfig(optimizer=optimizer, precision="mixed_bfloat16").to_dict()
    set_precision(cfg["precision"])
    runs = bfloat16.probe()["ok"]
    assert runs is not None, "the bfloat16 probe timed out: the machine is too busy to tell"
    if not runs:
        with pytest.raises(LabError, match="TF_ENABLE_ONEDNN_OPTS=0"):
            bfloat16.check(tf, 0)
        return
    bfloat16.check(tf, 0)  # silent where bfloat16 runs
    model = build_model("cnn1d", (40,), 10, seed=0)
    assert model.layers[-2].compute_dtype == "bfloat16"  # hidden layers really run in bf16
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 40)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int32)
    opt = build_optimizer(cfg, 0.05)
    logits, losses = _train(model, opt, x, y, steps=4)
    assert logits.dtype == tf.float32
    assert all(np.isfinite(losses))
    assert all(v.dtype == tf.float32 for v in model.trainable_variables)  # float32 master weights


def test_mixed_float16_trains_with_loss_scaling():
    cfg = RunConfig(optimizer="lamb", precision="mixed_float16", base_lr=0.01).to_dict()
    set_precision(cfg["precision"])
    model = build_model("mlp", (40,), 10, seed=0)
    opt = build_optimizer(cfg, 0.01)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(32, 40)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int32)
    logits, losses = _train(model, opt, x, y, steps=3, loss_scaling=True)
    assert logits.dtype == tf.float32
    assert all(np.isfinite(losses))
    assert int(opt.iterations) == 3


@pytest.mark.parametrize(
    "name,shape",
    [pytest.param("resnet50", (32, 32, 3), marks=pytest.mark.slow), ("resnet20", (28, 28, 1))],
)
def test_image_models_keep_float32_logits_under_mixed_float16(name, shape):
    """keras.applications' own `predictions` Dense would follow the policy (float16 logits)."""
    set_precision("mixed_float16")
    model = build_model(name, shape, 10, seed=0)
    out = model(np.zeros((2, *shape), np.float32), training=False)
    assert out.dtype == tf.float32
    assert model.layers[-1].dtype_policy.name == "float32"

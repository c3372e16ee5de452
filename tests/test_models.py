"""The model zoo: parameter counts, stage splits, convolution lowerings, BatchNorm state through a round."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lab.data import FederatedDataset, index_table
from fedjax_lab.engine import CohortPlan, LocalSchedule, init_loop_state, make_run_rounds
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.server_optimizers import fedavg_server
from fedjax_lab.models import (
    CNN3,
    MLP,
    BHerdCNN,
    Classifier,
    FedAvgCNN,
    FeddleCNN,
    LinearSVM,
    LogisticRegression,
    PflCNN,
    ResNet,
    SimpleCNN,
    layers,
    resnet8,
    resnet18,
)
from fedjax_lab.models.augment import crop_and_flip, gaussian_noise
from fedjax_lab.models.layers import Conv, local_response_norm, max_pool_2x2
from fedjax_lab.models.recurrent import CharRNN
from tests.conftest import make_inputs

MNIST, CIFAR = (28, 28, 1), (32, 32, 3)


@pytest.mark.parametrize("module, shape, count", [
    (FedAvgCNN(10, "SAME"), MNIST, 1_663_370),
    (FedAvgCNN(10, "VALID"), MNIST, 582_026),
    (FedAvgCNN(10, "VALID"), CIFAR, 878_538),
    (SimpleCNN(10), CIFAR, 62_006),
    (SimpleCNN(10), MNIST, 44_426),
    (BHerdCNN(10), MNIST, 430_698),
    (BHerdCNN(10), CIFAR, 555_178),
    (CNN3(100), CIFAR, 69_380),
    (FeddleCNN(10), CIFAR, 361_162),
    (FeddleCNN(10), MNIST, 262_570),
    (PflCNN(10), CIFAR, 1_626_442),  # pfl-research's CIFAR-10 CNN, as its PyTorch model counts
    (MLP(10, (200, 200)), MNIST, 199_210),
    (LogisticRegression(10), MNIST, 7_850),
    (LinearSVM(), MNIST, 784),
    (resnet18(10, "batch"), CIFAR, 11_173_962),
    (resnet18(10, "group"), CIFAR, 11_173_962),
])
def test_parameter_counts(module, shape, count):
    variables = jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((1,) + shape))
    assert sum(p.size for p in jax.tree.leaves(variables["params"])) == count


def test_dropout_acts_only_in_the_training_loss_and_with_its_key():
    """PflCNN's dropout: the training loss depends on the step key (two keys, two losses; one key, one loss),
    evaluation is deterministic, and a model without dropout trains the same with any key."""
    x = jax.random.normal(jax.random.key(1), (8,) + CIFAR)
    batch = {"x": x, "y": jnp.arange(8) % 10, "mask": jnp.ones(8)}
    for module, keyed in ((PflCNN(10), True), (SimpleCNN(10), False)):
        clf = Classifier(module, CIFAR, preprocess=lambda x: x)
        variables = jax.jit(clf.init)(jax.random.key(0))
        loss, predict = jax.jit(lambda v, k, clf=clf: clf.loss(v, batch, k)[0]), jax.jit(clf.predict)
        losses = [float(loss(variables, jax.random.key(k))) for k in (3, 4, 3)]
        assert (losses[0] != losses[1]) == keyed and losses[0] == losses[2]
        np.testing.assert_array_equal(predict(variables, x), predict(variables, x))
        if keyed:  # the training pass without dropout's key is the evaluation pass
            np.testing.assert_allclose(jax.jit(lambda v, clf=clf: clf.apply(v, x, train=True))(variables),
                                       predict(variables, x))


def test_char_rnn_has_the_tff_parameter_count():
    clf = Classifier(CharRNN(90), (80,), preprocess=lambda x: x, pad_label=0, input_dtype="int32")
    assert clf.num_params(jax.eval_shape(clf.init, jax.random.key(0))) == 820_522


@pytest.mark.parametrize("module, split", [(ResNet(10, (4, 8, 8, 8), (2, 1, 1, 1), "group"), "layer2"),
                                           (resnet8(10, "group"), "layer1"),
                                           (SimpleCNN(10), "conv2"), (MLP(10, (8, 6)), "hidden_0")])
def test_lower_then_upper_equals_the_whole_network(module, split):
    x = jax.random.normal(jax.random.key(1), (2,) + CIFAR)
    variables = jax.jit(module.init)(jax.random.key(0), x)
    whole = jax.jit(module.apply)(variables, x)
    split_up = jax.jit(lambda v, x: module.apply(v, module.apply(v, x, split, method="lower"), split,
                                                 method="upper"))
    np.testing.assert_allclose(split_up(variables, x), whole, rtol=1e-5, atol=1e-5)
    head_on_features = jax.jit(lambda v, x: module.apply(v, module.apply(v, x, method="features"),
                                                         method="head"))
    np.testing.assert_allclose(head_on_features(variables, x), whole, rtol=1e-5, atol=1e-5)


def test_resnet18_splits_have_fedimpro_feature_shapes():
    module = resnet18(10, "group")
    x = jnp.zeros((1,) + CIFAR)
    variables = jax.eval_shape(module.init, jax.random.key(0), x)
    shapes = {s: jax.eval_shape(lambda v, s=s: module.apply(v, x, s, method="lower"), variables).shape
              for s in ("layer1", "layer2", "layer3", "pool")}
    assert shapes == {"layer1": (1, 32, 32, 64), "layer2": (1, 16, 16, 128), "layer3": (1, 8, 8, 256),
                      "pool": (1, 512)}


def test_unknown_split_names_the_allowed_stages():
    with pytest.raises(ValueError, match="allowed: \\['conv1', 'conv2', 'fc1', 'fc2'\\]"):
        SimpleCNN(10).apply(SimpleCNN(10).init(jax.random.key(0), jnp.zeros((1,) + CIFAR)),
                            jnp.zeros((1,) + CIFAR), "conv9", method="lower")


def sin_sum_gradients(convs, params, x) -> list:
    """Each convolution's gradient of sum(sin(conv(x))) in its parameters and input, compiled: a test's
    eager operations would compile one small program each, the most of its time."""
    loss = lambda conv: lambda p, x: jnp.sum(jnp.sin(conv.apply(p, x)))
    return [jax.jit(jax.grad(loss(conv), argnums=(0, 1)))(params, x) for conv in convs]


@pytest.mark.parametrize("lowering", ["im2col", "banded"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_convolution_lowerings_equal_xla_convolution_and_its_gradients(lowering, padding):
    x = jax.random.normal(jax.random.key(0), (3, 12, 10, 4))
    xla, im2col = Conv(5, (5, 3), padding, lowering="xla"), Conv(5, (5, 3), padding, lowering=lowering)
    params = xla.init(jax.random.key(1), x)
    np.testing.assert_allclose(jax.jit(im2col.apply)(params, x), jax.jit(xla.apply)(params, x), rtol=1e-4,
                               atol=1e-4)
    for a, b in zip(*map(jax.tree.leaves, sin_sum_gradients((im2col, xla), params, x))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("height", [1, 2])
@pytest.mark.parametrize("width, kw", [(14, 5), (32, 5), (15, 3), (17, 3), (30, 3)])
def test_band_rows_hold_each_bands_columns_and_the_banded_gradients_equal_xlas(width, kw, height):
    """The whole-width slices reshaped into bands (the backward pass's form where it has fewer copies)
    read the same rows and columns as one slice per band, also where the last slice runs past the input
    (padded), for bands of 1 and 2 output rows; ``band_rows``' own gradient equals the one-slice-per-band
    form's, also vmapped; and the convolution's gradients match XLA's."""
    from fedjax_lab.models.layers import band_rows, band_width

    x = jax.random.normal(jax.random.key(0), (2, 6, width, 3))
    wb = band_width(width - kw + 1, kw)
    bands, groups = (width - kw + 1) // wb, 4 // height

    @jax.jit
    def per_band(x):  # band (g, n) reads rows g * height .. g * height + height + 1
        return jnp.stack([jnp.stack([jnp.stack([x[:, g * height + i, n * wb:n * wb + wb + kw - 1]
                                                for g in range(groups)], 1) for n in range(bands)], 2)
                          for i in range(height + 2)], 3)

    whole_width = jax.jit(lambda x: layers._bands_whole_width(x, 3, kw, wb, height))
    rows = jax.jit(lambda x: band_rows(x, 3, kw, wb, height))
    np.testing.assert_array_equal(whole_width(x), per_band(x))
    np.testing.assert_array_equal(rows(x), per_band(x))
    cotangent = jax.random.normal(jax.random.key(2), per_band(x).shape)
    transpose = lambda f: jax.jit(lambda x, g: jax.vjp(f, x)[1](g)[0])
    expected = transpose(per_band)(x, cotangent)
    np.testing.assert_allclose(transpose(rows)(x, cotangent), expected, rtol=1e-5, atol=1e-5)
    vmapped = jax.vmap(transpose(rows))
    np.testing.assert_allclose(vmapped(jnp.stack([x, 2 * x]), jnp.stack([cotangent, -cotangent]))[1],
                               -expected, rtol=1e-5, atol=1e-5)
    banded = Conv(4, (3, kw), "VALID", lowering="banded", band_height=height)
    xla = Conv(4, (3, kw), "VALID", lowering="xla")
    params = xla.init(jax.random.key(1), x)
    np.testing.assert_allclose(jax.jit(banded.apply)(params, x), jax.jit(xla.apply)(params, x), rtol=1e-5,
                               atol=1e-5)
    for a, b in zip(*map(jax.tree.leaves, sin_sum_gradients((banded, xla), params, x))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("height", [1, 2])
@pytest.mark.parametrize("kernel, padding, width", [((5, 5), "SAME", 14), ((5, 5), "VALID", 13),
                                                    ((5, 3), 1, 13), ((3, 5), 5, 13)])
def test_the_banded_input_gradient_as_a_transposed_convolution_equals_xlas(kernel, padding, width, height):
    """Where the band inputs' transpose would sum more than ``TRANSPOSED_GRADIENT`` copies, the input's
    gradient is a banded convolution of the outputs' cotangent: XLA's gradients, first and second order, for
    SAME, VALID, and padding beyond the kernel (the transposed padding crops)."""
    x = jax.random.normal(jax.random.key(0), (2, 12, width, 6))
    banded = Conv(7, kernel, padding, lowering="banded", band_height=height)
    xla = Conv(7, kernel, padding, lowering="xla")
    params = xla.init(jax.random.key(1), x)
    out_w = xla.apply(params, x).shape[2]
    wb = layers.band_width(out_w, kernel[1])
    assert layers.gradient_copies(out_w, kernel, wb, height) > layers.TRANSPOSED_GRADIENT
    np.testing.assert_allclose(jax.jit(banded.apply)(params, x), jax.jit(xla.apply)(params, x), rtol=1e-5,
                               atol=1e-5)

    def grads(conv, x):
        loss = lambda p, x: jnp.sum(jnp.sin(conv.apply(p, x)))
        first = jax.grad(loss, argnums=(0, 1))(params, x)
        second = jax.grad(lambda x: jnp.sum(jax.grad(loss)(params, x)["params"]["kernel"] ** 2))(x)
        return first, second

    for a, b in zip(jax.tree.leaves(jax.jit(lambda x: grads(banded, x))(x)),
                    jax.tree.leaves(jax.jit(lambda x: grads(xla, x))(x))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max())


def test_the_transposed_convolution_gradient_vmaps():
    """BHerd's second layer (5x5 SAME on 14 columns: 15 copies), its input's gradient vmapped over a batch of
    inputs as the cohort loop maps clients: each equals XLA's."""
    x = jnp.stack([jax.random.normal(jax.random.key(0), (2, 14, 14, 6)), jax.random.normal(jax.random.key(3),
                                                                                         (2, 14, 14, 6))])
    banded, xla = (Conv(7, (5, 5), "SAME", lowering=lowering) for lowering in ("banded", "xla"))
    params = xla.init(jax.random.key(1), x[0])
    input_gradient = lambda conv: jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(conv.apply(params, x)))))
    vmapped = jax.jit(jax.vmap(input_gradient(banded)))(x)
    for vmapped_one, x_one in zip(vmapped, x):
        np.testing.assert_allclose(vmapped_one, input_gradient(xla)(x_one), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("channels, features, narrow_outputs", [(1, 32, False), (32, 8, True)])
def test_the_banded_kernel_gradient_equals_xlas_in_either_orientation(channels, features, narrow_outputs):
    """The kernel's gradient multiplies the band inputs and the outputs' cotangent with the narrower first:
    the outputs' (32 filters of 4 columns against 40 inputs: BHerd's first layer) or the inputs'; XLA's
    gradients either way."""
    x = jax.random.normal(jax.random.key(0), (2, 10, 12, channels))
    banded = Conv(features, (5, 5), "SAME", lowering="banded")
    xla = Conv(features, (5, 5), "SAME", lowering="xla")
    params = xla.init(jax.random.key(1), x)
    assert layers._narrower_first(4 * features, 5 * 8 * channels) == narrow_outputs
    for a, b in zip(*map(jax.tree.leaves, sin_sum_gradients((banded, xla), params, x))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max())


def test_a_narrow_band_takes_two_rows_of_outputs_where_they_divide_the_height():
    """The simple-CNN's first layer (4 columns x 6 filters a band) takes 2 output rows a band, its second (5 x
    16) one; an odd output height falls back to one row a band, with the same values."""
    assert layers.default_band_height(4, 6) == 2 and layers.default_band_height(5, 16) == 1
    x = jax.random.normal(jax.random.key(0), (2, 9, 8, 3))  # output height 5
    kernel = jax.random.normal(jax.random.key(1), (5, 5, 3, 6))
    reference = jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO",
                                                                                          "NHWC"))
    np.testing.assert_array_equal(layers.banded_conv(x, kernel, 2), layers.banded_conv(x, kernel, 1))
    np.testing.assert_allclose(layers.banded_conv(x, kernel, 2), reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lowering", ["im2col", "banded"])
@pytest.mark.parametrize("kernel, strides, padding", [(3, 2, 1), (1, 2, 0), (3, 1, 1), (3, 2, 0)])
def test_strided_and_padded_lowerings_equal_xla_convolution(lowering, kernel, strides, padding):
    x = jax.random.normal(jax.random.key(0), (2, 8, 7, 3))
    conv = lambda lowering: Conv(4, (kernel, kernel), padding, lowering=lowering, strides=(strides, strides))
    params = conv("xla").init(jax.random.key(1), x)
    reference = (jax.lax.conv_general_dilated(x, params["params"]["kernel"], (strides,) * 2,
                                              [(padding,) * 2] * 2,
                                              dimension_numbers=("NHWC", "HWIO", "NHWC"))
                 + params["params"]["bias"])
    np.testing.assert_allclose(jax.jit(conv("xla").apply)(params, x), reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(conv(lowering).apply)(params, x), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lowering", ["im2col", "banded"])
def test_resnet_lowerings_share_parameters_and_compute_the_same_function_and_gradients(lowering):
    from fedjax_lab.models import resnet8

    x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
    xla, lowered = resnet8(10, lowering="xla"), resnet8(10, lowering=lowering)
    variables = jax.jit(lambda k: xla.init(k, x, train=False))(jax.random.key(1))
    lowered_variables = jax.eval_shape(lambda k: lowered.init(k, x, train=False), jax.random.key(1))
    assert jax.tree.structure(variables) == jax.tree.structure(lowered_variables)
    apply = lambda model: jax.jit(lambda v: model.apply(v, x, train=False))(variables)
    np.testing.assert_allclose(apply(lowered), apply(xla), rtol=1e-4, atol=1e-4)
    grad = lambda model: jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(model.apply({**variables, "params": p},
                                                                                 x)))))(variables["params"])
    for got, want in zip(jax.tree.leaves(grad(lowered)), jax.tree.leaves(grad(xla))):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_a_resnet_with_rematerialised_blocks_is_the_same_function_with_the_same_gradients():
    from fedjax_lab.models import resnet8

    norm = "batch"  # its statistics' updates pass through the rematerialised blocks too

    x = jax.random.normal(jax.random.key(0), (4, 16, 16, 3))
    labels = jnp.arange(4) % 10
    stored, remat = resnet8(10, norm), resnet8(10, norm, remat=True)
    variables = jax.jit(lambda k: stored.init(k, x, train=False))(jax.random.key(1))
    assert jax.tree.structure(variables) == jax.tree.structure(
        jax.eval_shape(lambda k: remat.init(k, x, train=False), jax.random.key(1)))

    def loss(module, params):
        logits, updates = module.apply({**variables, "params": params}, x, train=True,
                                       mutable=["batch_stats"])
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[jnp.arange(4), labels]), updates

    (value, updates), grads = jax.jit(jax.value_and_grad(lambda p: loss(stored, p), has_aux=True))(
        variables["params"])
    (value_r, updates_r), grads_r = jax.jit(jax.value_and_grad(lambda p: loss(remat, p), has_aux=True))(
        variables["params"])
    np.testing.assert_allclose(value_r, value, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grads_r, grads)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), updates_r, updates)


def test_reshape_max_pool_equals_reduce_window_max_pool():
    import flax.linen as nn

    x = jax.random.normal(jax.random.key(0), (2, 8, 6, 3))
    np.testing.assert_allclose(max_pool_2x2(x), nn.max_pool(x, (2, 2), (2, 2)))
    odd = jax.random.normal(jax.random.key(0), (2, 7, 7, 3))
    assert max_pool_2x2(odd, "SAME").shape == (2, 4, 4, 3) and max_pool_2x2(odd).shape == (2, 3, 3, 3)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_max_pools_one_pass_gradient_is_jaxs_maximum_rule_bit_for_bit_ties_included(dtype):
    def plain(x):  # what max_pool_2x2 computed before its custom gradient
        return jnp.maximum(jnp.maximum(x[:, 0::2, 0::2], x[:, 1::2, 0::2]),
                           jnp.maximum(x[:, 0::2, 1::2], x[:, 1::2, 1::2]))

    rng = np.random.default_rng(0)
    x = np.maximum(rng.normal(size=(3, 8, 6, 4)), 0)  # after a ReLU: windows of tied zeros
    x[:, 0, 0] = x[:, 1, 0]  # two tied corners in the same pair
    x[:, 2, 2] = x[:, 3, 3] = x[:, 2, 3]  # three tied corners across the pairs
    x[:, 4:6, 0:2] = 0.7  # all four
    x[:, 6:8, 0:2] = np.array([[-0.0, 0.0], [0.0, -0.0]])[None, :, :, None]  # signed zeros tie too
    x, g = jnp.asarray(x, dtype), jnp.asarray(rng.normal(size=(3, 4, 3, 4)), dtype)
    ours, theirs = jax.vjp(max_pool_2x2, x), jax.vjp(plain, x)
    assert jnp.array_equal(ours[0], theirs[0])
    grad, expected = ours[1](g)[0], theirs[1](g)[0]
    assert grad.dtype == dtype and jnp.array_equal(grad, expected)
    # a 4-way tie: a quarter each
    assert float(grad[0, 4, 0, 0]) == pytest.approx(float(g[0, 2, 0, 0]) / 4, rel=1e-2)
    batched = jax.vmap(lambda x, g: jax.vjp(max_pool_2x2, x)[1](g)[0])(x[:, None], g[:, None])
    assert jnp.array_equal(batched[:, 0], expected)


@pytest.mark.parametrize("depth_radius, beta", [(4, 0.75), (2, 0.5)])
def test_local_response_norm_and_its_gradient_match_the_formula_on_every_channel(depth_radius, beta):
    x = np.asarray(jax.random.normal(jax.random.key(0), (2, 3, 2, 12))) * 3
    padded = np.pad(np.square(x.astype(np.float64)), ((0, 0),) * 3 + ((depth_radius, depth_radius),))
    window = sum(padded[..., i:i + 12] for i in range(2 * depth_radius + 1))  # edges: the channels that exist
    expected = x / (1 + 0.001 / 9 * window) ** beta
    got = local_response_norm(jnp.asarray(x), depth_radius=depth_radius, beta=beta)
    np.testing.assert_allclose(got, expected, rtol=1e-6)

    def naive(x):  # the formula as written, a power of shifted slices
        squared = jnp.pad(jnp.square(x), ((0, 0),) * 3 + ((depth_radius, depth_radius),))
        return x / (1 + 0.001 / 9 * sum(squared[..., i:i + 12] for i in range(2 * depth_radius + 1))) ** beta

    weights = jax.random.normal(jax.random.key(1), x.shape)
    grads = [jax.grad(lambda x, f=f: jnp.sum(weights * f(x)))(jnp.asarray(x))
             for f in (naive, lambda x: local_response_norm(x, depth_radius=depth_radius, beta=beta))]
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_squared_hinge_svm_loss_and_gradient_match_bherd():
    clf = Classifier(LinearSVM(), (4,), objective="squared_hinge", l2=0.1)
    variables = {"params": {"output": {"kernel": jnp.array([[0.5], [-1.0], [0.2], [0.0]])}}}
    x = jnp.array([[1.0, 0.0, 1.0, 2.0], [0.0, 1.0, 0.0, -1.0], [2.0, 2.0, 0.0, 0.0]])
    y = jnp.array([1, 0, 1])
    batch = {"x": x, "y": y, "mask": jnp.ones(3)}
    w = variables["params"]["output"]["kernel"][:, 0]
    s, signs = x @ w, 2.0 * y - 1.0
    margin = jnp.maximum(0.0, 1 - signs * s)
    expected = 0.05 * jnp.sum(w**2) + 0.5 * jnp.mean(margin**2)
    np.testing.assert_allclose(clf.loss(variables, batch, None)[0], expected, rtol=1e-6)
    grad = jax.grad(lambda v: clf.loss(v, batch, None)[0])(variables)["params"]["output"]["kernel"][:, 0]
    np.testing.assert_allclose(grad, 0.1 * w - jnp.mean((signs * margin)[:, None] * x, 0), rtol=1e-5)


def _image_dataset(num_clients=4, per_client=12, shape=(8, 8, 3)):
    rng = np.random.RandomState(0)
    n = num_clients * per_client
    x = rng.randint(0, 256, (n,) + shape).astype(np.uint8)
    y = rng.randint(0, 3, n).astype(np.int32)
    ids, counts = index_table(np.array_split(np.arange(n), num_clients))
    return FederatedDataset("images", {"x": x, "y": y}, {"x": x, "y": y}, ids, counts, 3)


def test_batchnorm_statistics_are_trained_locally_and_averaged_across_clients():
    data = _image_dataset()
    clf = Classifier(ResNet(3, (4, 8), (1, 1), "batch"), data.input_shape)
    algorithm = fedavg(clf.loss, optax.sgd(0.0), fedavg_server(1.0), LocalSchedule(5, local_steps=2))
    variables = clf.init(jax.random.key(0))
    state = init_loop_state(algorithm, variables, data.num_clients)
    state, _ = make_run_rounds(algorithm, CohortPlan(4, 4))(state, make_inputs(data), num_rounds=1)
    new = state.server_state.params
    # With lr 0 the weights stay put, but the running statistics move (PyTorch momentum 0.1 per step).
    jax.tree.map(np.testing.assert_array_equal, new["params"], variables["params"])
    moved = [float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(new["batch_stats"]),
                                                            jax.tree.leaves(variables["batch_stats"]))]
    assert min(moved) > 0
    # And the server's statistics are the weighted mean of each client's own, computed one client at a time.
    from fedjax_lab.engine import ClientData, randomness, train_locally

    inputs = make_inputs(data)

    @jax.jit
    def one_client(k):
        client = ClientData(k, jnp.asarray(data.client_train_ids)[k], jnp.int32(12))
        key = randomness.client_key(inputs.key, 0, k)
        return train_locally(variables, clf.loss, optax.sgd(0.0), client, inputs.train_arrays, key,
                             LocalSchedule(5, local_steps=2))[0]["batch_stats"]

    stats = [one_client(jnp.int32(k)) for k in range(4)]
    expected = jax.tree.map(lambda *s: sum(s) / 4, *stats)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), new["batch_stats"],
                 expected)


def test_masked_rows_do_not_enter_batch_statistics():
    clf = Classifier(resnet8(3, "batch"), (8, 8, 3))
    variables = jax.jit(clf.init)(jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (4, 8, 8, 3))
    garbage = x.at[2:].set(1e3)
    mask = jnp.array([1.0, 1.0, 0.0, 0.0])
    apply_train = jax.jit(lambda batch: clf.apply_train(variables, batch, None)[1])
    clean = apply_train({"x": x[:2], "y": jnp.zeros(2, int), "mask": jnp.ones(2)})
    masked = apply_train({"x": garbage, "y": jnp.zeros(4, int), "mask": mask})
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), clean, masked)


def test_crop_and_flip_keep_shape_and_pixels():
    x = jnp.arange(2 * 6 * 6 * 1, dtype=jnp.uint8).reshape(2, 6, 6, 1)
    out = crop_and_flip(jax.random.key(0), {"x": x})
    assert out.shape == x.shape and out.dtype == x.dtype
    # Every output pixel is zero padding or a pixel of the same image.
    for i in range(2):
        assert set(np.unique(np.asarray(out[i]))) <= set(np.unique(np.asarray(x[i]))) | {0}


def test_gaussian_noise_has_the_per_example_std():
    x = jnp.zeros((2, 100, 100, 1), jnp.uint8)
    out = gaussian_noise(jax.random.key(0), {"x": x, "noise_std": jnp.array([0.0, 0.5])})
    assert float(jnp.std(out[0])) == 0.0 and abs(float(jnp.std(out[1])) - 0.5) < 0.02

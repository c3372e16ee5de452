"""Embedded datasets are deterministic and shaped as documented; models have the documented sizes."""

import jax
import numpy as np
import pytest

from fedjax_lab.data import FederatedDataset, fedprox_synthetic, gaussian_mixture, index_table
from fedjax_lab.models import MLP, Classifier, LogisticRegression


def test_fedprox_synthetic_is_deterministic_and_follows_the_generator():
    a, b = (fedprox_synthetic(1.0, 1.0, num_clients=30, seed=0),
            fedprox_synthetic(1.0, 1.0, num_clients=30, seed=0))
    np.testing.assert_array_equal(a.train["x"], b.train["x"])
    assert a.num_clients == 30 and a.input_shape == (60,) and a.num_classes == 10
    totals = a.client_train_counts + a.client_test_counts
    sizes = np.random.RandomState(0).lognormal(4, 2, 30).astype(int) + 50
    np.testing.assert_array_equal(totals, sizes)
    np.testing.assert_array_equal(a.client_train_counts, (0.9 * sizes).astype(int))
    assert not np.array_equal(fedprox_synthetic(seed=1).train["x"][:5], a.train["x"][:5])


def test_fedprox_synthetic_beta_controls_how_far_client_inputs_drift():
    """Client input means are v_k ~ N(B_k, 1) with B_k ~ N(0, beta): their spread is about sqrt(1 +
    beta^2)."""

    def spread_of_client_means(data):
        big = data.client_train_counts >= 40  # tiny clients' sample means are noisy
        means = [data.train["x"][ids[:n]].mean(0) for ids, n in
                 zip(data.client_train_ids[big], data.client_train_counts[big])]
        return np.std(means, axis=0)[:10].mean()  # the first coordinates have the largest variance

    assert spread_of_client_means(fedprox_synthetic(iid=True)) < 0.4
    assert 0.6 < spread_of_client_means(fedprox_synthetic(0.0, 0.0)) < 1.3
    assert spread_of_client_means(fedprox_synthetic(0.0, 3.0)) > 2.0


def test_gaussian_mixture_label_skew_follows_alpha():
    def mean_classes_per_client(alpha):
        d = gaussian_mixture(num_clients=40, examples_per_client=50, label_alpha=alpha, seed=1)
        return np.mean([len(np.unique(d.train["y"][ids[:n]]))
                        for ids, n in zip(d.client_train_ids, d.client_train_counts)])

    assert mean_classes_per_client(0.05) < 4
    assert mean_classes_per_client(None) > 8


def test_index_table_pads_and_counts():
    ids, counts = index_table([np.array([4, 5, 6]), np.array([1])])
    np.testing.assert_array_equal(ids, [[4, 5, 6], [1, 0, 0]])
    np.testing.assert_array_equal(counts, [3, 1])


def test_client_without_examples_is_rejected():
    ids, counts = index_table([np.array([0, 1]), np.array([], np.int64)])
    arrays = {"x": np.zeros((2, 3), np.float32), "y": np.zeros(2, np.int32)}
    with pytest.raises(ValueError, match=r"clients \[1\] have none"):
        FederatedDataset("d", arrays, arrays, ids, counts, 2)


@pytest.mark.parametrize("module, shape, expected", [
    (MLP(10, (200, 200)), (28, 28, 1), 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10),
    (LogisticRegression(10), (60,), 610),
])
def test_model_parameter_counts(module, shape, expected):
    clf = Classifier(module, shape)
    assert clf.num_params(clf.init(jax.random.key(0))) == expected


def test_features_and_head_compose_to_the_model():
    clf = Classifier(MLP(3, (7, 5)), (4,))
    params = clf.init(jax.random.key(0))
    x = np.random.RandomState(0).normal(size=(2, 4)).astype(np.float32)
    h = clf.module.apply(params, x, method="features")
    assert h.shape == (2, 5)
    np.testing.assert_allclose(clf.module.apply(params, h, method="head"), clf.predict(params, x), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_standardize_fits_each_channels_mean_and_std_of_the_training_images(dtype):
    """Per channel (the last axis), as NumPy computes it from the pixels in float64 (integer images scaled
    by 1/255), whatever the chunk size, and the transform applies those statistics."""
    from fedjax_lab.models import Standardize

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (37, 5, 7, 3)).astype(dtype)
    images[..., 1] //= 4  # channels of different spread
    pixels = images.reshape(-1, 3).astype(np.float64) / (255.0 if dtype == np.uint8 else 1.0)
    for chunk in (1 << 20, 100, 1):
        fitted = Standardize.fit(images, chunk=chunk)
        np.testing.assert_allclose(fitted.mean, pixels.mean(0), rtol=1e-12)
        np.testing.assert_allclose(fitted.std, pixels.std(0), rtol=1e-10)
    x = images[:4]
    np.testing.assert_allclose(np.asarray(fitted(x)), (pixels[:4 * 35].reshape(x.shape) - pixels.mean(0))
                               / pixels.std(0), rtol=1e-4, atol=1e-5)

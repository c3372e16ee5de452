"""Embedded datasets, generated from a seed: no download, identical on every machine.

* :func:`fedprox_synthetic`: Synthetic(alpha, beta) of the FedProx paper.
* :func:`gaussian_mixture`: a Gaussian-mixture classification task with Dirichlet label skew.
"""

from __future__ import annotations

import numpy as np

from fedjax_lab.data.federated import FederatedDataset


def _split(x: np.ndarray, y: np.ndarray, train_fraction: float):
    """The first ``train_fraction`` of a client's examples for training, the rest for its test split."""
    n_train = max(int(train_fraction * len(y)), 1)
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def fedprox_synthetic(alpha: float = 1.0, beta: float = 1.0, num_clients: int = 30, iid: bool = False,
                      dimension: int = 60, num_classes: int = 10, train_fraction: float = 0.9,
                      seed: int = 0) -> FederatedDataset:
    """Synthetic(alpha, beta) federated data (Li et al., "Federated Optimization in Heterogeneous Networks").

    For client k: ``u_k ~ N(0, alpha)``, ``W_k ~ N(u_k, 1)`` (``[dimension, num_classes]``),
    ``b_k ~ N(u_k, 1)``; ``B_k ~ N(0, beta)``, ``v_k ~ N(B_k, 1)`` per coordinate; inputs
    ``x ~ N(v_k, Sigma)`` with ``Sigma = diag(j^-1.2)``; labels ``y = argmax softmax(W_k^T x + b_k)``.
    Client sizes follow the FedProx generator: ``floor(lognormal(4, 2)) + 50``. ``alpha`` controls how much
    the local models differ, ``beta`` how much the local inputs differ. With ``iid=True`` every client shares
    one ``W, b ~ N(0, 1)`` and inputs are drawn around zero (FedProx's "Synthetic-IID").
    Each client's first ``train_fraction`` of examples is its training split, the rest its test split.

    Note: the FedProx generator passes ``alpha`` and ``beta`` as the *standard deviation* of numpy's normal;
    we do the same, so ``alpha = beta = 1`` matches their Synthetic(1, 1).
    """
    rng = np.random.RandomState(seed)
    sizes = rng.lognormal(4, 2, num_clients).astype(int) + 50
    u = rng.normal(0, alpha, num_clients)
    b_mean = rng.normal(0, beta, num_clients)
    sigma = np.diag(np.arange(1, dimension + 1, dtype=np.float64) ** -1.2)
    shared_w = rng.normal(0, 1, (dimension, num_classes))
    shared_b = rng.normal(0, 1, num_classes)
    clients, client_tests = [], []
    for k in range(num_clients):
        if iid:
            w, b, mean_x = shared_w, shared_b, np.zeros(dimension)
        else:
            w = rng.normal(u[k], 1, (dimension, num_classes))
            b = rng.normal(u[k], 1, num_classes)
            mean_x = rng.normal(b_mean[k], 1, dimension)
        x = rng.multivariate_normal(mean_x, sigma, sizes[k])
        y = np.argmax(x @ w + b, axis=1)
        train, test = _split(x.astype(np.float32), y, train_fraction)
        clients.append(train)
        client_tests.append(test)
    name = "synthetic_iid" if iid else f"synthetic({alpha:g},{beta:g})"
    return FederatedDataset.from_clients(name, clients, client_tests, num_classes)


def gaussian_mixture(num_clients: int = 100, examples_per_client: int = 100, num_classes: int = 10,
                     dimension: int = 20, separation: float = 1.0, label_alpha: float | None = 0.5,
                     train_fraction: float = 0.8, seed: int = 0) -> FederatedDataset:
    """A Gaussian-mixture classification task split over clients with Dirichlet label skew.

    Class c has mean ``mu_c ~ N(0, separation^2 I)`` in ``dimension`` dimensions and unit covariance. Client
    k draws its class mix ``p_k ~ Dir(label_alpha * 1)`` (uniform when ``label_alpha`` is None), then
    ``examples_per_client`` labels from ``p_k`` and inputs ``x ~ N(mu_y, I)``. Each client's first
    ``train_fraction`` of examples is its training split, the rest its test split.
    """
    rng = np.random.RandomState(seed)
    means = rng.normal(0, separation, (num_classes, dimension))
    clients, client_tests = [], []
    for _ in range(num_clients):
        mix = (np.full(num_classes, 1.0 / num_classes) if label_alpha is None
               else rng.dirichlet(np.full(num_classes, label_alpha)))
        y = rng.choice(num_classes, examples_per_client, p=mix)
        x = (means[y] + rng.normal(0, 1, (examples_per_client, dimension))).astype(np.float32)
        train, test = _split(x, y, train_fraction)
        clients.append(train)
        client_tests.append(test)
    skew = "iid" if label_alpha is None else f"dir{label_alpha:g}"
    return FederatedDataset.from_clients(f"gaussian_mixture({skew})", clients, client_tests, num_classes)

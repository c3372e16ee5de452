"""Central and per-client evaluation against a direct numpy computation."""

import jax
import numpy as np

from fedjax_lab.data import index_table
from fedjax_lab.engine import Evaluator
from fedjax_lab.models import Classifier, LogisticRegression


def test_evaluator_matches_direct_computation_and_groups_by_client():
    rng = np.random.RandomState(0)
    x = rng.normal(size=(53, 6)).astype(np.float32)
    y = rng.randint(4, size=53).astype(np.int32)
    clf = Classifier(LogisticRegression(4), (6,))
    params = clf.init(jax.random.key(2))
    logits = np.asarray(clf.predict(params, x))
    log_probs = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    correct = (logits.argmax(1) == y).astype(np.float64)
    rows = [np.arange(0, 10), np.arange(10, 13), np.arange(13, 53)]
    ids, counts = index_table(rows)

    metrics = Evaluator(clf.example_metrics, {"x": x, "y": y}, batch_size=16, client_example_ids=ids,
                        client_num_examples=counts)(params)
    np.testing.assert_allclose(metrics["test_loss"], -log_probs[np.arange(53), y].mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["test_accuracy"], correct.mean(), rtol=1e-6)
    per_client = np.array([correct[r].mean() for r in rows])
    np.testing.assert_allclose(metrics["client_accuracy_mean"], per_client.mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["client_accuracy_std"], per_client.std(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["client_accuracy_min"], per_client.min(), rtol=1e-6)

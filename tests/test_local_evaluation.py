"""The local models of a round, evaluated before aggregation (FedCOG's personalised accuracy and Fig. 2)."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import assert_trees_close, make_fedavg, make_inputs

from fedjax_lab.engine import CohortPlan, init_loop_state, make_run_rounds
from fedjax_lab.engine.local_evaluation import local_models, personalized_accuracy
from fedjax_lab.experiments import run_experiment, validate


def test_the_size_weighted_mean_of_the_local_models_is_the_next_fedavg_model(tiny_data, tiny_classifier):
    algorithm = make_fedavg(tiny_classifier)
    inputs = make_inputs(tiny_data)
    n = tiny_data.num_clients
    state = init_loop_state(algorithm, tiny_classifier.init(jax.random.key(0)), n)
    state, _ = make_run_rounds(algorithm, CohortPlan(n, n))(state, inputs, num_rounds=1)
    models = local_models(algorithm, state, inputs, jnp.arange(n))
    sizes = jnp.asarray(tiny_data.client_train_counts, jnp.float32)
    mean = jax.tree.map(lambda m: jnp.tensordot(sizes / sizes.sum(), m, axes=1), models)
    after, _ = make_run_rounds(algorithm, CohortPlan(n, n))(state, inputs, num_rounds=1)
    assert_trees_close(mean, after.server_state.params, rtol=1e-5, atol=1e-6)


def test_personalized_accuracy_weighs_each_class_by_the_clients_share():
    correct = jnp.array([[10.0, 0.0, 5.0]])  # of 10 test rows per class
    count = jnp.full((1, 3), 10.0)
    np.testing.assert_allclose(personalized_accuracy(correct, count, jnp.array([[1.0, 0.0, 0.0]])), [1.0])
    np.testing.assert_allclose(personalized_accuracy(correct, count, jnp.array([[0.5, 0.0, 0.5]])), [0.75])
    np.testing.assert_allclose(personalized_accuracy(correct, count, jnp.full((1, 3), 1 / 3)), [0.5])


def test_a_run_reports_its_local_models_when_asked(tmp_path):
    raw = {"dataset": {"name": "gaussian_mixture", "num_clients": 6, "examples_per_client": 20,
                       "dimension": 4, "num_classes": 3, "label_alpha": 0.2},
           "model": {"name": "mlp", "hidden": [8]}, "algorithm": {"name": "fedavg"},
           "client": {"local_steps": 5, "batch_size": 4, "learning_rate": 0.1},
           "rounds": {"num_rounds": 4, "clients_per_round": 3}, "eval": {"every": 2, "local_models": 6}}
    summary = run_experiment(validate(raw), tmp_path / "run", progress=False)
    final = summary["final"]
    assert 0 <= final["local_accuracy"] <= 1 and final["local_to_global_distance"] > 0
    for part in ("lower", "upper"):  # the MLP's hidden layer and its head (FedImpro's Fig. 3)
        assert 0 < final[f"local_to_global_distance_{part}"] < final["local_to_global_distance"]
    # Skewed clients' local models do better on their own class mix than on the uniform test set.
    assert final["local_personalized_accuracy"] > final["local_accuracy"]

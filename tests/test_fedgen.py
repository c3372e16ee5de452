"""FedGen: FedAvg exactly when off (alpha = beta = 0, or round 0), the generator's training, its label weights
and diversity, the teacher term's reach, and the plug-in on another base in the compiled loop."""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lab.engine.components import ClientView
from fedjax_lab.experiments import validate
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.methods.fedgen import (
    Generator,
    diversity_loss,
    fedgen,
    label_weights,
    sample_labels,
    train_generator,
)

SMALL = {"noise_dim": 4, "hidden": 16, "generator_steps": 5, "generator_batch_size": 8,
         "teacher_batch_size": 8}


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def _run(algorithm, rounds=3):
    """The states after each round and the stacked metrics (one compilation: a round at a time)."""
    raw = {"dataset": {"name": "gaussian_mixture", "num_clients": 6, "examples_per_client": 12,
                       "dimension": 4, "num_classes": 3, "label_alpha": 0.3},
           "model": {"name": "mlp", "hidden": [8]}, "algorithm": algorithm,
           "client": {"local_steps": 3, "batch_size": 4, "learning_rate": 0.1},
           "rounds": {"num_rounds": rounds, "clients_per_round": 3}}
    experiment = build_experiment(validate(raw))
    states, metrics = [experiment.initial_state()], []
    for _ in range(rounds):
        # kept: not donated
        state, m = experiment.run_rounds(jax.tree.map(jnp.copy, states[-1]), experiment.inputs,
                                         num_rounds=1)
        states.append(state)
        metrics.append(m)
    return states[1:], jax.tree.map(lambda *m: np.concatenate(m), *metrics)


def test_off_or_in_its_first_round_fedgen_is_fedavg_exactly_and_on_it_is_not():
    plain, _ = _run({"name": "fedavg"})
    off, _ = _run({"name": "fedgen", "alpha": 0.0, "beta": 0.0, **SMALL})
    on, metrics = _run({"name": "fedgen", **SMALL})
    for a, b in zip(off, plain):
        assert_trees_equal(a.server_state.params, b.server_state.params)
    assert_trees_equal(on[0].server_state.params, plain[0].server_state.params)  # round 0: G is untrained
    moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(on[-1].server_state.params),
                                                             jax.tree.leaves(plain[-1].server_state.params)))
    assert moved > 1e-4 and np.all(np.isfinite(metrics["train_loss"]))
    assert int(on[-1].server_state.components["fedgen"].round) == 3


def test_diversity_is_in_0_1_and_the_label_weights_are_shares_of_the_qualified_labels():
    eps, z = jax.random.uniform(jax.random.key(0), (16, 4)), jax.random.normal(jax.random.key(1), (16, 8))
    assert 0.0 < float(diversity_loss(eps, z)) < 1.0
    assert float(diversity_loss(eps, jnp.ones((16, 8)))) == 1.0  # collapsed outputs: the largest loss
    counts = jnp.array([[5, 0, 1, 0, 0], [0, 3, 2, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 9]])
    weights, qualified = label_weights(counts, jnp.array([True, True, True, False]))  # client 3 is not there
    np.testing.assert_array_equal(qualified, [True, True, True, False, False])
    np.testing.assert_allclose(weights.sum(0), [1, 1, 1, 0, 0])
    np.testing.assert_allclose(weights[:, 0], [5 / 6, 0, 1 / 6, 0])
    drawn = sample_labels(jax.random.key(2), qualified, 3000)
    assert set(np.unique(drawn).tolist()) == {0, 1, 2}


def test_the_generator_lowers_its_loss_and_the_fixed_heads_classify_its_features(tiny_classifier):
    clients = jax.vmap(tiny_classifier.init)(jax.random.split(jax.random.key(0), 3))
    heads = lambda z: jax.vmap(lambda v: tiny_classifier.module.apply(v, z, method="head"))(clients)
    counts = jnp.array([[5, 0, 1, 0], [0, 3, 2, 0], [1, 1, 0, 0]])  # label 3: nobody's
    component = fedgen(tiny_classifier, 4, jax.random.key(1), noise_dim=4, hidden=32)
    state = component.server_init(None)
    trained, m = train_generator(Generator(4, 32, (8,)), state, heads, counts, jnp.ones(3, bool),
                                 jax.random.key(2), steps=150, learning_rate=1e-2, batch_size=32, noise_dim=4)
    assert (float(m["fedgen_teacher_loss_end"] + m["fedgen_diversity_loss_end"])
            < float(m["fedgen_teacher_loss_start"] + m["fedgen_diversity_loss_start"]) - 0.1)
    weights, _ = label_weights(counts, jnp.ones(3, bool))
    y = jnp.tile(jnp.arange(3), 100)
    z = Generator(4, 32, (8,)).apply(trained.generator, jax.random.uniform(jax.random.key(3), (300, 4)), y)
    # The code's ensemble: the label-weighted sum of the heads' logits.
    accuracy = float(jnp.mean(jnp.argmax(jnp.einsum("mb,mbc->bc", weights[:, y], heads(z)), -1) == y))
    assert accuracy > 0.8, accuracy
    assert int(trained.round) == 1


def _client_term_grads(classifier, variables, batch):
    """The gradient of FedGen's client term in its second round, by (alpha, beta), one compilation."""

    @jax.jit
    def grads(alpha, beta):
        component = fedgen(classifier, 4, jax.random.key(1), alpha, beta, noise_dim=4, hidden=16,
                           teacher_batch_size=8)
        server = component.server_init(variables)._replace(round=jnp.int32(1))
        view = ClientView(variables, server, (), None, None, jax.random.key(2), jnp.float32(0.1))
        b = component.batch(view)(batch, jnp.int32(0), jax.random.key(3))

        def term(v):
            return component.loss_term(view)(v, b, classifier.forward(v, b, jax.random.key(4), True))

        return jax.grad(term)(variables)["params"]

    return grads


def test_the_teacher_term_trains_only_the_head_and_the_latent_term_reaches_the_body(tiny_classifier):
    variables = tiny_classifier.init(jax.random.key(0))
    batch = {"x": jax.random.normal(jax.random.key(5), (6, 5)), "y": jnp.array([0, 1, 2, 3, 0, 1]),
             "mask": jnp.array([1, 1, 1, 1, 1, 0], jnp.float32)}
    grads = _client_term_grads(tiny_classifier, variables, batch)
    teacher = grads(10.0, 0.0)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(teacher["hidden_0"]))
    assert float(jnp.abs(teacher["output"]["kernel"]).max()) > 0.0
    latent = grads(0.0, 10.0)
    assert float(jnp.abs(latent["hidden_0"]["kernel"]).max()) > 0.0


def test_fedgen_plugs_into_scaffold_in_the_compiled_loop():
    states, metrics = _run({"name": "scaffold", "plugins": [{"name": "fedgen", **SMALL}]})
    state = states[-1]
    assert set(state.client_states) == {"scaffold"}  # SCAFFOLD's controls; FedGen keeps no client state
    assert set(state.server_state.components) == {"scaffold", "fedgen"}
    assert int(state.server_state.components["fedgen"].round) == 3
    for name in ("fedgen_teacher_loss_start", "fedgen_teacher_loss_end", "fedgen_diversity_loss_end"):
        assert (metrics[name].shape == (3,) and np.all(np.isfinite(metrics[name]))
                and np.all(metrics[name] > 0))
    assert np.all(np.isfinite(metrics["train_loss"]))

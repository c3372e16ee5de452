"""VHL: the virtual dataset is a fixed function of the run's key, SupCon is Khosla et al.'s, the alignment
does not move the virtual features, and with its terms off the round is FedAvg's."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lab.experiments import validate
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.methods.vhl import supcon, virtual_batch, virtual_dataset


def supcon_reference(features, labels, mask, temperature):
    f = features / np.linalg.norm(features, axis=1, keepdims=True)
    rows = [i for i in range(len(f)) if mask[i]]
    losses = []
    for i in rows:
        others = [a for a in rows if a != i]
        positives = [p for p in others if labels[p] == labels[i]]
        log_denominator = np.log(sum(np.exp(f[i] @ f[a] / temperature) for a in others))
        losses.append(-np.mean([f[i] @ f[p] / temperature - log_denominator for p in positives]) if positives
                      else 0.0)
    return np.mean(losses)


def test_supcon_matches_a_direct_reference_with_lone_anchors_and_masked_rows():
    rng = np.random.RandomState(0)
    features = rng.normal(size=(9, 5)).astype(np.float32)
    labels = np.array([0, 0, 1, 1, 1, 2, 3, 3, 0])  # class 2 has no positive
    mask = np.array([1, 1, 1, 1, 1, 1, 1, 0, 1])  # row 7's class 3 is then alone too
    ours = supcon(jnp.asarray(features), jnp.asarray(labels), jnp.asarray(mask), 0.5)
    np.testing.assert_allclose(float(ours), supcon_reference(features, labels, mask, 0.5), rtol=1e-5)


def test_virtual_dataset_is_a_function_of_the_key_with_distinct_class_means():
    a = virtual_dataset(jax.random.key(3), 4, 50, (16, 16, 3))
    b = virtual_dataset(jax.random.key(3), 4, 50, (16, 16, 3))
    np.testing.assert_array_equal(a.images, b.images)
    assert a.images.shape == (200, 16, 16, 3) and a.images.dtype == jnp.uint8
    np.testing.assert_array_equal(a.classes, np.repeat(np.arange(4), 50))
    means = np.asarray(a.images, np.float32).reshape(4, 50, -1).mean(1)  # class templates
    spread = np.asarray(a.images, np.float32).reshape(4, 50, -1).std(1).mean()
    between = np.mean([np.abs(means[i] - means[j]).mean() for i in range(4) for j in range(i)])
    assert between > 0.5 * spread  # classes are told apart by their means
    x, c = virtual_batch(a, jax.random.key(0), 32)
    assert (len(set(np.asarray(c).tolist())) > 1 and x.shape == (32, 16, 16, 3)
            and float(x.min()) >= -2.0 and float(x.max()) <= 2.0)


def test_the_alignment_term_gives_no_gradient_to_the_virtual_features():
    h, h_v = jax.random.normal(jax.random.key(0), (2, 6, 4))
    y, c = jnp.array([0, 1, 2, 0, 1, 2]), jnp.array([2, 1, 0, 0, 1, 2])
    align = lambda h, h_v: supcon(jnp.concatenate([h, jax.lax.stop_gradient(h_v)]), jnp.concatenate([y, c]),
                                  jnp.ones(12), 0.07)
    g, g_v = jax.jit(jax.grad(align, argnums=(0, 1)))(h, h_v)
    assert float(jnp.abs(g).max()) > 0 and float(jnp.abs(g_v).max()) == 0


def _run(image_root, algorithm, rounds=2):
    raw = {"dataset": {"name": "image_folder", "data_dir": str(image_root), "partition": {"name": "iid",
                                                                                          "num_clients": 6}},
           "model": {"name": "simple_cnn"}, "algorithm": algorithm,
           "client": {"batch_size": 8, "local_steps": 3, "learning_rate": 0.05},
           "rounds": {"num_rounds": rounds, "clients_per_round": 3},
           "eval": {"every": rounds, "per_client": False}}
    experiment = build_experiment(validate(raw))
    state, metrics = experiment.run_rounds(experiment.initial_state(), experiment.inputs, num_rounds=rounds)
    return experiment, state, metrics


def test_with_its_terms_off_vhl_is_fedavg_exactly(image_root):
    _, expected, _ = _run(image_root, {"name": "fedavg"})
    off = {"alpha": 0.0, "align_weight": 0.0, "virtual_weight": 0.0, "labels": "shared", "per_class": 10}
    _, state, _ = _run(image_root, {"name": "vhl", **off})
    for x, y in zip(jax.tree.leaves(expected.server_state.params),
                    jax.tree.leaves(state.server_state.params)):
        np.testing.assert_array_equal(x, y)


def test_vhl_widens_the_head_to_the_virtual_classes_and_fits_them(image_root):
    experiment, state, _ = _run(image_root, {"name": "fedavg", "plugins": [{"name": "vhl", "per_class": 10}]},
                                rounds=4)
    params = state.server_state.params
    assert params["params"]["output"]["kernel"].shape[-1] == 3 + 3  # K natural + V virtual classes
    data = state.server_state.components["vhl"]
    x, c = jax.jit(virtual_batch, static_argnums=2)(data, jax.random.key(1), 30)

    @jax.jit
    def virtual_ce(variables):
        logits, _ = experiment.classifier.apply_inputs(variables, x)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, c + 3))

    assert virtual_ce(params) < virtual_ce(experiment.initial_state().server_state.params) - 0.3

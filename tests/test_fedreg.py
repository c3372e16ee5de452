"""FedReg: the pseudo and perturbed data are signed-gradient ascent on the global model's loss, and after each
step the client's displacement keeps no component that raises the perturbed data's loss to first order."""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lab.engine.components import ClientView
from fedjax_lab.engine.tree_math import tree_add, tree_scale, tree_sub, tree_vdot
from fedjax_lab.experiments import validate
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.methods.fedreg import (
    PROJECTION_POINT,
    alleviated_forgetting,
    project_displacement,
    regularisation_data,
    soft_cross_entropy,
)


def _trees(seed, n=3):
    keys = jax.random.split(jax.random.key(seed), n)
    return [{"a": jax.random.normal(k, (4, 3)), "b": jax.random.normal(jax.random.fold_in(k, 1), (5,))}
            for k in keys]


def test_the_projection_removes_the_displacements_ascent_components():
    for seed in range(20):
        d, g2, g3 = _trees(seed)
        projected = tree_add(d, project_displacement(d, g2, g3))
        assert float(tree_vdot(projected, g3)) <= 1e-5  # never along +g3 after the step
    d, g2, _ = _trees(0)
    g3 = tree_scale(d, -1.0)  # the second projection idles: the result is orthogonal to g2
    projected = tree_add(d, project_displacement(d, g2, g3))
    if float(tree_vdot(d, g2)) > 0:
        np.testing.assert_allclose(float(tree_vdot(projected, g2)), 0.0, atol=1e-5)
    descent = tree_scale(g2, -1.0)  # a displacement already lowering both losses is left alone
    np.testing.assert_allclose(project_displacement(descent, g2, g2)["a"], 0.0)


def test_pseudo_and_perturbed_data_ascend_the_global_loss_within_their_step_budget(tiny_data,
                                                                                   tiny_classifier):
    variables = tiny_classifier.init(jax.random.key(0))
    batch = {"x": jnp.asarray(tiny_data.train["x"][:16]), "y": jnp.asarray(tiny_data.train["y"][:16]),
             "mask": jnp.ones(16)}
    r = regularisation_data(tiny_classifier, variables, batch, jax.random.key(1), 4, 5, 0.1, 0.01)
    assert float(jnp.abs(r.perturbed_x - batch["x"]).max()) <= 5 * 0.01 + 1e-5
    assert float(jnp.abs(r.pseudo_x - batch["x"]).max()) <= 5 * 0.1 + 1e-5
    loss = lambda x: float(soft_cross_entropy(tiny_classifier.predict(variables, x), r.perturbed_targets,
                                              r.mask))
    assert loss(r.pseudo_x) > loss(r.perturbed_x) > loss(batch["x"])
    np.testing.assert_allclose(r.pseudo_targets.sum(-1), 1.0, rtol=1e-6)  # the global model's soft labels
    np.testing.assert_allclose(r.pseudo_targets,
                               jax.nn.softmax(tiny_classifier.predict(variables, r.pseudo_x)), rtol=1e-5)


def test_after_each_step_the_displacement_does_not_raise_the_perturbed_loss(tiny_data, tiny_classifier):
    global_vars = tiny_classifier.init(jax.random.key(0))
    component = alleviated_forgetting(tiny_classifier, 4, p_iters=3, ps_eta=0.3, pt_eta=0.05)
    view = ClientView(global_vars, (), (), None, None, jax.random.key(2), jnp.float32(0.1))
    transform = component.update(view)
    batch = {"x": jnp.asarray(tiny_data.train["x"][:16]), "y": jnp.asarray(tiny_data.train["y"][:16]),
             "mask": jnp.ones(16)}
    r = regularisation_data(tiny_classifier, global_vars, batch, jax.random.key(1), 4, 3, 0.3, 0.05)
    theta_g = global_vars["params"]
    params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(3), p.shape), theta_g)
    loss = lambda p, x, t: soft_cross_entropy(tiny_classifier.predict({"params": p}, x), t, r.mask)
    # A step up the perturbed data's loss (as a client step on data unlike the perturbed rows can be).
    updates = jax.tree.map(lambda g: 0.5 * g, jax.grad(loss)(params, r.perturbed_x, r.perturbed_targets))
    projected, _ = transform.update(updates, transform.init(params), params, batch={"fedreg": r})
    stepped = tree_add(params, updates)
    point = tree_add(tree_scale(stepped, PROJECTION_POINT), tree_scale(theta_g, 1 - PROJECTION_POINT))
    g3 = jax.grad(loss)(point, r.perturbed_x, r.perturbed_targets)
    assert float(tree_vdot(tree_sub(stepped, theta_g), g3)) > 0  # the plain step raised it
    assert float(tree_vdot(tree_sub(tree_add(params, projected), theta_g), g3)) <= 1e-6


def test_fedreg_runs_as_a_plugin_in_the_compiled_loop_and_changes_the_round(image_root):
    def run(algorithm):
        raw = {"dataset": {"name": "image_folder", "data_dir": str(image_root),
                           "partition": {"name": "iid", "num_clients": 6}},
               "model": {"name": "simple_cnn"}, "algorithm": algorithm,
               "client": {"batch_size": 8, "local_steps": 3, "learning_rate": 0.05},
               "rounds": {"num_rounds": 2, "clients_per_round": 3}}
        experiment = build_experiment(validate(raw))
        return experiment.run_rounds(experiment.initial_state(), experiment.inputs, num_rounds=2)

    base, _ = run({"name": "scaffold"})
    state, metrics = run({"name": "scaffold", "plugins": [{"name": "fedreg", "p_iters": 2}]})
    assert np.all(np.isfinite(metrics["train_loss"]))
    moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(state.server_state.params),
                                                            jax.tree.leaves(base.server_state.params)))
    assert moved > 1e-5

"""The examples in docs/extending.md run, and do what the text says."""

import importlib
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lab.engine import CohortPlan, RoundInputs, init_loop_state, make_run_rounds, randomness
from fedjax_lab.methods import registry
from fedjax_lab.models import cross_entropy_loss

DOC = pathlib.Path(__file__).parent.parent / "docs" / "extending.md"


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    """The doc's code: blocks headed ``# file: PATH`` are written to an importable folder at PATH, and the
    method's package is imported (which registers it; it is unregistered afterwards); the others run in order
    in one namespace."""
    folder = tmp_path_factory.mktemp("doc_methods")
    sys.path.insert(0, str(folder))
    namespace = {}
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL):
        header = re.match(r"# file: (\S+)\n", block)
        if header:
            (folder / header.group(1)).parent.mkdir(parents=True, exist_ok=True)
            (folder / header.group(1)).write_text(block)
        elif "walked =" not in block:  # the usage example needs a test's loss function: see _doc_namespace
            exec(block, namespace)  # noqa: S102 - the doc is the code under test
    importlib.import_module("fedclip")
    yield namespace
    registry.REGISTRY.pop("fedclip", None)
    sys.path.remove(str(folder))
    for module in ("fedclip", "fedclip.method"):
        sys.modules.pop(module, None)


def _doc_namespace(namespace, loss_fn):
    namespace["loss_fn"] = loss_fn
    # The usage block builds with the loss function of the test; run it again with this one.
    usage = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL) if "walked =" in b]
    exec(usage[0], namespace)  # noqa: S102 - the doc is the code under test
    return namespace


def test_fedsgd_example_takes_one_gradient_step_per_round(doc, tiny_data, tiny_classifier):
    loss_fn = cross_entropy_loss(tiny_classifier.predict)
    ns = _doc_namespace(doc, loss_fn)
    algorithm = ns["fedsgd"](loss_fn, server_learning_rate=0.5, batch_size=64)
    n = tiny_data.num_clients
    params = tiny_classifier.init(jax.random.key(0))
    inputs = RoundInputs(randomness.base_key(0), jax.device_put(tiny_data.train),
                         jnp.asarray(tiny_data.client_train_ids), jnp.asarray(tiny_data.client_train_counts),
                         {})
    state, _ = make_run_rounds(algorithm, CohortPlan(n, n))(init_loop_state(algorithm, params, n), inputs, 1)
    # batch 64 > every client's size, and all clients take part: one full-batch gradient step on all the data.
    batch = {"x": jnp.asarray(tiny_data.train["x"]), "y": jnp.asarray(tiny_data.train["y"]),
             "mask": jnp.ones(len(tiny_data.train["y"]))}
    expected = jax.tree.map(lambda p, g: p - 0.5 * g, params,
                            jax.grad(loss_fn, has_aux=True)(params, batch, None)[0])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), state.server_state,
                 expected)


def test_server_step_plugin_moves_the_model_towards_the_server_data(doc, tiny_data, tiny_classifier):
    loss_fn = cross_entropy_loss(tiny_classifier.predict)
    ns = _doc_namespace(doc, loss_fn)
    walked = ns["walked"]
    server = {"x": jnp.asarray(tiny_data.test["x"]), "y": jnp.asarray(tiny_data.test["y"])}
    inputs = RoundInputs(randomness.base_key(0), jax.device_put(tiny_data.train),
                         jnp.asarray(tiny_data.client_train_ids), jnp.asarray(tiny_data.client_train_counts),
                         server)
    state = init_loop_state(walked, tiny_classifier.init(jax.random.key(0)), tiny_data.num_clients)
    state, metrics = make_run_rounds(walked, CohortPlan(tiny_data.num_clients, 4))(state, inputs,
                                                                                   num_rounds=30)
    assert np.all(np.isfinite(metrics["server_loss"]))
    assert metrics["server_loss"][-5:].mean() < metrics["server_loss"][:5].mean()


def _raw(algorithm):
    return {"dataset": {"name": "gaussian_mixture", "num_clients": 6, "examples_per_client": 12,
                        "dimension": 4, "num_classes": 3},
            "model": {"name": "mlp", "hidden": [8]}, "algorithm": algorithm,
            "client": {"local_steps": 3, "batch_size": 4, "learning_rate": 0.5},
            "rounds": {"num_rounds": 2, "clients_per_round": 3}, "eval": {"every": 2, "per_client": False}}


def test_the_docs_new_method_runs_from_a_config_alone_and_as_a_plugin(doc, tmp_path):
    from fedjax_lab.experiments import run_experiment, validate

    for algorithm in ({"name": "fedclip", "max_norm": 0.5},
                      {"name": "scaffold", "plugins": [{"name": "fedclip", "max_norm": 0.5}]}):
        summary = run_experiment(validate(_raw(algorithm)), tmp_path / algorithm["name"], progress=False)
        assert np.isfinite(summary["final"]["test_loss"])


def test_the_docs_new_method_does_what_it_says(doc):
    from fedjax_lab.experiments import build_experiment, validate

    def first_round(algorithm):
        experiment = build_experiment(validate(_raw(algorithm)))
        return experiment.run_rounds(experiment.initial_state(), experiment.inputs, num_rounds=1)

    plain, _ = first_round({"name": "fedavg"})
    loose, _ = first_round({"name": "fedclip", "max_norm": 1e6})
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), plain.server_state.params,
                 loose.server_state.params)
    # Clipped to norm 1e-3, three SGD steps at rate 0.5 move each client by at most 1.5e-3.
    _, metrics = first_round({"name": "fedclip", "max_norm": 1e-3})
    assert 0 < float(metrics["update_norm"][0]) <= 1.5e-3 * (1 + 1e-5)


def test_a_field_the_docs_method_lacks_is_rejected_naming_it(doc):
    from fedjax_lab.experiments import ConfigError, validate

    with pytest.raises(ConfigError,
                       match="algorithm.mu: fedclip has no field 'mu' \\(it is a field of fedprox, moon\\)"):

        validate(_raw({"name": "fedclip", "mu": 0.1}))


def test_the_docs_method_is_one_folder_whose_names_reach_its_code(doc):
    """The registration found the builder in the folder's ``method.py``, and the package's names reach it."""
    spec = registry.REGISTRY["fedclip"]
    assert spec.builder == "fedclip.method:build"
    fedclip = sys.modules["fedclip"]
    assert fedclip.clipped_gradients is importlib.import_module("fedclip.method").clipped_gradients
    assert fedclip.method.build is spec.load_builder()
    with pytest.raises(AttributeError, match="clip_gradients"):
        fedclip.clip_gradients  # noqa: B018 - a name neither file has

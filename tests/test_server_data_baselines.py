"""Feddle's server-data baselines: Fed+FT fine-tunes the aggregate on the server's data; HFCL's server trains
as a client and joins the mean; FedDF distils the arrived models' ensemble into the aggregate."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from conftest import assert_trees_close, make_inputs

from fedjax_lab.engine import CohortPlan, LocalSchedule, init_loop_state, make_run_rounds, randomness
from fedjax_lab.engine.asynchrony import DelayModel
from fedjax_lab.engine.components import ServerView, component_key
from fedjax_lab.engine.local_training import train_locally
from fedjax_lab.engine.types import ClientData, Cohort, ServerContext
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.feddf import ensemble_distillation, ensemble_logits
from fedjax_lab.methods.fedft import server_finetune
from fedjax_lab.methods.hfcl import server_as_client
from fedjax_lab.methods.server_optimizers import fedavg_server
from fedjax_lab.models.divergences import mean_entropy, softened_kl

SCHEDULE = LocalSchedule(4, local_steps=3)


def _inputs(data):
    rows = np.arange(0, len(data.train["y"]), 3)
    return make_inputs(data)._replace(server_arrays={"x": jnp.asarray(data.train["x"][rows]),
                                                     "y": jnp.asarray(data.train["y"][rows])})


def _round(classifier, data, *components, rounds=1):
    algorithm = fedavg(classifier.loss, optax.sgd(0.1), fedavg_server(1.0), SCHEDULE, *components)
    inputs = _inputs(data)
    state = init_loop_state(algorithm, classifier.init(jax.random.key(0)), data.num_clients)
    return (make_run_rounds(algorithm, CohortPlan(data.num_clients, 4))(state, inputs, num_rounds=rounds)[0],
            inputs)


def _server_loss(classifier, params, inputs):
    batch = {**inputs.server_arrays, "mask": jnp.ones(inputs.server_arrays["y"].shape)}
    return float(classifier.loss(params, batch, jax.random.key(0))[0])


def test_fedft_with_no_steps_is_its_base_and_with_steps_lowers_the_server_loss(tiny_data, tiny_classifier):
    base, inputs = _round(tiny_classifier, tiny_data)
    none, _ = _round(tiny_classifier, tiny_data, server_finetune(tiny_classifier.loss, 0, 0.01, 16))
    tuned, _ = _round(tiny_classifier, tiny_data, server_finetune(tiny_classifier.loss, 30, 0.01, 16))
    assert_trees_close(base.server_state.params, none.server_state.params)
    assert _server_loss(tiny_classifier, tuned.server_state.params, inputs) < \
        _server_loss(tiny_classifier, base.server_state.params, inputs) - 0.05


def test_hfcl_weighs_the_servers_own_training_as_one_more_client(tiny_data, tiny_classifier):
    n = int(_inputs(tiny_data).server_arrays["y"].shape[0])
    optimizer = optax.sgd(0.1)
    base, inputs = _round(tiny_classifier, tiny_data)
    ignored, _ = _round(tiny_classifier, tiny_data,
                        server_as_client(tiny_classifier, optimizer, SCHEDULE, n, 0.0))
    assert_trees_close(base.server_state.params, ignored.server_state.params)
    # With an overwhelming weight the round's model is the server's own local training from w^0.
    dominant, _ = _round(tiny_classifier, tiny_data,
                         server_as_client(tiny_classifier, optimizer, SCHEDULE, n, 1e9))
    w0 = tiny_classifier.init(jax.random.key(0))
    key = component_key(randomness.round_key(inputs.key, jnp.int32(0), randomness.Purpose.SERVER), "hfcl")
    server = ClientData(jnp.int32(-1), jnp.arange(n, dtype=jnp.int32), jnp.int32(n), key)
    alone, _ = train_locally(w0, tiny_classifier, optimizer, server, inputs.server_arrays, key, SCHEDULE)
    assert_trees_close(dominant.server_state.params, alone, rtol=1e-4, atol=1e-5)


def _distil(classifier, student, teachers, weights, server_arrays, steps, learning_rate=0.01, metrics=False,
            teacher="weighted"):
    component = ensemble_distillation(classifier, steps, learning_rate, 16, teacher=teacher)
    cohort = Cohort(jnp.arange(weights.shape[0]), jnp.ones(weights.shape))
    view = ServerView((), {"feddf": teachers}, weights, cohort,
                      ServerContext(jax.random.key(1), jnp.int32(0), server_arrays), student)
    return jax.jit(component.after_step)(view, student)[2 if metrics else 1]


def _kl(classifier, student, teachers, weights, x):
    @jax.jit
    def kl(student, teachers, weights, x):
        target = ensemble_logits(classifier.predict, teachers, weights, x)
        return softened_kl(classifier.predict(student, x), target, jnp.ones(x.shape[0]), 1.0)

    return float(kl(student, teachers, weights, x))


def test_mean_entropy_is_log_c_for_uniform_predictions_and_skips_masked_rows():
    logits = jnp.array([[0.0, 0.0, 0.0, 0.0], [50.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(mean_entropy(logits, jnp.array([1, 0])), np.log(4), rtol=1e-6)
    np.testing.assert_allclose(mean_entropy(logits, jnp.array([0, 1])), 0.0, atol=1e-6)
    np.testing.assert_allclose(mean_entropy(logits, jnp.array([1, 1])), np.log(4) / 2, rtol=1e-6)


def test_feddf_reports_how_far_it_moved_the_model_and_how_sure_its_ensemble_is(tiny_data, tiny_classifier):
    # One member, a hair away from the student: the distillation loss starts near 0, yet Adam's first steps
    # are about its learning rate in every parameter, so the distance moved scales with the rate (FedDF at lr
    # 1e-3 on CIFAR-10, docs/reproductions/feddle.md).
    student = tiny_classifier.init(jax.random.key(0))
    leaves, tree = jax.tree.flatten(student)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    member = jax.tree.unflatten(tree, [x + 1e-3 * jax.random.normal(k, x.shape)
                                       for x, k in zip(leaves, keys)])
    teachers = jax.tree.map(lambda x: x[None], member)
    server = _inputs(tiny_data).server_arrays
    none, small, large = (_distil(tiny_classifier, student, teachers, jnp.ones(1), server, steps, lr,
                                  metrics=True)
                          for steps, lr in ((0, 1e-3), (5, 1e-5), (5, 1e-3)))
    assert float(none["feddf_step_norm"]) == 0.0
    assert float(small["feddf_loss_start"]) < 1e-4
    assert float(large["feddf_step_norm"]) > 10 * float(small["feddf_step_norm"]) > 0
    np.testing.assert_allclose(small["feddf_ensemble_entropy"], small["feddf_member_entropy"], rtol=1e-5)
    assert 0 < float(small["feddf_student_entropy"]) < np.log(tiny_data.num_classes)


def test_feddf_distils_the_weighted_ensemble_without_reading_labels(tiny_data, tiny_classifier):
    inits = [tiny_classifier.init(jax.random.key(k)) for k in range(4)]
    student, teachers = inits[0], jax.tree.map(lambda *x: jnp.stack(x), *inits[1:])
    weights = jnp.array([1.0, 2.0, 0.0])  # the third is not an arrival: it must not count
    server = _inputs(tiny_data).server_arrays
    x = server["x"]
    assert_trees_close(_distil(tiny_classifier, student, teachers, weights, server, 0), student)
    distilled = _distil(tiny_classifier, student, teachers, weights, server, 40)
    assert _kl(tiny_classifier, distilled, teachers, weights, x) < 0.5 * _kl(tiny_classifier, student,
                                                                             teachers, weights, x)
    # Labels are never read (FedDF-OOD runs on any inputs), and a zero-weight member changes nothing.
    relabelled = {"x": x, "y": jnp.roll(server["y"], 1)}
    other = jax.tree.map(lambda t, s: t.at[2].set(s), teachers, student)
    assert_trees_close(distilled, _distil(tiny_classifier, student, other, weights, relabelled, 40))


def test_feddf_teacher_is_the_plain_mean_of_the_arrived_members_by_default(tiny_data, tiny_classifier):
    # FedDF's code averages the members' logits uniformly; the size-weighted mean is the option.
    inits = [tiny_classifier.init(jax.random.key(k)) for k in range(4)]
    student, teachers = inits[0], jax.tree.map(lambda *x: jnp.stack(x), *inits[1:])
    sizes, arrived = jnp.array([1.0, 5.0, 0.0]), jnp.array([1.0, 1.0, 0.0])
    server = _inputs(tiny_data).server_arrays
    uniform = _distil(tiny_classifier, student, teachers, sizes, server, 10, teacher="uniform")
    assert_trees_close(uniform, _distil(tiny_classifier, student, teachers, arrived, server, 10,
                                        teacher="weighted"))
    by_size = _distil(tiny_classifier, student, teachers, sizes, server, 10, teacher="weighted")
    assert not np.allclose(jax.tree.leaves(uniform)[0], jax.tree.leaves(by_size)[0])
    from fedjax_lab.methods.registry import REGISTRY

    assert REGISTRY["feddf"].config.model_fields["teacher"].default == "uniform"


def test_feddf_runs_in_the_asynchronous_loop_with_its_buffer_as_the_ensemble(tiny_data, tiny_classifier):
    plan = CohortPlan(tiny_data.num_clients, 3, delay=DelayModel("half_normal", sigma=2.0), buffer_size=3)
    algorithm = fedavg(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0), SCHEDULE,
                       ensemble_distillation(tiny_classifier, 5, 0.003, 16))
    inputs = _inputs(tiny_data)
    state = init_loop_state(algorithm, tiny_classifier.init(jax.random.key(0)), tiny_data.num_clients, plan,
                            inputs)
    _, metrics = make_run_rounds(algorithm, plan)(state, inputs, num_rounds=12)
    stepped = np.asarray(metrics["server_steps"]) > 0
    start, end = np.asarray(metrics["feddf_loss_start"]), np.asarray(metrics["feddf_loss_end"])
    # Stale arrivals disagree with the aggregate, and each distillation brings it nearer their ensemble (a
    # student already at the ensemble, as in the first step, has nothing to learn).
    apart = stepped & (start > 1e-3)
    assert apart.sum() >= 5
    assert np.all(end[apart] < start[apart])

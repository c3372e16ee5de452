"""The algorithm of a run from its config: the clients' and the server's optimisers, the local schedule, and
the composition of the registered methods (the engine's round with the base's and the plug-ins' components,
then the wrapper plug-ins), built inside the compiled round from the round's hyper-parameter values."""

from __future__ import annotations

import jax
import optax

from fedjax_lab import models
from fedjax_lab.data import FederatedDataset
from fedjax_lab.engine import Algorithm, AlgorithmAt, LocalSchedule, RoundInputs, randomness
from fedjax_lab.engine.round import component_round
from fedjax_lab.experiments import hyperparams
from fedjax_lab.experiments.config import Config, ConfigError
from fedjax_lab.methods import registry, server_optimizers


def build_client_optimizer(config: Config, structure: Config | None = None) -> optax.GradientTransformation:
    """The clients' optax optimiser with ``config``'s values (numbers, or arrays inside the compiled round);
    which transformations it chains (a momentum buffer, weight decay) follows ``structure`` (default
    ``config``)."""
    c, s = config.client, (structure or config).client
    if s.optimizer == "sgd":
        opt = optax.sgd(c.learning_rate, momentum=c.momentum if s.momentum else None)
    else:
        opt = optax.adam(c.learning_rate)
    return optax.chain(optax.add_decayed_weights(c.weight_decay), opt) if s.weight_decay else opt


def build_server_optimizer(config: Config) -> optax.GradientTransformation:
    """The server optimiser of ``algorithm.server_optimizer`` (its default is what the method's name
    implies)."""
    a = config.algorithm
    if a.server_optimizer == "sgd":
        return server_optimizers.fedavg_server(a.server_learning_rate)
    if a.server_optimizer == "momentum":
        return server_optimizers.fedavgm_server(a.server_learning_rate, a.server_momentum)
    if a.server_optimizer == "momentum_fedcog":
        return server_optimizers.fedcog_momentum_server(a.server_momentum)
    return server_optimizers.reddi_server(a.server_optimizer, a.server_learning_rate, a.beta1, a.beta2, a.tau)


def build_schedule(config: Config, dataset: FederatedDataset) -> LocalSchedule:
    """Local training: the budget, batch size and unroll of ``client`` and ``rounds``."""
    c = config.client
    return LocalSchedule(c.batch_size, c.local_steps, c.local_epochs, min_examples=dataset.min_examples,
                         unroll=config.rounds.unroll, drop_remainder=c.drop_remainder,
                         reshuffle=c.batch_order == "reshuffle")


def is_reference(config: Config) -> bool:
    """Whether ``algorithm.name`` is a reference run (centralised, or server data only), not FL."""
    return registry.REGISTRY[config.algorithm.name].reference


def build_algorithm(config: Config, classifier: models.Classifier, dataset: FederatedDataset,
                    key: jax.Array | None = None, structure: Config | None = None,
                    clients_at_once: int | None = None) -> Algorithm:
    """The algorithm of ``config.algorithm``: the FedAvg round with the components of the base method and of
    the component plug-ins, in the order listed, then wrapped by the wrapper plug-ins, in the order listed
    (each method's package under ``fedjax_lab/methods/``, found by its registry).

    ``config`` may hold arrays for its data fields (``hyperparams.with_values``); ``structure`` is the config
    that decides structure (default ``config``), and ``key`` the run's root key (default from
    ``config.seed``); ``clients_at_once`` is the builders'
    :attr:`~fedjax_lab.methods.registry.BuildContext.clients_at_once`.
    """
    structure = structure or config
    key = randomness.base_key(structure.seed) if key is None else key
    context = registry.BuildContext(config=structure, classifier=classifier, dataset=dataset,
                                    client_optimizer=build_client_optimizer(config, structure),
                                    schedule=build_schedule(structure, dataset), key=key, values=config,
                                    clients_at_once=clients_at_once)
    a = config.algorithm
    entries = [(registry.REGISTRY[m.name], m) for m in (a, *a.plugins)]
    components = [c for spec, m in entries if not spec.wrapper for c in spec.load_builder()(m, context)]
    if structure.privacy is not None:
        components = [privacy_component(config, structure, components, entries), *components]
    algorithm = component_round(classifier, context.client_optimizer, build_server_optimizer(config),
                                context.schedule, *components, weighting=a.weighting)
    for spec, m in entries:
        if spec.wrapper:
            algorithm = spec.load_builder()(m, context)(algorithm)
    return algorithm


def privacy_component(config: Config, structure: Config, components: list, entries: list):
    """DP-FedAvg's component for ``config.privacy`` (values possibly arrays; ``structure`` decides whether
    the clipping adapts), first in the round so that its noisy average is what the server steps on.

    Raises:
      ConfigError: the method's server reads more of the clients than their clipped updates.
    """
    from fedjax_lab.privacy import mechanism

    wrappers = [m.name for spec, m in entries if spec.wrapper]
    try:
        if wrappers:
            raise ValueError(f"the plug-in {wrappers[0]} changes the server's round as a whole, which the "
                             "noise does not cover")
        mechanism.check_composes(components)
    except ValueError as exc:
        raise ConfigError(f"privacy: {exc}") from None
    p, expected = config.privacy, float(structure.rounds.clients_per_round)
    adaptive = structure.privacy.adaptive
    return mechanism.dp_aggregation(
        clip_norm=p.clip_norm, noise_multiplier=p.noise_multiplier, expected_clients=expected,
        estimator=structure.privacy.estimator, target_quantile=p.adaptive_quantile if adaptive else None,
        clip_learning_rate=p.clip_learning_rate,
        count_noise=(p.count_noise if structure.privacy.count_noise is not None else expected / 20.0))


def make_algorithm_at(config: Config, classifier: models.Classifier, dataset: FederatedDataset,
                      clients_at_once: int | None = None) -> AlgorithmAt:
    """``algorithm_at(inputs, round)``: the algorithm built inside the compiled round from ``inputs.hparams``
    on their schedules at ``round`` and the run's key ``inputs.key``; ``config`` gives the structure."""

    def algorithm_at(inputs: RoundInputs, round_index) -> Algorithm:
        values = hyperparams.values_at(config, inputs.hparams, round_index)
        return build_algorithm(hyperparams.with_values(config, values), classifier, dataset, inputs.key,
                               config, clients_at_once)

    return algorithm_at

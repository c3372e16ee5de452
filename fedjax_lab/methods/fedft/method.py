"""Fed+FT: aggregate as the base method does, then fine-tune the aggregate on the server's data.

Feddle's in-domain baseline ("Fed+FT", also written "Fed+FL"): after every server step the global model takes
``steps`` Adam steps on batches of the server's in-domain data (its grid: lr 1e-5 to 1e-3, 1 to 20 epochs).

References:
  Zhu et al., "Unlocking the Value of Decentralized Data: A Federated Dual Learning Approach for Model
  Aggregation", Sec. 5 (baselines) and App. D.
"""

from __future__ import annotations

import jax
import optax

from fedjax_lab.engine.components import Component, ServerView
from fedjax_lab.engine.server_training import sample_server_batch, train_on_server_batches
from fedjax_lab.engine.types import LossFn
from fedjax_lab.engine.variables import merge_variables, split_variables


def server_finetune(loss_fn: LossFn, steps: int, learning_rate: float | jax.Array,
                    batch_size: int) -> Component:
    """After the server step, ``steps`` Adam steps on the server's data from the new global model (the
    optimiser starts afresh every round; model state follows the batches)."""
    draw = sample_server_batch(batch_size)

    def after_step(view: ServerView, variables):
        params, model_state = split_variables(variables)
        params, model_state = train_on_server_batches(
            lambda p, state, batch, key: loss_fn(merge_variables(p, state, variables), batch, key), params,
            model_state, draw=draw, arrays=view.context.server_arrays, key=view.context.key, steps=steps,
            optimizer=optax.adam(learning_rate))
        return (), merge_variables(params, model_state, variables), {}

    return Component("fedft", after_step=after_step)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fedft`` (or of a ``fedft`` plug-in)."""
    return (server_finetune(context.classifier.loss, config.steps, config.learning_rate, config.batch_size),)

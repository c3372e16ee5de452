"""How much memory a run needs and the device offers, for refusing a configuration before it compiles.

Two estimates, both per device:

* :func:`static_estimate`, from shapes alone (nothing compiled, nothing allocated): the loop state (the
  per-client state of the whole population dominates large populations), the round's inputs, the messages held
  at once (the whole cohort's when stacked, a chunk's when streamed) and the clients training at once.
* :func:`compiled_estimate`, XLA's memory analysis of the compiled block of rounds (arguments, outputs and
  temporaries), the figure that decides; used when the static one comes near the budget.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax

GiB = 2**30


def device_memory_bytes(device: jax.Device | None = None) -> int:
    """The memory of ``device`` (default the first): the accelerator's allocator limit, or the host's physical
    memory on CPU."""
    device = device or jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def tree_bytes(tree: Any) -> int:
    """Bytes of every array (or ``ShapeDtypeStruct``) in ``tree``."""
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "dtype"))


class StaticEstimate(NamedTuple):
    """Bytes a round needs on one device, from shapes.

    Attributes:
      client_states: the population's per-client state (``num_clients * per_client_state``).
      per_client_state: one client's state.
      server_and_inputs: the server state and the round's inputs (training arrays, index table).
      messages: the messages held at once: the cohort's share of a device when stacked, a chunk's when
        streamed.
      training: the clients training at once, counted as four copies of the model each (parameters, gradient,
        optimiser state, update), activations not included.
    """

    client_states: int
    per_client_state: int
    server_and_inputs: int
    messages: int
    training: int

    @property
    def total(self) -> int:
        return self.client_states + self.server_and_inputs + self.messages + self.training


def static_estimate(loop_state: Any, inputs: Any, message: Any, params: Any, num_clients: int,
                    messages_held: int, clients_training: int) -> StaticEstimate:
    """:class:`StaticEstimate` from the shapes of the loop state, the inputs, one message and the model."""
    client_states = tree_bytes(loop_state.client_states)
    return StaticEstimate(client_states, client_states // max(num_clients, 1),
                          tree_bytes(loop_state) - client_states + tree_bytes(inputs),
                          messages_held * tree_bytes(message), clients_training * 4 * tree_bytes(params))


def compiled_estimate(compiled: Any) -> int:
    """XLA's estimate for a compiled program: arguments, outputs and temporaries, less what outputs alias."""
    stats = compiled.memory_analysis()
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
               - stats.alias_size_in_bytes)


def describe(estimate: StaticEstimate) -> str:
    """The estimate as a line of GiB figures."""
    return (f"client states {estimate.client_states / GiB:.2f} GiB ({estimate.per_client_state / 2**20:.3f} "
            f"MiB a client), server and inputs {estimate.server_and_inputs / GiB:.2f} GiB, messages held "
            f"{estimate.messages / GiB:.2f} GiB, clients training {estimate.training / GiB:.2f} GiB")

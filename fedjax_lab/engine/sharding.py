"""Devices and hosts: the mesh the cohort is split over, JAX's distributed runtime, and reading results back.

Everything here is JAX's own machinery (``jax.sharding``, ``jax.shard_map``, ``jax.distributed``); there is no
process layer of ours. One process per host sees every device of every host in ``jax.devices()``; the cohort is
split over all of them (:func:`fedjax_lab.engine.cohort_loop.map_cohort`), the model and the server state are
replicated, and the aggregation is a ``psum`` across them. Every process runs the same program on the same
inputs (each builds the data itself), so no input needs scattering.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from fedjax_lab.engine.cohort_loop import CLIENTS


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> bool:
    """Joins JAX's distributed runtime when this is one of several processes, as JAX documents it.

    The settings come from the arguments or else from the environment (``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``); with none of them this is a single process and nothing is done.
    Returns whether the runtime is (now) initialised. Must run before anything touches a device.
    """
    address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
        num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    if process_id is None and os.environ.get("JAX_PROCESS_ID"):
        process_id = int(os.environ["JAX_PROCESS_ID"])
    if address is None and num_processes is None:
        return jax.distributed.is_initialized()
    if not jax.distributed.is_initialized():
        jax.distributed.initialize(coordinator_address=address, num_processes=num_processes, process_id=process_id)
    return True


def client_mesh(num_devices: int | None = None) -> Mesh:
    """A one-axis mesh named ``clients`` over the first ``num_devices`` of ``jax.devices()`` (every device of
    every process when ``None``).

    Raises:
      ValueError: more devices asked for than there are.
    """
    devices = jax.devices()
    num_devices = len(devices) if num_devices is None else num_devices
    if not 1 <= num_devices <= len(devices):
        raise ValueError(f"parallel.devices must be in [1, {len(devices)}] (the devices JAX sees: "
                         f"{len(devices)} {devices[0].platform}), got {num_devices}")
    return Mesh(np.array(devices[:num_devices]), (CLIENTS,))


def to_host(tree: Any) -> Any:
    """``jax.device_get`` that also reads arrays spanning other processes' devices: a replicated array from this
    process's copy, a sharded one gathered from every process (a collective: every process must call it)."""

    def get(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return jax.device_get(x)
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(get, tree)

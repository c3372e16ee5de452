"""Devices and hosts: the mesh the cohort is split over, JAX's distributed runtime, and reading results back.

Everything here is JAX's own machinery (``jax.sharding``, ``jax.shard_map``, ``jax.distributed``); there is no
process layer of ours. One process per host sees every device of every host in ``jax.devices()``; the cohort
is split over all of them (:func:`fedjax_lab.engine.cohort_loop.map_cohort`), the model and the server state
are replicated, and the aggregation is a ``psum`` across them. Every process runs the same program on the same
inputs (each builds the data itself), so no input needs scattering.
"""

from __future__ import annotations

import mmap
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_lab.engine.cohort_loop import CLIENTS


class StartupError(RuntimeError):
    """The processes of a distributed run did not all meet within the start-up timeout."""


def initialize_distributed(coordinator_address: str, host: str, port: int, num_processes: int,
                           process_id: int, timeout_s: float = 300.0,
                           log: Callable[[str], None] | None = None) -> None:
    """Joins JAX's distributed runtime as process ``process_id`` of ``num_processes``, the coordinator
    (process 0) at ``coordinator_address`` (``host:port``, IPv6 hosts in brackets). Must run before anything
    touches a device; does nothing when already joined.

    The processes first meet in :func:`rendezvous`, so a coordinator that cannot be reached, or processes that
    never start, end in a :class:`StartupError` after ``timeout_s`` instead of JAX's abort of the whole
    process.
    """
    if jax.distributed.is_initialized():
        return
    remaining = rendezvous(host, port, num_processes, process_id, timeout_s, log)
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, initialization_timeout=max(int(remaining), 30))


_HELLO, _GO, _ACK = "fedjax-lab hello", "go", "ok"
_HELLO_TIMEOUT_S = 5.0  # a connection that says nothing this long is not one of ours


def rendezvous(host: str, port: int, num_processes: int, process_id: int, timeout_s: float,
               log: Callable[[str], None] | None = None) -> float:
    """Waits until all ``num_processes`` processes have started: process 0 listens at ``host:port`` (the port
    JAX's coordinator takes next) until every other process has said hello, tells them all to go and waits for
    each to acknowledge. Returns the seconds left of ``timeout_s``.

    Raises:
      StartupError: the port cannot be listened on, the coordinator's host is unknown or cannot be reached, or
        not every process arrived (and answered) within ``timeout_s``; the message says which, and where.
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    deadline = time.monotonic() + timeout_s
    where = f"{host}:{port}"
    try:
        if process_id == 0:
            _gather(port, num_processes, deadline, where, timeout_s, log)
        else:
            _report(host, port, num_processes, process_id, deadline, where, timeout_s, log)
    except (OSError, ValueError) as exc:  # a peer gone mid-conversation, or one that spoke garbage
        raise StartupError(f"the processes' start-up at {where} failed "
                           f"({type(exc).__name__}: {exc})") from None
    return deadline - time.monotonic()


def _readline(peer: socket.socket, timeout: float) -> str:
    peer.settimeout(max(timeout, 0.001))
    with peer.makefile() as stream:
        return stream.readline().strip()


def _gather(port: int, num_processes: int, deadline: float, where: str, timeout_s: float, log) -> None:
    try:
        server = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True) \
            if socket.has_dualstack_ipv6() else socket.create_server(("", port))
    except OSError as exc:
        raise StartupError(f"process 0 cannot listen at {where} ({exc.strerror or exc}): is another run "
                           "using the port, or is this not the coordinator's host?") from None
    log(f"fedjax-lab: process 0 of {num_processes}: waiting for the other {num_processes - 1} at {where} "
        f"(up to {timeout_s:g} s, parallel.init_timeout_s)")
    joined: dict[int, socket.socket] = {}
    try:
        with server:
            while len(joined) < num_processes - 1:
                server.settimeout(max(deadline - time.monotonic(), 0.001))
                try:
                    peer, _ = server.accept()
                except TimeoutError:
                    missing = sorted(set(range(1, num_processes)) - set(joined))
                    raise StartupError(f"processes {missing} did not reach the coordinator at {where} within "
                                       f"{timeout_s:g} s (parallel.init_timeout_s); start each with the same "
                                       "config and its parallel.process_id") from None
                try:
                    words = _readline(peer, min(_HELLO_TIMEOUT_S, deadline - time.monotonic())).split()
                except OSError:
                    words = []
                if words[:2] != _HELLO.split() or len(words) != 4 or not (words[2] + words[3]).isdigit():
                    peer.close()  # not one of ours: a port scanner, a health check, a stale client
                    continue
                index, count = int(words[2]), int(words[3])
                if count != num_processes or index in joined or not 0 < index < num_processes:
                    peer.sendall(f"error process 0 expects {num_processes} processes with ids "
                                 f"1..{num_processes - 1} once each\n".encode())
                    peer.close()
                    raise StartupError(f"process {index} reached {where} expecting {count} processes, or its "
                                       f"id was taken; process 0 expects {num_processes} with ids "
                                       f"0..{num_processes - 1}")
                joined[index] = peer
        for peer in joined.values():
            peer.sendall(f"{_GO}\n".encode())
        for index, peer in sorted(joined.items()):
            if _readline(peer, max(deadline - time.monotonic(), _HELLO_TIMEOUT_S)) != _ACK:
                raise StartupError(f"process {index} left before the start at {where} (its "
                                   "parallel.init_timeout_s ran out first?); start them all again")
    finally:
        for peer in joined.values():
            peer.close()


def _report(host: str, port: int, num_processes: int, process_id: int, deadline: float, where: str,
            timeout_s: float, log) -> None:
    log(f"fedjax-lab: process {process_id} of {num_processes}: waiting for the coordinator at {where} "
        f"(up to {timeout_s:g} s, parallel.init_timeout_s)")
    while True:
        try:
            peer = socket.create_connection((host, port),
                                            timeout=max(min(deadline - time.monotonic(), 5), 0.001))
            break
        except socket.gaierror as exc:
            raise StartupError(f"the coordinator's host {host!r} is unknown ({exc.strerror or exc}); check "
                               "parallel.coordinator_address") from None
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise StartupError(f"the coordinator at {where} could not be reached within {timeout_s:g} s "
                                   f"(parallel.init_timeout_s; last: {exc.strerror or exc}); start process 0 "
                                   "there, or check parallel.coordinator_address") from None
            time.sleep(0.2)
    with peer:
        peer.sendall(f"{_HELLO} {process_id} {num_processes}\n".encode())
        try:
            answer = _readline(peer, deadline - time.monotonic())
        except OSError:
            answer = ""
        if answer == _GO:
            peer.sendall(f"{_ACK}\n".encode())
            return
    raise StartupError(f"the coordinator at {where} refused process {process_id}: {answer[6:]}" if
                       answer.startswith("error") else
                       f"the coordinator at {where} did not let process {process_id} start within "
                       f"{timeout_s:g} s (parallel.init_timeout_s): not every process arrived")


CPU_DEVICES_ENV = "FEDJAX_LAB_CPU_DEVICES"
"""The environment variable that sets how many devices :func:`use_cpu_cores` gives the CPU (default: its
cores)."""


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def use_cpu_cores(count: int | None = None) -> int | None:
    """Gives JAX's CPU backend ``count`` devices (default ``$FEDJAX_LAB_CPU_DEVICES``, else one per core of
    :func:`available_cores`), so that a cohort split over them (``parallel.devices: auto``) keeps every core
    busy: XLA's CPU client runs each device's share on threads of its own, where one device spreads only the
    inside of each operation over the cores, which small models leave mostly idle (on 2 cores the MNIST MLP's
    round ran 2.1x faster split over two, docs/scale.md).

    Returns the count set, or ``None`` where nothing was changed: JAX has started its backends (the count is
    fixed at start-up), or the count is set already (``jax_num_cpu_devices``, or
    ``--xla_force_host_platform_device_count`` in ``$XLA_FLAGS``). Accelerator backends are not affected.
    The command line calls it before building a run; a notebook calls it right after ``import jax``.
    """
    from jax._src import xla_bridge

    if (xla_bridge.backends_are_initialized() or jax.config.jax_num_cpu_devices > 0
            or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")):
        return None
    if count is None:
        text = os.environ.get(CPU_DEVICES_ENV) or str(available_cores())
        count = int(text) if text.isdigit() else 0
        if count < 1:
            raise ValueError(f"${CPU_DEVICES_ENV} must be a positive number of devices, got {text!r}")
    jax.config.update("jax_num_cpu_devices", count)
    return count


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


HUGE_PAGE = 2 << 20
"""Bytes of a transparent huge page on x86-64 Linux."""
HUGE_PAGE_MIN_BYTES = HUGE_PAGE
"""Training arrays of at least this many bytes go onto huge pages on a CPU (:func:`place_training_arrays`)."""


def on_huge_pages(array: np.ndarray) -> np.ndarray:
    """A read-only copy of ``array`` in private anonymous memory, aligned to :data:`HUGE_PAGE` and advised
    for transparent huge pages (``madvise(MADV_HUGEPAGE)``, which Linux honours unless its THP setting is
    ``never``). Where the platform has no such advice, a plain copy."""
    array = np.ascontiguousarray(array)
    if not hasattr(mmap, "MADV_HUGEPAGE") or array.nbytes == 0:
        copy = array.copy()
    else:
        region = mmap.mmap(-1, array.nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.madvise(mmap.MADV_HUGEPAGE)
        raw = np.frombuffer(region, np.uint8)  # keeps ``region`` alive as long as the array lives
        start = -raw.ctypes.data % HUGE_PAGE
        copy = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
        copy[...] = array
    copy.flags.writeable = False
    return copy


def place_training_arrays(arrays: dict[str, np.ndarray], mesh: Mesh | None) -> dict[str, jax.Array]:
    """The pooled training arrays on the devices that train (every device of ``mesh``, replicated; else the
    default device).

    Every local step gathers a batch of rows at random from these arrays. With ordinary 4 KiB pages each row
    of a large image set costs a TLB miss, dearer still under a virtual machine's nested paging: on a 2-core
    Intel VM the gather of a CIFAR-10 batch of 64 took 1.1 ms of the simple-CNN's 6.2 ms training step, and
    0.1 ms from huge pages (docs/benchmarks.md). So on a CPU backend (one process) each array of at least
    :data:`HUGE_PAGE_MIN_BYTES` is copied once onto transparent huge pages (:func:`on_huge_pages`), and every
    device reads that one copy: XLA's CPU client aliases an aligned, read-only host array instead of copying
    it, so two CPU devices also hold one copy of the training set, not two. Elsewhere the arrays are put on
    the devices as they are.
    """
    if jax.process_count() > 1:  # each process passes its own host-local copy
        return jax.device_put(arrays)
    devices = list(mesh.devices.flat) if mesh is not None else None
    if jax.default_backend() != "cpu":
        return jax.device_put(arrays, NamedSharding(mesh, PartitionSpec()) if mesh is not None else None)

    def place(array):
        host = np.asarray(array)
        if host.nbytes >= HUGE_PAGE_MIN_BYTES:
            host = on_huge_pages(host)
        if devices is None:
            return jax.device_put(host)
        return jax.make_array_from_single_device_arrays(
            host.shape, NamedSharding(mesh, PartitionSpec()), [jax.device_put(host, d) for d in devices])

    return {name: place(array) for name, array in arrays.items()}


def to_host(tree: Any) -> Any:
    """``jax.device_get`` that also reads arrays spanning other processes' devices: a replicated array from
    this process's copy, a sharded one gathered from every process (a collective: every process must call
    it)."""

    def get(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return jax.device_get(x)
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(get, tree)

"""How much memory the device offers, for refusing a configuration before it compiles."""

from __future__ import annotations

import os

import jax


def device_memory_bytes(device: jax.Device | None = None) -> int:
    """The memory of ``device`` (default the first): the accelerator's allocator limit, or the host's physical
    memory on CPU."""
    device = device or jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

"""The one place tputool builds a `jax.sharding.Mesh` (the sharding API, `tputool.tune` and `torch.tpu` call it).

`build_mesh` lays devices out on a grid of a given shape and names its axes; `axis_mesh` is the
data/fsdp/tensor mesh of the sharding API and the tuner, from a dict of axis sizes. JAX is imported
when a mesh is built, so importing this module stays cheap (the CLI imports tune before JAX may start).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tputool.errors import UserError

if TYPE_CHECKING:
    from jax.sharding import Mesh

AXES = ("data", "fsdp", "tensor")
"""Mesh axis names, outermost first: data parallel, fully-sharded data parallel, tensor parallel."""


def build_mesh(shape: Sequence[int], axis_names: Sequence[str], devices: Sequence[Any] | None = None, *,
               topology: bool = True, fallback: bool = True) -> Mesh:
    """A Mesh of `shape` with `axis_names` over `devices` (default: all JAX devices).

    `topology`: order the devices as the physical topology (jax's mesh_utils, which matters on TPU); when
    that layout fails, `fallback` uses `devices` in the given order, else its error propagates.
    `topology=False`: the given order.
    """
    import jax
    import numpy as np
    from jax.experimental import mesh_utils

    shape = tuple(shape)
    devs = list(devices) if devices is not None else jax.devices()
    if not topology:
        return jax.sharding.Mesh(np.asarray(devs, dtype=object).reshape(shape), tuple(axis_names))
    try:
        grid = mesh_utils.create_device_mesh(shape, devs)
    except (AssertionError, ValueError, NotImplementedError):
        if not fallback:
            raise
        grid = np.asarray(devs, dtype=object).reshape(shape)
    return jax.sharding.Mesh(grid, tuple(axis_names))


def axis_mesh(axis_sizes: Mapping[str, int] | None = None, devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh over `devices` (default: all JAX devices) with axes data/fsdp/tensor of `axis_sizes`.

    Missing axes get size 1, except that with no sizes at all every device goes to "data". The device
    order follows the physical topology on TPU (jax's mesh_utils); sizes must multiply to the device count.
    """
    import math

    import jax

    devs = list(devices) if devices is not None else jax.devices()
    sizes = dict(axis_sizes or {"data": len(devs)})
    unknown = set(sizes) - set(AXES)
    if unknown:
        raise UserError(f"unknown mesh axes {sorted(unknown)} (axes are {', '.join(AXES)})")
    shape = tuple(int(sizes.get(a, 1)) for a in AXES)
    if math.prod(shape) != len(devs):
        raise UserError(f"mesh {dict(zip(AXES, shape, strict=True))} needs {math.prod(shape)} devices, "
                        f"there are {len(devs)}")
    return build_mesh(shape, AXES, devs)

"""Helpers for lowerings: PyTorch's dtype rules evaluated on JAX values (at trace time, cached)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes

from tputool.backend import dtypes

__all__ = ["KIND", "describe", "promote", "np_dtype", "torch_dtype", "is_python_scalar", "cast", "default_float"]


def is_python_scalar(x) -> bool:
    """True for a Python number or a weakly-typed 0-d JAX value (a Scalar argument inside jit)."""
    if isinstance(x, bool | int | float | complex):
        return True
    return jax.typeof(x).weak_type if hasattr(x, "dtype") else False


def describe(x):
    """A hashable description of an argument for the dtype rules."""
    if x is None:
        return None
    if isinstance(x, bool):
        return ("s", "b")
    if isinstance(x, int):
        return ("s", "i")
    if isinstance(x, float):
        return ("s", "f")
    if isinstance(x, complex):
        return ("s", "c")
    aval = jax.typeof(x)
    if aval.weak_type:
        k = jnp.dtype(aval.dtype).kind
        return ("s", {"b": "b", "i": "i", "u": "i", "f": "f", "c": "c"}[k])
    return ("t", jnp.dtype(aval.dtype), len(aval.shape) > 0)


_SAMPLE = {"b": True, "i": 1, "f": 1.0, "c": 1j}


@functools.cache
def _promote(kind: KIND, descs: tuple) -> tuple[np.dtype, np.dtype]:
    samples = []
    for d in descs:
        if d is None:
            continue
        if d[0] == "s":
            samples.append(_SAMPLE[d[1]])
        else:
            samples.append(torch.empty((1,) if d[2] else (), dtype=dtypes.to_torch(d[1]), device="meta"))
    comp, res = elementwise_dtypes(*samples, type_promotion_kind=kind)
    return dtypes.to_np(comp), dtypes.to_np(res)


def promote(kind: KIND, *args) -> tuple[np.dtype, np.dtype]:
    """(computation dtype, result dtype) PyTorch uses for an elementwise op on `args`."""
    return _promote(kind, tuple(describe(a) for a in args))


def np_dtype(dt: torch.dtype | None):
    """The NumPy dtype of a torch dtype argument (None stays None)."""
    return None if dt is None else dtypes.to_np(dt)


def torch_dtype(x) -> torch.dtype:
    """The torch dtype of a JAX value."""
    return dtypes.to_torch(jnp.dtype(x.dtype))


def default_float() -> np.dtype:
    """torch.get_default_dtype() as a NumPy dtype."""
    return dtypes.to_np(torch.get_default_dtype())


def cast(x, dt):
    """`x` as dtype `dt`: JAX arrays via astype, Python scalars left as they are (weak)."""
    if isinstance(x, bool | int | float | complex) or x is None:
        return x
    return x if x.dtype == dt else x.astype(dt)

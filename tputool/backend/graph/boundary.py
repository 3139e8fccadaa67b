"""Crossing between torch tensors and JAX arrays at the edge of a compiled graph.

`tpu` tensors are unwrapped to the backend's own JAX array (no copy) and outputs wrapped back into
`tpu` tensors; CPU tensors (used when a graph is compiled for CPU inputs, e.g. in tests) cross through
numpy. The RNG key for graphs with random ops comes from the backend's generator.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import jax
import torch

from tputool.backend import runtime
from tputool.backend import tensor as tt

_FUSED = runtime.EagerMode.DEFER_AND_FUSE
_increment_version = torch.autograd.graph.increment_version


def device_type_of(values: Sequence[Any]) -> str:
    """`tpu` if any tensor among `values` (real or fake) lives on the tpu device, else `cpu`."""
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type == "tpu":
            return "tpu"
    return "cpu"


def output_devices(gm: Any, default: str) -> tuple[str, ...]:
    """The device type of each output of FX graph `gm` (its fake values' devices; `default` where unknown):
    a graph on tpu inputs may also return CPU tensors computed from CPU inputs alone (Dynamo has already
    refused a CPU tensor with elements meeting a tpu tensor), and those stay on CPU, as on CUDA."""
    for node in gm.graph.nodes:
        if node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, list | tuple) else (outs,)
            return tuple(_device_of_node(o, default) for o in outs)
    return ()


def _device_of_node(node: Any, default: str) -> str:
    val = getattr(node, "meta", {}).get("val")
    return val.device.type if isinstance(val, torch.Tensor) and val.device.type in ("tpu", "cpu") else default


def to_jax(t: Any) -> Any:
    """The JAX array behind tensor `t` (tpu: the backend's array; cpu: a host copy); non-tensors pass through."""
    if not isinstance(t, torch.Tensor):
        return t
    if runtime.STATE.mode is _FUSED:  # a deferred value must be computed before a graph reads it
        from tputool.backend.fused import materialize

        materialize(t, "compiled graph input")  # (a no-op for tensors without tpu data)
    try:
        return tt.to_jax(t)
    except AttributeError:  # no `_tpu` on the storage: not a tpu tensor with data
        if t.device.type == "cpu":
            return tt.cpu_to_jax(t, count=False)
        raise TypeError(f"a compiled tpu graph got a {t.device.type} tensor that holds no data") from None


_EXCLUSIVE_REFS = 4  # the storage attribute, the caller list, this function argument, getrefcount argument


def donatable(t: torch.Tensor, value: jax.Array) -> bool:
    """True when `value` is `t`'s whole buffer and nothing else holds it, so a computation may reuse it."""
    st = t.untyped_storage()
    return getattr(st, "_tpu", None) is value and sys.getrefcount(value) <= _EXCLUSIVE_REFS


def write_back(targets: Sequence[torch.Tensor], values: Sequence[jax.Array]) -> None:
    """Store a compiled graph's new values of inputs `targets` into them, as in-place ops would (versions bumped)."""
    bumped = []
    try:
        for t, value in zip(targets, values, strict=True):
            if hasattr(t.untyped_storage(), "_tpu"):
                tt.track(value)  # (synchronize waits for it)
                tt.write(t, value)
                bumped.append(t)
            else:
                with torch.no_grad():
                    t.copy_(tt.jax_to_cpu(value, count=False))  # copy_ bumps the version itself
    finally:
        if bumped:
            _increment_version(bumped)


def from_jax(a: Any, device_type: str) -> Any:
    """A torch tensor on `device_type` holding JAX array `a`; non-arrays (sizes, None) pass through.
    A tpu output is tracked as in flight, so `torch.tpu.synchronize()` waits for the graph that computes it."""
    if not isinstance(a, jax.Array):
        return a
    if device_type == "tpu":
        tt.track(a)
        return tt.from_jax(a)
    return tt.jax_to_cpu(a, count=False)


def next_rng_words() -> Any:
    """The next draw of the backend's random stream (seeded by `torch.manual_seed`), as key words."""
    from tputool.backend import rng

    return rng.next_words()


def key_from_words(words: Any) -> jax.Array:
    """The `jax.random` key for `next_rng_words()`'s output; traceable."""
    from tputool.backend import rng

    return rng.key_from_words(words)

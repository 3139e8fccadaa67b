"""CPU fallback for ops the tpu backend cannot lower: copy to CPU, run PyTorch's CPU kernel, copy back.

Warns once per op and records a "fallback" event each time. `TPUTOOL_FALLBACK=error` makes it raise
`NotImplementedError` naming the op instead (use it to prove a model runs entirely on the device).
In-place and out= arguments are written back into the original tpu tensors (resized if the CPU kernel
resized them); tpu devices among the arguments (factory ops) become `cpu` for the CPU call. A random op draws
from a CPU generator seeded from the tpu stream its `generator=` names (the default one for None:
`rng.cpu_generator`), so tpu seeds govern it as they govern the tpu kernels.
"""

from __future__ import annotations

import os
import warnings

import torch
from torch.utils._pytree import tree_map

from tputool.backend import events, rng
from tputool.backend import tensor as tt
from tputool.backend.op_plan import HOST_DRAWN

_warned: set[str] = set()
_generator_pos: dict[torch._ops.OpOverload, int | None] = {}
"""Op -> the schema position of its `generator` argument (None: it has none)."""


class FallbackError(NotImplementedError):
    """Raised under TPUTOOL_FALLBACK=error when an op would run on CPU."""


def _is_tpu(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "tpu"


def announce(op: torch._ops.OpOverload, what: str = "") -> None:
    """Before `op` runs on CPU: refuse under TPUTOOL_FALLBACK=error, else record the event and warn once per op."""
    name = str(op)
    if os.environ.get("TPUTOOL_FALLBACK", "") == "error":
        raise FallbackError(f"tpu backend: no tpu kernel for {name}{what} (TPUTOOL_FALLBACK=error forbids the "
                            "CPU fallback)")
    events.record("fallback", name)
    if op in HOST_DRAWN:  # (a random op drawn by the CPU generator on purpose: TPUTOOL_RANDOM=host)
        return
    if name not in _warned:
        _warned.add(name)
        file, line = events.user_location()
        warnings.warn_explicit(f"tpu backend: {name} has no tpu kernel{what}; it runs on CPU (copies to host and "
                               "back). This warning is shown once per op.", RuntimeWarning, file, line)


def run_on_cpu(op: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """Run `op` on CPU copies of its tpu arguments and bring the results back (see module doc)."""
    announce(op)
    check_devices(op, args, kwargs)
    written = _written_args(op, args, kwargs)
    copies: dict[int, torch.Tensor] = {}

    def to_cpu(x):
        if _is_tpu(x):
            c = tt.to_cpu(x, "fallback")
            if id(x) in written:  # the CPU kernel may resize it: needs torch-owned storage
                c = c.clone()
            copies[id(c)] = x
            return c
        if isinstance(x, torch.device) and x.type == "tpu":
            return torch.device("cpu")
        return x

    c_args = tree_map(to_cpu, args)
    c_kwargs = tree_map(to_cpu, kwargs)
    g = _generator_of(op)
    if g is not None:
        if g < len(c_args):
            c_args = (*c_args[:g], rng.cpu_generator(c_args[g]), *c_args[g + 1:])
        else:
            c_kwargs["generator"] = rng.cpu_generator(c_kwargs.get("generator"))
    if "device" in c_kwargs and isinstance(c_kwargs["device"], str) and c_kwargs["device"].startswith("tpu"):
        c_kwargs["device"] = "cpu"
    out = op(*c_args, **c_kwargs)
    # Write mutated arguments back.
    back: dict[int, torch.Tensor] = {}
    for c in _flat_tensors((c_args, c_kwargs)):
        orig = copies.get(id(c))
        if orig is not None and id(orig) in written:
            if tuple(orig.shape) != tuple(c.shape):
                tt.resize(orig, c.shape)
            tt.write(orig, tt.cpu_to_jax(c.to(orig.dtype)))
            back[id(c)] = orig

    def to_tpu(x):
        if isinstance(x, torch.Tensor):
            if id(x) in back:
                return back[id(x)]
            if id(x) in copies and id(copies[id(x)]) in written:
                return copies[id(x)]
            if x.device.type == "cpu":
                return tt.from_jax(tt.cpu_to_jax(x))
        return x

    return tree_map(to_tpu, out)


def _generator_of(op: torch._ops.OpOverload) -> int | None:
    """The schema position of `op`'s `generator` argument (None: it draws nothing, or has no such argument)."""
    g = _generator_pos.get(op, -1)
    if g == -1:
        g = _generator_pos[op] = next((i for i, a in enumerate(op._schema.arguments) if a.name == "generator"), None)
    return g


def _flat_tensors(tree) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def check_devices(op, args, kwargs) -> None:
    """Raise PyTorch's mixed-device error when a CPU tensor with elements meets a tpu tensor among `op`'s
    operands (the CPU kernel would silently accept it), except in the op's host operands (indices, lengths)."""
    from tputool.backend.op_plan import plan

    host = plan(op).host_args
    on_tpu = on_cpu = False
    for i, a in enumerate(op._schema.arguments):
        if i in host:
            continue
        for t in _flat_tensors(args[i] if i < len(args) else kwargs.get(a.name)):
            if t.device.type == "tpu":
                on_tpu = True
            elif t.device.type == "cpu" and t.dim() > 0:
                on_cpu = True
    if on_tpu and on_cpu:
        raise tt.mixed_devices()


def _written_args(op, args, kwargs) -> set[int]:
    """ids of the tensors the op writes (in-place self, out= tensors)."""
    ids: set[int] = set()
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
            for t in _flat_tensors(v):
                ids.add(id(t))
    return ids


class CpuOp:
    """Handler that always takes the CPU fallback."""

    def __init__(self, op: torch._ops.OpOverload) -> None:
        self.op = op

    def __call__(self, args: tuple, kwargs: dict):
        return run_on_cpu(self.op, args, kwargs)

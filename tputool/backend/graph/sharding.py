"""SPMD sharding for tpu tensors: a named device mesh, partition specs on tensors, activation constraints.

A tpu tensor's data is a JAX array, so sharding it is placing that array with a `NamedSharding`; every
compiled graph (torch.compile backend "tpu") and every eager op then runs SPMD, partitioned by XLA from the
input shardings. Data parallelism, FSDP and tensor parallelism are all expressed as shardings:

    mesh = topology_aware_mesh({"data": 2, "fsdp": 2, "tensor": 2})   # tputool.mesh.axis_mesh
    shard_model(model, mesh, FSDP_RULES)            # parameters (and so their grads and optimizer state)
    x = mark_sharding(x.to("tpu"), mesh, BATCH)     # inputs split over data x fsdp
    y = sharding_constraint(h, mesh, ("data", None, "tensor"))   # inside a model: an activation constraint

Axis names in a spec are mesh axes or None (replicated); a dim may also name a tuple of axes. Rules and
rule tables (`Rule`, `FSDP_RULES`, `spec_for`, ...) are `tputool.partition`'s, shared with `tputool.tune`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import jax
import numpy as np
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tputool.errors import UserError
from tputool.mesh import AXES as AXES  # the sharding API's mesh axis names
from tputool.mesh import axis_mesh as topology_aware_mesh  # noqa: F401 - the sharding API's public name (docs/graph-mode.md)
from tputool.partition import BATCH_AXES, Rule, Spec, spec_for
from tputool.partition import FSDP_RULES as FSDP_RULES  # re-exported rule tables (docs/graph-mode.md)
from tputool.partition import LLAMA_TP_RULES as LLAMA_TP_RULES
from tputool.partition import REPLICATED_RULES as REPLICATED_RULES

BATCH: Spec = (BATCH_AXES,)
"""Inputs: the batch dim split over data x fsdp, everything else replicated."""


def named_sharding(mesh: Mesh, spec: Spec, ndim: int) -> NamedSharding:
    """The NamedSharding of `spec` (padded with None to `ndim` dims) on `mesh`."""
    spec = tuple(spec)
    if len(spec) > ndim:
        raise UserError(f"partition spec {spec} has more dims than the tensor ({ndim})")
    for s in spec:
        for name in (s if isinstance(s, tuple) else (s,)):
            if name is not None and name not in mesh.axis_names:
                raise UserError(f"partition spec names axis '{name}', mesh axes are {mesh.axis_names}")
    return NamedSharding(mesh, PartitionSpec(*spec, *([None] * (ndim - len(spec)))))


def _check_divisible(shape: Sequence[int], sharding: NamedSharding) -> None:
    for dim, s in enumerate(sharding.spec):
        names = s if isinstance(s, tuple) else (s,)
        n = int(np.prod([sharding.mesh.shape[a] for a in names if a is not None]))
        if shape[dim] % n:
            raise UserError(f"dim {dim} of size {shape[dim]} does not divide over mesh axes {names} ({n} devices)")


def mark_sharding(t: torch.Tensor, mesh: Mesh, spec: Spec) -> torch.Tensor:
    """Place tpu tensor `t`'s data with `spec` on `mesh`, in place (parameters keep their identity); returns `t`."""
    from tputool.backend import tensor as tt

    if t.device.type != "tpu":
        raise UserError(f"mark_sharding needs a tpu tensor, got one on {t.device}")
    sharding = named_sharding(mesh, spec, t.dim())
    _check_divisible(tuple(t.shape), sharding)
    arr = tt.to_jax(t)
    tt.write(t.detach(), jax.device_put(arr, sharding))
    from tputool.backend.runtime import STATE

    if STATE.abstract is not None:  # (diagnose --target: the step's program takes this state so placed)
        STATE.abstract.placed(t, sharding)
    return t


def sharding_of(t: torch.Tensor) -> jax.sharding.Sharding:
    """The JAX sharding of tpu tensor `t`'s data."""
    from tputool.backend import tensor as tt

    return tt.to_jax(t).sharding


def shard_params(model: torch.nn.Module, mesh: Mesh, specs: Mapping[str, Spec]) -> dict[str, Spec]:
    """Place every parameter and buffer of tpu `model` with its entry of `specs` (absent: replicated);
    returns name -> spec."""
    placed = {}
    for name, p in [*model.named_parameters(), *model.named_buffers()]:
        spec = specs.get(name, ())
        mark_sharding(p, mesh, spec)
        placed[name] = spec
    return placed


def shard_model(model: torch.nn.Module, mesh: Mesh, rules: Iterable[Rule] = FSDP_RULES) -> dict[str, Spec]:
    """Shard every parameter and buffer of tpu `model` by `rules` (first match wins); returns name -> spec."""
    rules = tuple(rules)
    return shard_params(model, mesh, {name: spec_for(name, tuple(p.shape), rules, mesh)
                                      for name, p in [*model.named_parameters(), *model.named_buffers()]})


# ---- activation constraints inside compiled graphs (and eager) --------------------------------

_MESHES: list[Mesh] = []


def _mesh_id(mesh: Mesh) -> int:
    for i, m in enumerate(_MESHES):
        if m is mesh or m == mesh:
            return i
    _MESHES.append(mesh)
    return len(_MESHES) - 1


def _encode(spec: Spec) -> str:
    return ";".join("" if s is None else ",".join(s) if isinstance(s, tuple) else s for s in spec)


def _decode(text: str) -> tuple:
    if not text:
        return ()
    return tuple(None if p == "" else tuple(p.split(",")) if "," in p else p for p in text.split(";"))


@torch.library.custom_op("tputool::sharding_constraint", mutates_args=())
def _constraint_op(x: torch.Tensor, mesh_id: int, spec: str) -> torch.Tensor:
    return x.clone()


@_constraint_op.register_fake
def _(x: torch.Tensor, mesh_id: int, spec: str) -> torch.Tensor:
    return torch.empty_like(x)


def _constraint_backward(ctx, grad: torch.Tensor) -> tuple:
    return torch.ops.tputool.sharding_constraint(grad, ctx.mesh_id, ctx.spec), None, None


def _setup(ctx, inputs: tuple, output: torch.Tensor) -> None:
    ctx.mesh_id, ctx.spec = inputs[1], inputs[2]


_constraint_op.register_autograd(_constraint_backward, setup_context=_setup)


@dataclass(frozen=True)
class Constraint:
    """A reusable activation constraint; build it outside the model's forward, call it inside (Dynamo-friendly:
    only an int and a string reach the traced code)."""

    mesh_id: int
    spec: str

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x` constrained to this sharding."""
        return torch.ops.tputool.sharding_constraint(x, self.mesh_id, self.spec)


def constraint(mesh: Mesh, spec: Spec) -> Constraint:
    """A `Constraint` for `spec` on `mesh` (jax.lax.with_sharding_constraint in compiled graphs; grads too)."""
    for s in spec:
        for name in (s if isinstance(s, tuple) else (s,)):
            if name is not None and name not in mesh.axis_names:
                raise UserError(f"partition spec names axis '{name}', mesh axes are {mesh.axis_names}")
    return Constraint(_mesh_id(mesh), _encode(spec))


def sharding_constraint(x: torch.Tensor, mesh: Mesh, spec: Spec) -> torch.Tensor:
    """`x` constrained to `spec` on `mesh`, for eager code; inside a torch.compile'd forward use `constraint()`."""
    return constraint(mesh, spec)(x)


def _lower_constraint(x: jax.Array, mesh_id: int, spec: str) -> jax.Array:
    sharding = named_sharding(_MESHES[mesh_id], _decode(spec), x.ndim)
    return jax.lax.with_sharding_constraint(x, sharding)


def register_lowerings() -> None:
    """Add the constraint op to LOWERINGS (eager dispatch and compiled graphs both read it)."""
    from tputool.backend.lowerings import lowering

    lowering(torch.ops.tputool.sharding_constraint.default)(_lower_constraint)


register_lowerings()

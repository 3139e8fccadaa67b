"""SPMD sharding for tpu tensors: a named device mesh, partition specs on tensors, activation constraints.

A tpu tensor's data is a JAX array, so sharding it is placing that array with a `NamedSharding`; every
compiled graph (torch.compile backend "tpu") and every eager op then runs SPMD, partitioned by XLA from the
input shardings. Data parallelism, FSDP and tensor parallelism are all expressed as shardings:

    mesh = topology_aware_mesh({"data": 2, "fsdp": 2, "tensor": 2})   # tputool.mesh.axis_mesh
    shard_model(model, mesh, FSDP_RULES)            # parameters (and so their grads and optimizer state)
    x = mark_sharding(x.to("tpu"), mesh, BATCH)     # inputs split over data x fsdp
    y = sharding_constraint(h, mesh, ("data", None, "tensor"))   # inside a model: an activation constraint

Axis names in a spec are mesh axes or None (replicated); a dim may also name a tuple of axes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import jax
import numpy as np
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tputool.errors import UserError
from tputool.mesh import AXES as AXES  # the sharding API's mesh axis names
from tputool.mesh import axis_mesh as topology_aware_mesh  # noqa: F401 - the sharding API's public name (README)

Spec = Sequence[str | tuple[str, ...] | None]

BATCH: Spec = (("data", "fsdp"),)
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
    return t


def sharding_of(t: torch.Tensor) -> jax.sharding.Sharding:
    """The JAX sharding of tpu tensor `t`'s data."""
    from tputool.backend import tensor as tt

    return tt.to_jax(t).sharding


@dataclass(frozen=True)
class Rule:
    """Parameters whose name matches `pattern` (re.search) and with `ndim` dims (None: any) get `spec`."""

    pattern: str
    spec: Spec
    ndim: int | None = None


REPLICATED_RULES: tuple[Rule, ...] = (Rule(r".*", ()),)
"""Data parallel: every parameter replicated (grads are all-reduced by XLA over the batch axes)."""

FSDP_RULES: tuple[Rule, ...] = (Rule(r".*", ("fsdp",), ndim=2), Rule(r".*", ()))
"""FSDP: matrices split on dim 0 over the fsdp axis (gathered on use by XLA), vectors replicated."""

LLAMA_TP_RULES: tuple[Rule, ...] = (
    Rule(r"\.(wq|wk|wv|w1|w3)\.weight$", ("tensor", "fsdp")),
    Rule(r"\.(wo|w2)\.weight$", ("fsdp", "tensor")),
    Rule(r"(tok_emb|head)\.weight$", ("fsdp", None)),
    Rule(r".*", ()),
)
"""Megatron-style tensor parallelism for tputool's Llama (column-split q/k/v/up, row-split o/down) + FSDP."""


def spec_for(name: str, shape: Sequence[int], rules: Iterable[Rule], mesh: Mesh) -> Spec:
    """The spec of the first rule matching parameter `name`; axes a dim cannot divide over are dropped."""
    for rule in rules:
        if (rule.ndim is None or rule.ndim == len(shape)) and re.search(rule.pattern, name):
            out = []
            for dim, s in enumerate(tuple(rule.spec)[: len(shape)]):
                names = tuple(a for a in (s if isinstance(s, tuple) else (s,)) if a is not None)
                n = int(np.prod([mesh.shape[a] for a in names])) if names else 1
                out.append(s if names and shape[dim] % n == 0 else None)
            return tuple(out)
    return ()


def shard_model(model: torch.nn.Module, mesh: Mesh, rules: Iterable[Rule] = FSDP_RULES) -> dict[str, Spec]:
    """Shard every parameter and buffer of tpu `model` by `rules` (first match wins); returns name -> spec."""
    rules = tuple(rules)
    specs = {}
    for name, p in [*model.named_parameters(), *model.named_buffers()]:
        spec = spec_for(name, tuple(p.shape), rules, mesh)
        mark_sharding(p, mesh, spec)
        specs[name] = spec
    return specs


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

"""One candidate's training step as a sharded `jax.jit`: exported torch loss, grads, AdamW, shardings.

State is fp32 master parameters and AdamW moments, sharded by the candidate's partition plan; the
forward/backward runs in the candidate's precision; the batch is split over the data x fsdp axes. With
`scan_layers` the repeated layers' parameters are stacked (leading layer axis, unsharded) and the layers run
as one `jax.lax.scan` body (tune/scan.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tputool.models.spec import ModelSpec
from tputool.partition import BATCH_AXES, PartitionPlan, partition_specs
from tputool.tune.candidate import Candidate
from tputool.tune.export import ExportedLoss, export_loss
from tputool.tune.lower import loss_function, scan_layout
from tputool.tune.scan import ScanPlan

ADAMW = {"lr": 1e-3, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
"""Optimizer hyper-parameters of the measured step (the step's cost does not depend on them)."""


@dataclass
class BuiltStep:
    """A jitted step, its shardings, and how to make its arguments (abstract for compile-only devices)."""

    fn: Any  # jitted (state, inputs, targets) -> (state, loss)
    mesh: Any
    plan: PartitionPlan
    exported: ExportedLoss
    state_shardings: dict
    batch_sharding: Any
    batch_shapes: tuple  # ((shape, dtype), (shape, dtype)) of (inputs, targets)
    compute_dtype: Any
    params: dict  # fp32 master values by name in the step's layout (scanned layers stacked)
    scan: ScanPlan | None = None  # the scanned layer runs, when built with scan_layers

    def abstract_args(self) -> tuple:
        """ShapeDtypeStructs with shardings for (state, inputs, targets)."""
        import jax
        import jax.numpy as jnp

        sh = self.state_shardings
        p = {k: jax.ShapeDtypeStruct(v.shape, jnp.float32, sharding=sh["params"][k])
             for k, v in self.params.items()}
        state = {"params": p, "m": dict(p), "v": dict(p),
                 "t": jax.ShapeDtypeStruct((), jnp.int32, sharding=sh["t"])}
        batch = tuple(jax.ShapeDtypeStruct(shape, dt, sharding=self.batch_sharding) for shape, dt in self.batch_shapes)
        return (state, *batch)

    def lower(self):
        """`jax.jit(...).lower(...)` on abstract arguments (works for compile-only TPU devices too)."""
        return self.fn.lower(*self.abstract_args())

    def init_args(self, spec: ModelSpec, config: Any) -> tuple:
        """Real sharded (state, inputs, targets) on the mesh's devices."""
        import jax
        import jax.numpy as jnp

        sh = self.state_shardings["params"]
        params = {k: jax.device_put(jnp.asarray(v), sh[k]) for k, v in self.params.items()}

        def zeros():
            return {k: jax.device_put(jnp.zeros(v.shape, jnp.float32), sh[k]) for k, v in self.params.items()}

        state = {"params": params, "m": zeros(), "v": zeros(),
                 "t": jax.device_put(jnp.zeros((), jnp.int32), self.state_shardings["t"])}
        inputs, targets = _example_batch(spec, config, self.batch_shapes[0][0][0], self.compute_dtype)
        return state, jax.device_put(inputs, self.batch_sharding), jax.device_put(targets, self.batch_sharding)


_EXPORTS: dict[tuple, ExportedLoss] = {}


def exported_for(spec: ModelSpec, config: Any, global_batch: int, precision: str,
                 materialize: bool = True, moe: str = "") -> ExportedLoss:
    """Export (cached per model, batch, precision, whether weights are real and MoE dispatch)."""
    key = (spec.name, repr(config), global_batch, precision, materialize, moe)
    if key not in _EXPORTS:
        _EXPORTS[key] = export_loss(spec, config, global_batch, precision, materialize=materialize, moe=moe)
    return _EXPORTS[key]


def make_mesh(c: Candidate, devices: list | None = None):
    """A (data, fsdp, tensor) mesh over the first data*fsdp*tensor devices (`tputool.mesh.axis_mesh`:
    physical device order on TPU)."""
    import jax

    from tputool.mesh import axis_mesh

    devices = jax.devices() if devices is None else devices
    if len(devices) < c.n_devices:
        raise ValueError(f"candidate needs {c.n_devices} devices, {len(devices)} available")
    return axis_mesh(c.mesh, devices[: c.n_devices])


def _adamw(params: dict, grads: dict, m: dict, v: dict, t):
    """One AdamW update, all in float32 (also when jax_enable_x64 is on)."""
    import jax.numpy as jnp

    h = ADAMW
    f32 = jnp.float32
    t = t + 1
    bc1 = 1 - f32(h["b1"]) ** t.astype(f32)
    bc2 = 1 - f32(h["b2"]) ** t.astype(f32)
    new_p, new_m, new_v = {}, {}, {}
    for k, p in params.items():
        g = grads[k].astype(f32)
        new_m[k] = (f32(h["b1"]) * m[k] + f32(1 - h["b1"]) * g).astype(f32)
        new_v[k] = (f32(h["b2"]) * v[k] + f32(1 - h["b2"]) * g * g).astype(f32)
        update = (new_m[k] / bc1) / (jnp.sqrt(new_v[k] / bc2) + f32(h["eps"])) + f32(h["weight_decay"]) * p
        new_p[k] = (p - f32(h["lr"]) * update).astype(f32)
    return new_p, new_m, new_v, t


def build_step(spec: ModelSpec, config: Any, c: Candidate, devices: list | None = None,
               materialize: bool = True, scan_layers: bool = False) -> BuiltStep:
    """The sharded training step of `spec` under candidate `c` (not yet compiled).

    `materialize=False` exports on the meta device: enough to lower and compile (e.g. for compile-only
    TPU devices) for a model of any size, not to run. `scan_layers` compiles runs of identical layers as
    one `jax.lax.scan` body over stacked parameters (compile time independent of the depth; XLA's
    cost_analysis then counts the body once).
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    exp = exported_for(spec, config, c.global_batch, c.precision, materialize, c.moe)
    mesh = make_mesh(c, devices)
    shapes = {k: tuple(v.shape) for k, v in exp.params.items()}
    plan = partition_specs(shapes, c.mesh)
    scan = scan_layout(exp) if scan_layers else None
    master = scan.stack(exp.params) if scan else exp.params
    specs = scan.stacked_specs(plan.specs) if scan else plan.specs
    compute = jnp.bfloat16 if c.precision == "bf16" else jnp.float32
    batch_sharding = NamedSharding(mesh, P(BATCH_AXES))
    replicated = NamedSharding(mesh, P())

    def constrain(x):
        if x.ndim >= 1 and x.shape[0] == c.global_batch:
            return jax.lax.with_sharding_constraint(x, batch_sharding)
        return x

    loss_fn = loss_function(exp, c.attention, c.block, c.remat, constrain, scan=scan is not None, mesh=mesh)
    param_sh = {k: NamedSharding(mesh, P(*specs[k])) for k in master}
    state_sh = {"params": param_sh, "m": param_sh, "v": param_sh, "t": replicated}
    buffers = {k: jnp.asarray(v, compute if v.dtype == np.float32 else None) for k, v in exp.buffers.items()}
    precision = "highest" if c.precision == "fp32" else "default"

    def train_step(state, inputs, targets):
        def compute_loss(master):
            cast = {k: p.astype(compute) for k, p in master.items()}
            return loss_fn(cast, buffers, inputs, targets).astype(jnp.float32)

        with jax.default_matmul_precision(precision):
            loss, grads = jax.value_and_grad(compute_loss)(state["params"])
        p, m, v, t = _adamw(state["params"], grads, state["m"], state["v"], state["t"])
        return {"params": p, "m": m, "v": v, "t": t}, loss

    fn = jax.jit(train_step, in_shardings=(state_sh, batch_sharding, batch_sharding),
                 out_shardings=(state_sh, replicated), donate_argnums=(0,))
    inputs, targets = _example_batch(spec, config, c.global_batch, compute)
    shapes_b = ((inputs.shape, inputs.dtype), (targets.shape, targets.dtype))
    return BuiltStep(fn, mesh, plan, exp, state_sh, batch_sharding, shapes_b, compute, master, scan)


def _example_batch(spec: ModelSpec, config: Any, global_batch: int, compute):
    import jax.numpy as jnp
    import torch

    x, y = spec.example_batch(config, global_batch, "cpu", torch.Generator().manual_seed(0))

    def conv(t):
        if t.is_floating_point():
            return jnp.asarray(t.float().numpy(), compute)
        return jnp.asarray(t.numpy())

    return conv(x), conv(y)

"""Run an exported ATen loss graph as a JAX function, with the tuner's knobs applied while lowering.

The graph is split into segments (one per run of nodes of the same layer, `torch.fx` split_module) and
each segment is lowered by the graph backend's interpreter (`tputool.backend.graph.jaxify.interpret`)
with the shared lowering table, plus the ops the tuner owns: scaled-dot-product attention (plain or
chunked, flash, splash: see attention.py). Layer segments run under `jax.checkpoint` with the remat policy,
and the values leaving them are constrained to stay batch-sharded. With `scan`, runs of identical layers
compile as one body under `jax.lax.scan` over stacked parameters (scan.py).
"""

from __future__ import annotations

import operator
from collections import ChainMap
from collections.abc import Callable, Mapping

import torch
from torch.fx.passes.split_module import split_module

from tputool.errors import UserError
from tputool.tune.attention import sdpa
from tputool.tune.export import ExportedLoss
from tputool.tune.scan import ScanPlan, scan_plan

aten = torch.ops.aten


def _noop(*args, **kwargs):
    return None


def lowering_table(attention: str, block: int, mesh=None) -> Mapping:
    """The graph backend's table (the op plan's traced table) with the tuner's own entries on top (a Pallas
    attention kernel runs per device of `mesh`, when given)."""
    from tputool.backend.graph.jaxify import default_table
    from tputool.backend.lowerings import Lowering

    own = {
        aten.scaled_dot_product_attention.default: Lowering(sdpa(attention, block, mesh)),
        aten._assert_tensor_metadata.default: Lowering(_noop),
    }
    return ChainMap(own, default_table())


def missing_lowerings(exp: ExportedLoss) -> list[str]:
    """ATen ops of the graph that neither the tuner nor the shared lowering table can lower."""
    from tputool.backend.graph.jaxify import missing_lowerings as missing

    return missing(exp.graph_module, lowering_table("plain", 1))


_SPLITS: dict[int, tuple[ExportedLoss, torch.fx.GraphModule, dict[str, str | None]]] = {}


def _split(exp: ExportedLoss) -> tuple[torch.fx.GraphModule, dict[str, str | None]]:
    """One submodule per contiguous run of nodes of the same layer; returns it and submodule -> layer
    (cached per export)."""
    hit = _SPLITS.get(id(exp))
    if hit is not None and hit[0] is exp:
        return hit[1], hit[2]
    split, layer_of_sub = _split_uncached(exp)
    _SPLITS[id(exp)] = (exp, split, layer_of_sub)
    return split, layer_of_sub


def scan_layout(exp: ExportedLoss) -> ScanPlan | None:
    """How `loss_function(..., scan=True)` scans the layers and stacks their parameters (None: no scan)."""
    split, layer_of_sub = _split(exp)
    return scan_plan(split, layer_of_sub, exp.sources)


def _split_uncached(exp: ExportedLoss) -> tuple[torch.fx.GraphModule, dict[str, str | None]]:
    part_of: dict[str, int] = {}
    layer_of_part: dict[int, str | None] = {}
    current, last = -1, object()
    for n in exp.graph_module.graph.nodes:
        if n.op != "call_function":
            continue
        layer = exp.layer_of.get(n.name)
        if layer != last:
            current, last = current + 1, layer
            layer_of_part[current] = layer
        part_of[n.name] = current
    split = split_module(exp.graph_module, None, lambda node: part_of[node.name], keep_original_order=True)
    return split, {f"submod_{i}": layer for i, layer in layer_of_part.items()}


def _constants(sub: torch.fx.GraphModule) -> dict:
    import jax.numpy as jnp

    out = {}
    for n in sub.graph.nodes:
        if n.op == "get_attr":
            obj = sub
            for part in n.target.split("."):
                obj = getattr(obj, part)
            out[n.target] = jnp.asarray(obj.detach().cpu().numpy()) if isinstance(obj, torch.Tensor) else obj
    return out


def loss_function(exp: ExportedLoss, attention: str = "plain", block: int = 0, remat: str = "none",
                  constrain: Callable | None = None, scan: bool = False, mesh=None) -> Callable:
    """A JAX function `(params, buffers, *inputs) -> loss` evaluating the exported graph.

    `params`/`buffers` are dicts by name in the compute dtype. `constrain(x)` is applied to every array
    leaving a layer segment (e.g. a batch-sharding constraint). With `scan`, runs of identical layers are one
    `jax.lax.scan` over stacked parameters: `params` then take `scan_layout(exp).stack(...)`'s layout.
    `mesh`: the step's mesh, over which a Pallas attention kernel and sparse MoE layers run per device.
    """
    import jax

    from tputool.backend.graph.jaxify import interpret
    from tputool.backend.graph.moe_experts import on_mesh

    missing = missing_lowerings(exp)
    if missing:
        raise UserError("the tpu backend has no lowering for: " + ", ".join(missing))
    table = lowering_table(attention, block, mesh)
    policy = {"none": None, "save-dots": jax.checkpoint_policies.dots_saveable,
              "full": jax.checkpoint_policies.nothing_saveable}[remat]
    split, layer_of_sub = _split(exp)
    plan = scan_layout(exp) if scan else None
    groups = {g.nodes[-1]: g for g in plan.groups} if plan else {}
    skip = frozenset().union(*(g.skip for g in plan.groups)) if plan else frozenset()
    runners: dict[str, tuple[Callable, bool, bool]] = {}
    for name, sub in split.named_children():
        body = interpret(sub, table, _constants(sub))
        in_layer = layer_of_sub.get(name) is not None
        out_node = next(n for n in sub.graph.nodes if n.op == "output")
        single = not isinstance(out_node.args[0], tuple | list)

        def run(*vals, _body=body):
            return _body(None, *vals)

        fn = jax.checkpoint(run, policy=policy) if in_layer and policy is not None else run
        runners[name] = (fn, in_layer, single)
    placeholders = [n.name for n in split.graph.nodes if n.op == "placeholder"]
    nodes = list(split.graph.nodes)
    targets = {n.name: n.target for n in nodes if n.op == "call_module"}

    def layer_outputs(outs):
        return tuple(constrain(o) if constrain is not None and hasattr(o, "shape") else o for o in outs)

    def scanned(g, env: dict, params: dict):
        fn = runners[targets[g.nodes[0]]][0]

        def body(carry, xs):
            vals = [carry[k] if kind == "carry" else xs[k] if kind == "param" else env[k] for kind, k in g.inputs]
            return layer_outputs(fn(*vals)), None

        init = tuple(env[n] for n in g.first_carry)
        xs = {k: params[k] for kind, k in g.inputs if kind == "param"}
        final, _ = jax.lax.scan(body, init, xs)
        return final

    def loss(params: dict, buffers: dict, *inputs):
        with on_mesh(mesh):
            return evaluate(params, buffers, *inputs)

    def evaluate(params: dict, buffers: dict, *inputs):
        env: dict = {}
        for name, (kind, key) in zip(placeholders, exp.sources, strict=True):
            if kind == "param" and plan is not None and key not in params:
                continue  # a layer parameter, read from its stacked array by the scan
            env[name] = params[key] if kind == "param" else buffers[key] if kind == "buffer" else inputs[key]
        for n in nodes:
            if n.name in skip:
                continue
            if n.name in groups:
                outs = scanned(groups[n.name], env, params)
                env[n.name] = outs[0] if groups[n.name].n_out == 1 else outs
            elif n.op == "call_module":
                fn, in_layer, single = runners[n.target]
                outs = fn(*(env[a.name] for a in n.args))
                if in_layer:
                    outs = layer_outputs(outs)
                env[n.name] = outs[0] if single else outs
            elif n.op == "call_function" and n.target is operator.getitem:
                env[n.name] = env[n.args[0].name][n.args[1]]
            elif n.op == "output":
                result = torch.fx.node.map_arg(n.args[0], lambda a: env[a.name])
                result = result[0] if isinstance(result, tuple | list) else result
                return result[0] if isinstance(result, tuple) else result
        raise ValueError("exported graph has no output")

    return loss

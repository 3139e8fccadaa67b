"""Scan over layers: find the runs of identical layer segments of a split loss graph, so the step compiles one
layer body under `jax.lax.scan` over stacked layer parameters instead of every layer unrolled.

A run is two or more consecutive layer segments (`lower._split`) whose graphs are the same op for op, whose
outputs feed only the next segment (the scan's carry), and whose other inputs are, position by position,
either one parameter per layer used nowhere else (stacked along a new leading axis, named with the layer
index replaced by `*`: `layers.*.attn.wq.weight`) or the same value for every layer (e.g. the rotary tables).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

LAYER_WILDCARD = "*"


@dataclass(frozen=True)
class ScanGroup:
    """One scanned run: its segments, and per input position where the value comes from."""

    nodes: tuple[str, ...]  # call_module nodes of the split graph, in order
    skip: frozenset[str]  # the nodes the scan replaces (segments and getitems of all but the last)
    inputs: tuple[tuple[str, Any], ...]  # ("carry", output index) | ("param", stacked key) | ("shared", node)
    n_out: int  # outputs of one segment (1: a single value)
    first_carry: tuple[str, ...]  # split-graph nodes holding the initial carry, by output index


@dataclass(frozen=True)
class ScanPlan:
    """The scanned runs of a graph and the stacked parameters they read."""

    groups: tuple[ScanGroup, ...]
    stacked: dict[str, tuple[str, ...]] = field(default_factory=dict)  # stacked key -> per-layer names

    def stack(self, params: dict) -> dict:
        """Per-layer parameters -> the scan's layout (stacked keys; others unchanged); numpy or jax arrays."""
        layered = {n for names in self.stacked.values() for n in names}
        out = {k: v for k, v in params.items() if k not in layered}
        for key, names in self.stacked.items():
            vals = [params[n] for n in names]
            if isinstance(vals[0], np.ndarray):
                out[key] = np.stack(vals) if vals[0].strides != (0,) * vals[0].ndim else \
                    np.broadcast_to(np.zeros((), vals[0].dtype), (len(vals), *vals[0].shape))
            else:
                import jax.numpy as jnp

                out[key] = jnp.stack(vals)
        return out

    def stacked_shapes(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """Per-layer parameter shapes -> the scan layout's shapes."""
        layered = {n for names in self.stacked.values() for n in names}
        out = {k: tuple(v) for k, v in shapes.items() if k not in layered}
        out.update({key: (len(names), *shapes[names[0]]) for key, names in self.stacked.items()})
        return out

    def stacked_specs(self, specs: dict[str, tuple]) -> dict[str, tuple]:
        """Per-layer partition specs -> the scan layout's (the layer axis unsharded)."""
        layered = {n for names in self.stacked.values() for n in names}
        out = {k: v for k, v in specs.items() if k not in layered}
        out.update({key: (None, *specs[names[0]]) for key, names in self.stacked.items()})
        return out


def _signature(sub: torch.fx.GraphModule) -> tuple:
    """The segment's graph with node names replaced by positions (equal for structurally equal layers)."""
    index: dict[str, int] = {}
    sig = []

    def norm(a):
        return ("node", index[a.name]) if isinstance(a, torch.fx.Node) else a

    for i, n in enumerate(sub.graph.nodes):
        index[n.name] = i
        args = torch.fx.node.map_aggregate(n.args, norm)
        kwargs = torch.fx.node.map_aggregate(dict(n.kwargs), norm)
        target = n.target if n.op in ("call_function", "call_method") else n.op
        sig.append((n.op, str(target), repr(args), repr(kwargs)))
    return tuple(sig)


def _has_constants(sub: torch.fx.GraphModule) -> bool:
    return any(n.op == "get_attr" for n in sub.graph.nodes)


def _stacked_key(name: str, layer: str) -> str | None:
    """`layers.3.attn.wq.weight` in layer `layers.3` -> `layers.*.attn.wq.weight` (None: not the layer's)."""
    if not name.startswith(layer + "."):
        return None
    head, _, _ = layer.rpartition(".")
    return f"{head}.{LAYER_WILDCARD}.{name[len(layer) + 1:]}" if head else f"{LAYER_WILDCARD}.{name[len(layer) + 1:]}"


def _outputs_of(node: torch.fx.Node, n_out: int) -> list[torch.fx.Node] | None:
    """The nodes carrying each output of segment `node` (itself, or its getitems), or None if used otherwise."""
    if n_out == 1:
        return [node]
    outs: list[torch.fx.Node | None] = [None] * n_out
    for u in node.users:
        if u.op != "call_function" or u.target is not operator.getitem or outs[u.args[1]] is not None:
            return None
        outs[u.args[1]] = u
    return outs if all(o is not None for o in outs) else None


def _n_out(sub: torch.fx.GraphModule) -> int:
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    return len(out) if isinstance(out, tuple | list) else 1


def _try_group(split, run: list[torch.fx.Node], layer_of_sub: dict, sources: dict[str, tuple]) -> ScanGroup | None:
    """A ScanGroup over `run` (same-signature consecutive layer segments), or None when it cannot scan."""
    n_out = _n_out(getattr(split, run[0].target))
    outs = [_outputs_of(n, n_out) for n in run]
    if any(o is None for o in outs):
        return None
    inputs: list[tuple[str, Any]] = []
    for j in range(len(run[0].args)):
        args = [n.args[j] for n in run]
        if not all(isinstance(a, torch.fx.Node) for a in args):
            return None
        carry = [k for k in range(n_out) if all(args[i] is outs[i - 1][k] for i in range(1, len(run)))]
        if carry:
            inputs.append(("carry", carry[0]))
            continue
        if all(a is args[0] for a in args):
            inputs.append(("shared", args[0].name))
            continue
        keys = set()
        for node, a in zip(run, args, strict=True):
            src = sources.get(a.name)
            if src is None or src[0] != "param" or len(a.users) != 1:
                return None
            keys.add(_stacked_key(src[1], layer_of_sub[node.target]))
        if len(keys) != 1 or None in keys:
            return None
        inputs.append(("param", keys.pop()))
    carried = sorted(k for kind, k in inputs if kind == "carry")
    if carried != list(range(n_out)):
        return None  # every output must feed the next layer exactly once
    for i in range(len(run) - 1):  # an inner layer's outputs feed only the next layer
        if any(set(o.users) - {run[i + 1]} for o in outs[i]):
            return None
    first = [None] * n_out
    for (kind, k), a in zip(inputs, run[0].args, strict=True):
        if kind == "carry":
            first[k] = a.name
    skip = {n.name for n in run[:-1]} | {o.name for group in outs[:-1] for o in group if n_out > 1}
    return ScanGroup(tuple(n.name for n in run), frozenset(skip), tuple(inputs), n_out, tuple(first))


def scan_plan(split: torch.fx.GraphModule, layer_of_sub: dict[str, str | None],
              sources: list[tuple[str, Any]]) -> ScanPlan | None:
    """The scannable runs of `split` (None when there are none): `sources` are the exported placeholders'."""
    placeholders = [n.name for n in split.graph.nodes if n.op == "placeholder"]
    src = dict(zip(placeholders, sources, strict=True))
    mods = [n for n in split.graph.nodes if n.op == "call_module"]
    groups: list[ScanGroup] = []
    stacked: dict[str, tuple[str, ...]] = {}
    run: list[torch.fx.Node] = []
    sig = None

    def close():
        if len(run) >= 2:
            g = _try_group(split, run, layer_of_sub, src)
            if g is not None:
                groups.append(g)
                for j, (kind, key) in enumerate(g.inputs):
                    if kind == "param":
                        stacked[key] = tuple(src[n.args[j].name][1] for n in run)

    for n in mods:
        sub = getattr(split, n.target)
        layered = layer_of_sub.get(n.target) is not None and not _has_constants(sub)
        s = _signature(sub) if layered else None
        if s is not None and s == sig:
            run.append(n)
            continue
        close()
        run, sig = ([n], s) if s is not None else ([], None)
    close()
    return ScanPlan(tuple(groups), stacked) if groups else None

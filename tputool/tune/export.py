"""Export a torch model's loss to an ATen FX graph whose parameters are inputs, split into layer segments.

`torch.export` traces `loss_fn(model(inputs), targets)` with the parameters lifted to graph inputs;
decomposing to core ATen keeps `aten.scaled_dot_product_attention` whole, so the tuner's attention
choice replaces it. Nodes carry `nn_module_stack`, which gives each node its layer (`layers.3`) for
per-layer rematerialisation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from tputool.errors import UserError
from tputool.models.spec import ModelSpec

KEEP_WHOLE = (torch.ops.aten.scaled_dot_product_attention.default,)
"""Ops left undecomposed, because the tuner lowers them itself."""


class _LossModule(nn.Module):
    def __init__(self, model: nn.Module, loss_fn) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, inputs, targets):
        return self.loss_fn(self.model(inputs), targets)


@dataclass
class ExportedLoss:
    """The loss graph and where each of its placeholders comes from."""

    graph_module: torch.fx.GraphModule
    sources: list[tuple[str, Any]]  # per placeholder: ("param", name) | ("buffer", name) | ("input", index)
    params: dict[str, np.ndarray]  # unique trainable parameters by name (fp32 master values)
    buffers: dict[str, np.ndarray]
    layer_of: dict[str, str | None] = field(default_factory=dict)  # node name -> layer path
    compute_dtype: torch.dtype = torch.float32


def layer_containers(model: nn.Module) -> list[str]:
    """Paths of the ModuleLists of >=2 same-typed children (the repeated layers), largest first."""
    found = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) >= 2 and len({type(m) for m in mod}) == 1:
            found.append((sum(p.numel() for p in mod.parameters()), name))
    return [n for _, n in sorted(found, reverse=True)]


def _layer_path(node: torch.fx.Node, containers: list[str]) -> str | None:
    stack = node.meta.get("nn_module_stack") or {}
    for path, _type in stack.values():
        path = path.removeprefix("model.")  # the loss wrapper's attribute name
        for c in containers:
            if path.startswith(c + "."):
                rest = path[len(c) + 1:].split(".", 1)[0]
                if rest.isdigit():
                    return f"{c}.{rest}"
    return None


def _host_values(t: torch.Tensor, materialize: bool) -> np.ndarray:
    if not materialize:  # shapes only: a zero-strided view costs no memory
        return np.broadcast_to(np.zeros((), np.float32 if t.is_floating_point() else np.int64), tuple(t.shape))
    return t.detach().float().numpy().copy() if t.is_floating_point() else t.detach().numpy().copy()


@contextlib.contextmanager
def _moe_dispatch(moe: str) -> Iterator[None]:
    """tputool's MoE layers dispatch by `moe` while the model is traced ("": as they would anyway)."""
    from tputool.backend import runtime

    old = runtime.STATE.moe_dispatch
    runtime.STATE.moe_dispatch = moe or old
    try:
        yield
    finally:
        runtime.STATE.moe_dispatch = old


def export_loss(spec: ModelSpec, config: Any, batch_size: int, precision: str = "fp32",
                seed: int = 0, materialize: bool = True, moe: str = "") -> ExportedLoss:
    """Build `spec` (seeded), cast it to the compute dtype, and export its loss on an example batch.

    With `materialize=False` the model is built on the meta device (nothing allocated, any size): the
    result is good for compiling (shapes), not for running; buffers are zeros. `moe`: the MoE dispatch traced
    (a sparse one keeps each grouped matmul one op, `tputool::jax_op`, lowered with the graph).
    """
    torch.manual_seed(seed)
    device = "cpu" if materialize else "meta"
    with torch.device(device):
        model = spec.build(config)
    master = {n: _host_values(p, materialize) for n, p in model.named_parameters()}
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = model.to(dtype)
    gen = torch.Generator().manual_seed(seed)
    inputs, targets = spec.example_batch(config, batch_size, "cpu", gen)
    if inputs.is_floating_point():
        inputs = inputs.to(dtype)
    if targets.is_floating_point():
        targets = targets.to(dtype)
    inputs, targets = inputs.to(device), targets.to(device)
    wrapper = _LossModule(model, spec.loss_fn)
    try:
        with _moe_dispatch(moe):
            ep = torch.export.export(wrapper, (inputs, targets))
        table = torch.export.default_decompositions()
        for op in KEEP_WHOLE:
            table.pop(op, None)
        ep = ep.run_decompositions(table)
    except Exception as e:  # noqa: BLE001 - export failures in user models become one line
        first = str(e).splitlines()[0] if str(e) else ""
        raise UserError(f"cannot export model '{spec.name}' for tuning: {type(e).__name__}: {first}") from e

    # tied parameters appear once per name in the signature: map every alias to the canonical name
    canonical: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        canonical.setdefault(id(p), n)
    alias = {n: canonical[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}
    buffers = {n: _host_values(b, True) if materialize else np.zeros(tuple(b.shape), np.float32)
               for n, b in model.named_buffers()}
    sources: list[tuple[str, Any]] = []
    user_index = 0
    for s in ep.graph_signature.input_specs:
        kind = s.kind.name
        if kind == "PARAMETER":
            sources.append(("param", alias[s.target.removeprefix("model.")]))
        elif kind == "BUFFER":
            sources.append(("buffer", s.target.removeprefix("model.")))
        elif kind == "USER_INPUT":
            sources.append(("input", user_index))
            user_index += 1
        else:
            raise UserError(f"cannot tune model '{spec.name}': unsupported graph input kind {kind}")
    gm = ep.graph_module
    containers = layer_containers(model)
    layer_of = {n.name: _layer_path(n, containers) for n in gm.graph.nodes if n.op == "call_function"}
    return ExportedLoss(gm, sources, master, buffers, layer_of, dtype)

"""Parameter partition specs from logical-axis rules (MaxText style), not a free per-tensor search.

Two tables, both data: PARAM_AXES names the logical axes of a parameter from its name; LOGICAL_TO_MESH
maps logical axes to mesh axes. `partition_specs` applies them with divisibility checks and records
every dim it had to leave unsharded.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

PARAM_AXES: list[tuple[str, tuple[str | None, ...]]] = [
    # attention projections (torch Linear weights are (out, in))
    (r"(^|\.)(wq|q_proj|query)\.weight$", ("heads", "embed")),
    (r"(^|\.)(wk|wv|k_proj|v_proj|key|value)\.weight$", ("kv_heads", "embed")),
    (r"(^|\.)(wo|o_proj|out_proj|proj)\.weight$", ("embed", "heads")),
    (r"(^|\.)(qkv|c_attn|in_proj)\.weight$", ("heads", "embed")),
    # feed-forward
    (r"(^|\.)(w1|w3|gate_proj|up_proj|fc1|c_fc|mlp\.0)\.weight$", ("mlp", "embed")),
    (r"(^|\.)(w2|down_proj|fc2|c_proj|mlp\.2)\.weight$", ("embed", "mlp")),
    # mixture of experts: stacked (experts, in, out) weights
    (r"(^|\.)(w1|w3)$", ("expert", "embed", "mlp")),
    (r"(^|\.)w2$", ("expert", "mlp", "embed")),
    (r"(^|\.)router\.weight$", (None, "embed")),
    # embeddings and heads
    (r"(^|\.)(tok_emb|embed_tokens|wte|embedding|embeddings)\.weight$", ("vocab", "embed")),
    (r"(^|\.)(head|lm_head|output)\.weight$", ("vocab", "embed")),
]
"""Regex on the parameter name -> logical axis per dim (first match wins, rank must match)."""

LOGICAL_TO_MESH: dict[str, str | None] = {
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "embed": "fsdp",
    "expert": None,
    "other": "fsdp",
}
"""Logical axis -> mesh axis (None: replicated)."""

BATCH_AXES = ("data", "fsdp")
"""Mesh axes the batch dim of inputs and activations is split over."""


@dataclass
class PartitionPlan:
    """Per-parameter PartitionSpec entries (tuples of mesh axis or None) and what was left unsharded."""

    specs: dict[str, tuple[str | None, ...]]
    logical: dict[str, tuple[str | None, ...]]
    dropped: list[str] = field(default_factory=list)  # "param dim 0 (heads=4) not divisible by tensor=8"

    def local_elements(self, shapes: dict[str, tuple[int, ...]], mesh: dict[str, int]) -> int:
        """Parameter elements one device holds under this plan."""
        total = 0
        for name, shape in shapes.items():
            div = math.prod(mesh[a] for a in self.specs[name] if a is not None)
            total += math.prod(shape) // div
        return total


def logical_axes(name: str, shape: tuple[int, ...]) -> tuple[str | None, ...]:
    """Logical axes of a parameter: from PARAM_AXES, else `other` on the largest dim of a >=2-D tensor."""
    for pattern, axes in PARAM_AXES:
        if re.search(pattern, name) and len(axes) == len(shape):
            return axes
    if len(shape) >= 2:
        big = max(range(len(shape)), key=lambda i: shape[i])
        return tuple("other" if i == big else None for i in range(len(shape)))
    return tuple(None for _ in shape)


def partition_specs(shapes: dict[str, tuple[int, ...]], mesh: dict[str, int],
                    rules: dict[str, str | None] | None = None) -> PartitionPlan:
    """Apply the rules to every parameter; a dim whose size the mesh axis does not divide stays unsharded."""
    rules = LOGICAL_TO_MESH if rules is None else rules
    specs: dict[str, tuple[str | None, ...]] = {}
    logical: dict[str, tuple[str | None, ...]] = {}
    dropped: list[str] = []
    for name, shape in shapes.items():
        axes = logical_axes(name, shape)
        logical[name] = axes
        spec: list[str | None] = []
        used: set[str] = set()
        for dim, (size, ax) in enumerate(zip(shape, axes, strict=True)):
            target = rules.get(ax) if ax is not None else None
            if target is None or mesh.get(target, 1) == 1 or target in used:
                spec.append(None)
                continue
            if size % mesh[target]:
                dropped.append(f"{name} dim {dim} ({ax}={size}) not divisible by {target}={mesh[target]}")
                spec.append(None)
                continue
            spec.append(target)
            used.add(target)
        specs[name] = tuple(spec)
    return PartitionPlan(specs=specs, logical=logical, dropped=dropped)

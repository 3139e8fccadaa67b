"""Partition rules, the one vocabulary of the sharding API (`tputool.backend.graph.sharding`) and `tputool.tune`.

A `Rule` gives parameters whose name matches a regex (and, optionally, with a given number of dims) a
spec: one entry per dim naming an axis, a tuple of axes, or None (replicated). Rule tables are data:

- mesh-axis tables for the sharding API (REPLICATED_RULES, FSDP_RULES, LLAMA_TP_RULES), applied by
  `spec_for`, which drops the axes a dim cannot divide over;
- PARAM_RULES, whose specs name logical axes (MaxText style), mapped to mesh axes by LOGICAL_TO_MESH;
  `partition_specs` applies them with divisibility checks and records every dim it had to leave
  unsharded (the tuner's plans and `TuneConfig` use these, not a free per-tensor search).

Both kinds are found by `match_rule` (first match wins). Pure Python: no torch or JAX import.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

Spec = Sequence[str | tuple[str, ...] | None]
"""One entry per leading dim: an axis name, a tuple of axis names (the dim split over all), or None."""


@dataclass(frozen=True)
class Rule:
    """Parameters whose name matches `pattern` (re.search) and with `ndim` dims (None: any) get `spec`."""

    pattern: str
    spec: Spec
    ndim: int | None = None


def match_rule(name: str, shape: Sequence[int], rules: Iterable[Rule]) -> Rule | None:
    """The first rule of `rules` that matches parameter `name` of this shape, else None."""
    for rule in rules:
        if (rule.ndim is None or rule.ndim == len(shape)) and re.search(rule.pattern, name):
            return rule
    return None


# ---- mesh-axis rules (the sharding API) -----------------------------------------------------------

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


def spec_for(name: str, shape: Sequence[int], rules: Iterable[Rule], mesh) -> Spec:
    """The spec of the first rule matching parameter `name`; axes a dim cannot divide over are dropped.

    `mesh` is anything with a `shape` mapping of axis name -> size (a `jax.sharding.Mesh`).
    """
    rule = match_rule(name, shape, rules)
    if rule is None:
        return ()
    out = []
    for dim, s in enumerate(tuple(rule.spec)[: len(shape)]):
        names = tuple(a for a in (s if isinstance(s, tuple) else (s,)) if a is not None)
        n = math.prod(mesh.shape[a] for a in names) if names else 1
        out.append(s if names and shape[dim] % n == 0 else None)
    return tuple(out)


# ---- logical-axis rules (the tuner and tputool-tune.yaml) ------------------------------------------

PARAM_RULES: tuple[Rule, ...] = (
    # attention projections (torch Linear weights are (out, in))
    Rule(r"(^|\.)(wq|q_proj|query)\.weight$", ("heads", "embed"), ndim=2),
    Rule(r"(^|\.)(wk|wv|k_proj|v_proj|key|value)\.weight$", ("kv_heads", "embed"), ndim=2),
    Rule(r"(^|\.)(wo|o_proj|out_proj|proj)\.weight$", ("embed", "heads"), ndim=2),
    Rule(r"(^|\.)(qkv|c_attn|in_proj)\.weight$", ("heads", "embed"), ndim=2),
    # feed-forward
    Rule(r"(^|\.)(w1|w3|gate_proj|up_proj|fc1|c_fc|mlp\.0)\.weight$", ("mlp", "embed"), ndim=2),
    Rule(r"(^|\.)(w2|down_proj|fc2|c_proj|mlp\.2)\.weight$", ("embed", "mlp"), ndim=2),
    # mixture of experts: stacked (experts, in, out) weights
    Rule(r"(^|\.)(w1|w3)$", ("expert", "embed", "mlp"), ndim=3),
    Rule(r"(^|\.)w2$", ("expert", "mlp", "embed"), ndim=3),
    Rule(r"(^|\.)router\.weight$", (None, "embed"), ndim=2),
    # embeddings and heads
    Rule(r"(^|\.)(tok_emb|embed_tokens|wte|embedding|embeddings)\.weight$", ("vocab", "embed"), ndim=2),
    Rule(r"(^|\.)(head|lm_head|output)\.weight$", ("vocab", "embed"), ndim=2),
)
"""Parameter name regex -> logical axis per dim (first match wins; ndim: the rank must match)."""

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
    """Logical axes of a parameter: from PARAM_RULES, else `other` on the largest dim of a >=2-D tensor."""
    rule = match_rule(name, shape, PARAM_RULES)
    if rule is not None:
        return tuple(rule.spec)
    if len(shape) >= 2:
        big = max(range(len(shape)), key=lambda i: shape[i])
        return tuple("other" if i == big else None for i in range(len(shape)))
    return tuple(None for _ in shape)


def partition_specs(shapes: dict[str, tuple[int, ...]], mesh: dict[str, int],
                    logical_to_mesh: Mapping[str, str | None] | None = None) -> PartitionPlan:
    """Apply PARAM_RULES through `logical_to_mesh` (default LOGICAL_TO_MESH) to every parameter; a dim whose
    size the mesh axis does not divide, or whose axis has size 1 or is already used, stays unsharded."""
    rules = LOGICAL_TO_MESH if logical_to_mesh is None else logical_to_mesh
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

"""Compiled graphs holding collectives over more than one rank: split around them, each collective through the
process group.

A functional collective (`_c10d_functional.*`) of a one-rank group is lowered inside the graph's computation
(`lowerings/collectives.py`). Over more ranks, the data of the other processes is only reachable through the
process group, so `split_compile` cuts the graph at each such collective: the pieces between collectives are
compiled to one `jax.jit` each (by the caller's `compile_piece`), and each collective runs as PyTorch's op on the
tpu tensors, which calls the group's collective (whatever group: "tpu", or another backend registered for tpu).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from tputool.backend.lowerings.collectives import group_size

_C10D = "_c10d_functional"
_WAIT = "wait_tensor"


def _size_of(node: fx.Node) -> int:
    """Ranks of the group a collective node runs over (1 for `wait_tensor`, which is lowered as the identity)."""
    op = node.target
    names = [a.name for a in op._schema.arguments]
    if "group_size" in names:
        i = names.index("group_size")
        return int(node.args[i] if i < len(node.args) else node.kwargs["group_size"])
    i = names.index("group_name")
    return group_size(node.args[i] if i < len(node.args) else node.kwargs["group_name"])


def is_multi_rank(node: fx.Node) -> bool:
    """True for a call of a functional collective over more than one rank (not lowerable inside a computation)."""
    op = node.target
    return (node.op == "call_function" and isinstance(op, torch._ops.OpOverload) and op.namespace == _C10D
            and op._schema.name.split("::")[1] != _WAIT and _size_of(node) > 1)


def needs_split(gm: fx.GraphModule) -> bool:
    """True when `gm` holds a collective over more than one rank."""
    return any(is_multi_rank(n) for n in gm.graph.nodes)


class _Piece(torch.nn.Module):
    """A compiled piece of a split graph, called as the FX submodule it replaces (positional tensors in)."""

    def __init__(self, compiled: Callable[[list], list], single: bool) -> None:
        super().__init__()
        self.compiled = compiled
        self.single = single

    def forward(self, *args: Any) -> Any:
        """Run the compiled piece; one value or a tuple, as the submodule returned."""
        outs = self.compiled(list(args))
        return outs[0] if self.single else tuple(outs)


def _single_output(gm: fx.GraphModule) -> bool:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return not isinstance(out.args[0], list | tuple)


def _follows_collective(node: fx.Node, parts: dict[fx.Node, int]) -> bool:
    """True for a `wait_tensor` or `getitem` of a multi-rank collective's result: run with the collective, so that
    PyTorch's wait ends the collective's work (its result is read only after it)."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    src = node.args[0]
    if node.target is operator.getitem:
        return src in parts and is_multi_rank(src)
    if getattr(node.target, "namespace", None) == _C10D and node.target._schema.name.endswith(_WAIT):
        while src.target is operator.getitem:
            src = src.args[0]
        return src in parts and is_multi_rank(src)
    return False


class SplitGraph:
    """A graph split at its multi-rank collectives, with AOTAutograd's boxed convention (a list of inputs in, a
    list of outputs out)."""

    def __init__(self, split: fx.GraphModule) -> None:
        self._boxed_call = True  # (an instance attribute: wrappers copy __dict__)
        self.split = split

    def kinds(self) -> list[str]:
        """Each part in order: "compiled" (one computation) or "collective" (through the process group)."""
        return ["compiled" if isinstance(m, _Piece) else "collective" for _, m in self.split.named_children()]

    def __call__(self, args: list) -> list:
        """Run the parts in order on `args` (emptied, as the boxed convention asks)."""
        inputs = list(args)
        args.clear()
        out = self.split(*inputs)
        return list(out) if isinstance(out, list | tuple) else [out]


def split_compile(gm: fx.GraphModule, compile_piece: Callable[[fx.GraphModule], Callable[[list], list]]
                  ) -> SplitGraph:
    """`gm` split so that each multi-rank collective runs through the process group and every piece between
    them as compiled by `compile_piece` (a boxed callable per piece)."""
    from torch.fx.passes.split_module import split_module

    part = 0
    parts: dict[fx.Node, int] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if is_multi_rank(node):
            part += 1
            parts[node] = part
            part += 1
        elif _follows_collective(node, parts):
            parts[node] = parts[node.args[0]]  # (its wait, or an element of a coalesced collective's list)
        else:
            parts[node] = part
    split = split_module(gm, None, lambda n: parts[n], keep_original_order=True)
    for name, sub in list(split.named_children()):
        if not any(is_multi_rank(n) for n in sub.graph.nodes):
            setattr(split, name, _Piece(compile_piece(sub), _single_output(sub)))
    return SplitGraph(split)

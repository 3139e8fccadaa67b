"""Compiled graphs holding collectives over more than one rank: one XLA computation over the group's devices,
or (fallback) split around them, each collective through the process group.

A functional collective (`_c10d_functional.*`) of a one-rank group is lowered inside the graph's computation
(`lowerings/collectives.py`). When every multi-rank collective of a graph runs over one multi-process tpu group
(`distributed/group.TpuProcessGroup`), `spmd_for` gives the graph a `Spmd`: the whole graph is traced inside
`shard_map` over the group's mesh (one device per process, `programs.group_mesh`), its collectives lowered to
`jax.lax` collectives over the mesh axis, and each call assembles global arrays from the processes' local
inputs and returns this process's local outputs, as `programs.Collective` does for one collective.
A graph that draws random numbers gets each process's key words as its block of a sharded input: every rank draws
what the same graph compiled alone on that rank draws, from its own stream (advanced once per call). The split
sizes of each all_to_all_single (Python ints in the graph, different on each rank) are exchanged once, when the
graph is compiled, so that every rank lowers it with the whole split matrix.

Otherwise (another backend's group, several groups, split sizes computed at run time), `split_compile` cuts the
graph at each such collective, with a warning naming why: the pieces between collectives are compiled to one
`jax.jit` each (by the caller's `compile_piece`), and each collective runs as PyTorch's op on the tpu tensors,
which calls the group's collective.
"""

from __future__ import annotations

import operator
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch
from torch import fx

from tputool.backend.lowerings.collectives import Splits, group_size, is_uneven, over_group

_C10D = "_c10d_functional"
_WAIT = "wait_tensor"
_ALL_TO_ALL = torch.ops._c10d_functional.all_to_all_single.default


GRAPHS: Counter[str] = Counter()
"""Compiled graphs with multi-rank collectives: "one_program" (a `Spmd` computation) or "split" (cut)."""

_warned: set[str] = set()


def _arg(node: fx.Node, name: str) -> Any:
    """The value of the schema argument `name` of a collective node."""
    names = [a.name for a in node.target._schema.arguments]
    i = names.index(name)
    return node.args[i] if i < len(node.args) else node.kwargs[name]


def _size_of(node: fx.Node) -> int:
    """Ranks of the group a collective node runs over (1 for `wait_tensor`, which is lowered as the identity)."""
    names = [a.name for a in node.target._schema.arguments]
    if "group_size" in names:
        return int(_arg(node, "group_size"))
    return group_size(_arg(node, "group_name"))


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


def _tpu_group(name: str) -> Any:
    """The multi-process tpu group registered as `name`, or None (another backend's group)."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import _resolve_process_group

    from tputool.backend.distributed.group import TpuProcessGroup

    pg = _resolve_process_group(name)
    if isinstance(pg, TpuProcessGroup):
        return pg
    for group, gname in dist.distributed_c10d._world.pg_names.items():
        if gname == name and isinstance(group, TpuProcessGroup):
            return group
    return None


def _all_to_alls(gm: fx.GraphModule) -> list[fx.Node]:
    """The graph's all_to_all_single nodes over several ranks, in graph order."""
    return [n for n in gm.graph.nodes if is_multi_rank(n) and n.target is _ALL_TO_ALL]


def _sends(node: fx.Node) -> tuple[int, ...] | None:
    """The rows this rank sends to each rank in all_to_all_single `node` (its input split sizes, or equal parts);
    None when they are not known when the graph is compiled (computed sizes)."""
    n, splits = _size_of(node), node.args[2]
    if splits:
        return tuple(splits) if all(type(k) is int for k in splits) else None
    val = node.args[0].meta.get("val")
    rows = val.shape[0] if isinstance(val, torch.Tensor) and val.dim() else None
    return (rows // n,) * n if type(rows) is int and rows % n == 0 else None


def _why_not_one_program(gm: fx.GraphModule) -> tuple[str, Any, str]:
    """("", the group, its name) when the graph can run as one computation over its collectives' group, else
    (why, None, "")."""
    names = {str(_arg(n, "group_name")) for n in gm.graph.nodes if is_multi_rank(n)}
    if len(names) != 1:
        return f"its collectives run over {len(names)} groups", None, ""
    if any(_sends(n) is None for n in _all_to_alls(gm)):
        return "an all_to_all_single has split sizes computed at run time", None, ""
    (name,) = names
    group = _tpu_group(name)
    if group is None:
        return f"group {name!r} is not a multi-process tpu group", None, ""
    return "", group, name


def _split_matrices(gm: fx.GraphModule, group: Any, call: str) -> list[Splits]:
    """The split matrix of each all_to_all_single of `gm`, in order: every rank's sends, exchanged through the
    group's handshake (each rank compiles the same graphs in the same order)."""
    mine = ";".join(",".join(map(str, _sends(n))) for n in _all_to_alls(gm))
    extras = group._hs.check(f"compiling {call}: all_to_all splits", mine, need=True)
    per_rank = [[tuple(int(k) for k in m.split(",")) for m in e.split(";")] for e in extras]
    return [tuple(rank[i] for rank in per_rank) for i in range(len(per_rank[0]))]


def spmd_for(gm: fx.GraphModule) -> Spmd | None:
    """A `Spmd` over the one tpu group of `gm`'s multi-rank collectives, or None (warned once per reason:
    the graph is then split around them)."""
    why, group, name = _why_not_one_program(gm)
    if group is None:
        GRAPHS["split"] += 1
        if why not in _warned:
            _warned.add(why)
            warnings.warn(f"tpu graph: collectives over several ranks run through the process group, the graph "
                          f"cut around each ({why}); the pieces between are compiled", stacklevel=2)
        return None
    GRAPHS["one_program"] += 1
    ops = ",".join(n.target._schema.name.split("::")[1] for n in gm.graph.nodes if is_multi_rank(n))
    call = f"compiled graph [{ops}]"
    splits = _split_matrices(gm, group, call) if _all_to_alls(gm) else []
    return Spmd(group.devices, name, group.check, call, group.rank(), splits, group.guard)


class Spmd:
    """Runs a graph's function as one `shard_map` computation over a group's devices, one rank per process.

    Each array input and output gets a leading axis of 1 (this rank's block); the global arrays hold the ranks'
    blocks side by side along it (scalars included), and so do the ranks' random key words. Non-array outputs
    (sizes, None) are kept from tracing. Before each run the ranks exchange `call` and the input shapes through
    `check` (the group's handshake); `splits`: the split matrix of each all_to_all_single, in graph order (uneven
    splits give each rank inputs and outputs of its own shapes: only their dtypes and ranks are compared then)."""

    def __init__(self, devices: Sequence[jax.Device], group_name: str, check: Callable[[str], Any],
                 call: str, rank: int, splits: Sequence[Splits] = (), guard: Any = None) -> None:
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        from tputool.backend.distributed.programs import AXIS, group_mesh

        self.mesh = group_mesh(tuple(devices))
        self.size = len(devices)
        self.group_name = group_name
        self.rank = rank
        self.splits = tuple(splits)
        self._spec = P(AXIS)
        self._sharding = NamedSharding(self.mesh, self._spec)
        self._device = devices[rank]
        self._check = check
        self._guard = guard
        self._call = call + "".join(f" splits{list(map(list, m))}" for m in self.splits)
        self._same_shapes = not any(map(is_uneven, self.splits))
        self._kept = sum(map(is_uneven, self.splits))
        """Trailing outputs that only keep an uneven all_to_all in each rank's program (`over_group`)."""

    def wrap(self, fn: Callable[..., tuple], key_from: Callable[[Any], Any]) -> Callable[..., tuple]:
        """`fn(rng_key, *inputs)` on global arrays: its body traced per rank inside `shard_map`; the global
        `rng_key` words (or None) hold each rank's block, made a key by `key_from` inside the body."""
        spec, n, name, rank, splits = self._spec, self.size, self.group_name, self.rank, self.splits

        def run(rng_key: Any, *inputs: Any) -> tuple:
            args = [rng_key, *inputs]
            where = [i for i, x in enumerate(args) if isinstance(x, jax.Array) or hasattr(x, "aval")]
            static: dict[int, Any] = {}

            def body(*blocks: jax.Array) -> tuple:
                local = list(args)
                for i, b in zip(where, blocks, strict=True):
                    local[i] = b[0]
                with over_group(name, n, rank, splits) as alive:
                    outs = fn(key_from(local[0]), *local[1:])
                arrays = []
                for i, o in enumerate(outs):
                    if isinstance(o, jax.Array) or hasattr(o, "aval"):
                        arrays.append(o[None])
                    else:
                        static[i] = o
                return (*arrays, *(a[None] for a in alive))

            mapped = jax.shard_map(body, mesh=self.mesh, in_specs=(spec,) * len(where), out_specs=spec,
                                   check_vma=False)
            arrays = mapped(*[args[i] for i in where])
            it = iter(arrays)
            outs = len(static) + len(arrays) - self._kept
            return tuple(static[i] if i in static else next(it) for i in range(outs)) + tuple(it)

        return run

    def run(self, fn: Callable[..., tuple], rng_key: Any, inputs: Sequence[Any]) -> tuple:
        """`fn(rng_key, *inputs)` (the wrapped, jitted graph) once its results are ready: a rank that stops
        or diverges is named within the group's timeout, as for the group's own collectives (`guard`)."""
        if self._guard is None:
            return fn(rng_key, *inputs)
        return self._guard.settle(fn, (rng_key, *inputs), self._call)

    def to_global(self, rng_key: Any, inputs: Sequence[Any]) -> tuple[Any, list[Any]]:
        """Global arrays of this process's key words (or None) and `inputs` (non-array inputs pass), once every
        rank has made the same call."""
        self._check(f"{self._call} ({','.join(map(self._describe, inputs))})")
        make, sharding, n = jax.make_array_from_single_device_arrays, self._sharding, self.size
        if rng_key is not None:
            words = jax.device_put(rng_key[None], self._device)
            rng_key = make((n, *words.shape[1:]), sharding, [words])
        return rng_key, [make((n, *x.shape), sharding, [x[None]]) if isinstance(x, jax.Array) else x
                         for x in inputs]

    def _describe(self, x: Any) -> str:
        """An input as the ranks compare it: dtype and shape (dtype and rank where uneven splits make shapes differ)."""
        if not isinstance(x, jax.Array):
            return repr(x)
        return f"{x.dtype}{list(x.shape)}" if self._same_shapes else f"{x.dtype}[{x.ndim}d]"

    def to_local(self, outs: Sequence[Any]) -> tuple:
        """This process's block of each global output of the graph (non-array outputs pass)."""
        outs = outs[:len(outs) - self._kept]
        return tuple(o.addressable_shards[0].data[0] if isinstance(o, jax.Array) else o for o in outs)


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

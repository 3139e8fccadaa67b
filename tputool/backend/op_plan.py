"""How each ATen op runs on tpu, decided once per OpOverload for every executor.

Strict/Debug dispatch (`dispatch.py`), Fused recording (`fused.py`), the torch.compile interpreter
(`graph/jaxify.py`, `graph/dynamo_backend.py`) and tune's exporter (`tune/lower.py`) all read this plan;
none of them consults the lowering table or PyTorch's decompositions on its own.

An op's `Route` in eager mode, in order of preference:
  1. KERNEL: a hand-written storage kernel (`storage_kernels.py`: copies, factories, views, resize_, .item()),
  2. LOWERED: its own lowering from `tputool.backend.lowerings`,
  3. INPLACE / OUT: the lowering of its functional twin (`add_.Tensor`, `add.out` -> `add.Tensor`), whose
     results are cast to the written tensors' dtypes by `cast_results` and written back,
  4. DECOMPOSED / DECOMPOSED_THEN_WRITE: PyTorch's decomposition of the op (or of its functional twin,
     written back), re-dispatched on tpu tensors,
  5. CPU: the CPU fallback (`fallback.py`).
The traced executors (Fused, compiled graphs, tune) are functional: they use `OpPlan.traced`, the functional
lowering (the twin's for in-place ops), which may also be a traced-only lowering (views as values) or a
`_foreach_*` lowering synthesized from the per-element op's; out= variants stay eager. Ops a graph cannot
lower are decomposed by `graph_decompositions()`, the same policy as eager's: a lowering wins over a
decomposition.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

from tputool.backend.dtypes import NP_TO_TORCH, TORCH_TO_NP
from tputool.backend.lowerings import LOWERINGS, Lowering, on_change
from tputool.backend.lowerings.foreach import foreach_lowering
from tputool.backend.rng import HOST_RANDOM


class Route(enum.Enum):
    """How an op runs in eager (Strict/Debug) dispatch."""

    KERNEL = "hand-written kernel"
    LOWERED = "lowering"
    INPLACE = "in-place variant of a functional lowering"
    OUT = "out= variant of a functional lowering"
    DECOMPOSED = "PyTorch decomposition"
    DECOMPOSED_THEN_WRITE = "decomposition of the functional twin, written back"
    CPU = "CPU fallback"


@dataclass(frozen=True, eq=False, slots=True)
class OpPlan:
    """The plan of one OpOverload (see the module docstring)."""

    op: torch._ops.OpOverload
    route: Route
    lowering: Lowering | None
    """The lowering eager dispatch runs (the twin's for INPLACE/OUT), or None."""
    traced: Lowering | None
    """The functional lowering the traced executors record (None: not recordable; out= variants never are)."""
    functional: torch._ops.OpOverload | None
    """The functional twin of an in-place or out= overload."""
    written: tuple[int, ...]
    """Schema positions of the arguments the op writes."""
    out_variant: bool
    """True for out= overloads (written arguments are keyword-only) and in-place ops without a functional twin."""
    decomposition: Callable | None
    """PyTorch's decomposition run by the DECOMPOSED routes, or offered to the traced executors (functional ops)."""
    host_args: tuple[int, ...] = ()
    """Schema positions of the arguments that may hold CPU tensors next to tpu ones (`HOST_OPERANDS`)."""


KERNELS: dict[torch._ops.OpOverload, Callable] = {}
"""Hand-written kernels (filled by tputool.backend.storage_kernels): OpOverload -> handler(args, kwargs)."""

INPLACE_FUNCTIONAL: dict[str, str] = {
    "aten::normal_": "aten::normal_functional",
}
"""In-place ops whose functional twin is not simply the name without '_'."""

INPLACE_OVERLOAD: dict[tuple[str, str], str] = {
    ("aten::bernoulli_", "float"): "p",
}
"""In-place overloads whose functional twin has another overload name."""

_INDICES = frozenset({"indices"})
HOST_OPERANDS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("aten::index", "aten::_unsafe_index", "aten::index_put", "aten::index_put_",
                     "aten::_index_put_impl", "aten::_index_put_impl_", "aten::_unsafe_index_put"), _INDICES),
    "aten::_pack_padded_sequence": frozenset({"lengths"}),
    "aten::_pad_packed_sequence": frozenset({"batch_sizes"}),
    **dict.fromkeys(("aten::ctc_loss", "aten::_ctc_loss"), frozenset({"input_lengths", "target_lengths"})),
    **dict.fromkeys(("aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu"), frozenset({"batch_sizes"})),
}
"""Op -> arguments that may be CPU tensors next to tpu ones, as CUDA allows: indices (moved to the device)
and lengths/batch sizes (host data by contract). Any other CPU tensor with elements among a tpu op's
operands raises PyTorch's "Expected all tensors to be on the same device" (`tensor.mixed_devices`)."""


def host_positions(op: torch._ops.OpOverload) -> tuple[int, ...]:
    """Schema positions of `op`'s arguments listed in HOST_OPERANDS."""
    names = HOST_OPERANDS.get(op._schema.name)
    return tuple(i for i, a in enumerate(op._schema.arguments) if a.name in names) if names else ()


def written_positions(op: torch._ops.OpOverload) -> tuple[int, ...]:
    """Schema positions of the arguments `op` writes (in-place self, out= tensors)."""
    return tuple(i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write)


def functional_of(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The functional twin of an in-place (`add_.Tensor`) or out= (`add.out`) overload, else None."""
    s = op._schema
    written = [a for a in s.arguments if a.alias_info is not None and a.alias_info.is_write]
    if not written:
        return None
    if not written[0].kwarg_only:  # in-place: self is written
        name = INPLACE_FUNCTIONAL.get(s.name, s.name[:-1] if s.name.endswith("_") else None)
        if name is None:
            return None
        f = _overload(name, INPLACE_OVERLOAD.get((s.name, s.overload_name), s.overload_name))
        return f if f is not None and _same_args(f, op) else None
    keep = [(a.name, str(a.type)) for a in s.arguments if not (a.alias_info is not None and a.alias_info.is_write)]
    ns, name = s.name.split("::")
    pkt = getattr(getattr(torch.ops, ns), name)
    for ov in pkt.overloads():
        f = getattr(pkt, ov)
        fa = f._schema.arguments
        if any(a.alias_info is not None and a.alias_info.is_write for a in fa):
            continue
        if [(a.name, str(a.type)) for a in fa] == keep and len(f._schema.returns) == len(written):
            return f
    return None


def _overload(qualname: str, overload: str) -> torch._ops.OpOverload | None:
    ns, name = qualname.split("::")
    pkt = getattr(getattr(torch.ops, ns), name, None)
    if pkt is None:
        return None
    return getattr(pkt, overload or "default", None)


def _same_args(f: torch._ops.OpOverload, op: torch._ops.OpOverload) -> bool:
    b = [x.name for x in op._schema.arguments]
    return all(x.name in b for x in f._schema.arguments)


def decomposition(op: torch._ops.OpOverload) -> Callable | None:
    """PyTorch's decomposition of `op` (the one place that reads `torch._decomp`'s table), or None."""
    from torch._decomp import decomposition_table

    return decomposition_table.get(op)


def eager_lowering(op: torch._ops.OpOverload) -> Lowering | None:
    """The lowering eager dispatch may run for `op` itself (traced-only lowerings excluded)."""
    low = LOWERINGS.get(op)
    return None if low is None or low.traced_only else low


def traced_lowering(op: torch._ops.OpOverload) -> Lowering | None:
    """The functional lowering of `op` for the traced executors: the table's entry, or a `_foreach_*` op's
    synthesized from its per-element op."""
    low = LOWERINGS.get(op)
    if low is None and op._schema.name.startswith("aten::_foreach_"):
        if op not in _FOREACH:
            _FOREACH[op] = foreach_lowering(op, LOWERINGS)
        low = _FOREACH[op]
    return low


_FOREACH: dict[torch._ops.OpOverload, Lowering | None] = {}


HOST_DRAWN: set[torch._ops.OpOverload] = set()
"""Random ops sent to the CPU fallback under `rng.HOST_RANDOM` (their fallback is no missing kernel)."""


def _decide(op: torch._ops.OpOverload) -> OpPlan:
    written = written_positions(op)
    f = functional_of(op) if written else None
    args = op._schema.arguments
    out_variant = bool(written) and (f is None or args[written[0]].kwarg_only)
    low = eager_lowering(op)
    flow = eager_lowering(f) if f is not None else None
    if HOST_RANDOM and any(x is not None and x.needs_rng for x in (low, flow)):  # (drawn by the CPU generator)
        HOST_DRAWN.add(op)
        return OpPlan(op, Route.CPU, None, None, f, written, out_variant, None, host_positions(op))
    d = None
    if op in KERNELS:
        route, used = Route.KERNEL, None
    elif low is not None and f is None:
        route, used = Route.LOWERED, low
    elif flow is not None:
        route, used = (Route.OUT if args[written[0]].kwarg_only else Route.INPLACE), flow
    elif low is not None:
        route, used = Route.LOWERED, low
    elif f is not None and decomposition(f) is not None:
        route, used, d = Route.DECOMPOSED_THEN_WRITE, None, decomposition(f)
    elif (d := decomposition(op)) is not None:
        route, used = Route.DECOMPOSED, None
    else:
        route, used = Route.CPU, None
    if route is not Route.DECOMPOSED_THEN_WRITE and not written:
        d = decomposition(op)  # (offered to the traced executors for functional ops without a lowering)
    traced = None if out_variant else traced_lowering(f if written else op)
    return OpPlan(op, route, used, traced, f, written, out_variant, d, host_positions(op))


_PLANS: dict[torch._ops.OpOverload, OpPlan] = {}


def plan(op: torch._ops.OpOverload) -> OpPlan:
    """The plan of `op`, decided on first use."""
    p = _PLANS.get(op)
    if p is None:
        p = _PLANS[op] = _decide(op)
    return p


on_change(_PLANS.clear)  # (a lowering registered later changes what plans say)
on_change(_FOREACH.clear)


def eager_lowered_ops() -> list[torch._ops.OpOverload]:
    """Every op with a lowering eager dispatch may run (for registering direct kernels)."""
    return [op for op, low in LOWERINGS.items() if not low.traced_only]


class TracedTable(Mapping):
    """The lowering table as the traced executors see it (`op in table`, `table[op]`), from the plans."""

    def __getitem__(self, op: torch._ops.OpOverload) -> Lowering:
        low = traced_lowering(op) if isinstance(op, torch._ops.OpOverload) else None
        if low is None:
            raise KeyError(op)
        return low

    def __contains__(self, op: object) -> bool:
        return isinstance(op, torch._ops.OpOverload) and traced_lowering(op) is not None

    def __iter__(self) -> Iterator[torch._ops.OpOverload]:
        return iter(LOWERINGS)

    def __len__(self) -> int:
        return len(LOWERINGS)


TRACED = TracedTable()
"""The one table compiled graphs, Fused recording and tune read."""


def graph_decompositions() -> dict:
    """The decompositions AOTAutograd applies to compiled graphs: core ATen's plus GRAPH_DECOMPOSED, minus ops
    with a lowering (those stay whole)."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    extra = get_decompositions([getattr(torch.ops.aten, n) for n in GRAPH_DECOMPOSED if hasattr(torch.ops.aten, n)])
    table = {**extra, **core_aten_decompositions()}
    return {op: fn for op, fn in table.items() if op not in TRACED}


GRAPH_DECOMPOSED = (
    "_native_batch_norm_legit_functional", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "native_batch_norm_backward", "_batch_norm_with_update", "_batch_norm_with_update_functional",
    "_batch_norm_no_update",
)
"""aten ops outside the core-ATen decomposition set that compiled graphs decompose too (when not lowered)."""


def check_cast(res_dtype, out_dtype: torch.dtype, name: str) -> None:  # noqa: ANN001 - a numpy dtype
    """Raise PyTorch's error when a result of dtype `res_dtype` may not be written into an `out_dtype` tensor."""
    rt = NP_TO_TORCH[res_dtype]
    if rt != out_dtype and not torch.can_cast(rt, out_dtype):
        raise RuntimeError(f"{name}: result type {rt} can't be cast to the desired output type {out_dtype}")


def written_tensors(vals: list, written: tuple[int, ...] | list[int]) -> list[torch.Tensor]:
    """The tensors an in-place/out= op writes (`vals`: its arguments in schema order), tensor lists flattened:
    the order of `cast_results`' results."""
    out: list[torch.Tensor] = []
    for i in written:
        v = vals[i]
        if isinstance(v, list | tuple):
            out.extend(v)
        else:
            out.append(v)
    return out


def cast_results(out, dtypes: tuple[torch.dtype, ...], shapes: tuple | None, name: str) -> tuple:  # noqa: ANN001
    """The functional lowering's result(s) `out` ready to write into in-place/out= targets (`written_tensors`'
    order: result lists flattened): each checked against its target's shape (in-place ops; `shapes` None for
    out=, which resizes) and cast to its dtype."""
    outs = out if isinstance(out, tuple | list) else (out,)
    if any(isinstance(o, tuple | list) for o in outs):  # e.g. _fused_adamw: one list per written list
        outs = [x for o in outs for x in (o if isinstance(o, tuple | list) else (o,))]
    res = []
    for i, (o, dt) in enumerate(zip(outs, dtypes, strict=False)):
        if shapes is not None and tuple(o.shape) != shapes[i]:
            raise RuntimeError(f"{name}: output with shape {list(shapes[i])} doesn't match the broadcast "
                               f"shape {list(o.shape)}")
        check_cast(o.dtype, dt, name)
        res.append(o.astype(TORCH_TO_NP[dt]))
    return tuple(res)


def is_like_factory(op: torch._ops.OpOverload) -> bool:
    """`empty_like`/`zeros_like`/`randn_like`/...: a factory shaped like its input that takes `device=`."""
    return op._schema.name.endswith("_like") and any(a.name == "device" for a in op._schema.arguments)


def like_elsewhere(op: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """A `*_like` factory whose `device=` names another device than tpu, made there as PyTorch does (a template
    of the input's size and strides on that device, whose kernels honour dtype, layout, memory_format and
    generator); None when `device=` is absent or names tpu."""
    device = kwargs.get("device")
    if device is None or torch.device(device).type == "tpu":
        return None
    src = args[0]
    template = torch.empty_strided(src.size(), src.stride(), dtype=src.dtype, device=device)
    return op(template, *args[1:], **kwargs)


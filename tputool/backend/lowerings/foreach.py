"""`aten._foreach_*` lowerings synthesized from the per-element op's lowering (traced executors only: eager
mode keeps PyTorch's own per-tensor loops, which never reach the device key)."""

from __future__ import annotations

import torch

from tputool.backend.lowerings import Lowering

aten = torch.ops.aten


FOREACH_BASE_OVERLOAD: dict[str, tuple[str, ...]] = {
    "List": ("Tensor", "default"), "Scalar": ("Scalar", "Tensor", "default"), "ScalarList": ("Scalar", "Tensor", "default"),
    "Tensor": ("Tensor",), "default": ("default",), "ScalarAndTensor": ("Scalar",),
}
"""`_foreach_<op>.<overload>` -> overloads of `<op>` tried in order, applied per list element."""

FOREACH_SPECIAL: dict[str, tuple] = {
    "norm": (aten.linalg_vector_norm.default, lambda x, ord=2, dtype=None: ((x, ord, None, False), {"dtype": dtype})),
}
"""Foreach ops whose base has different arguments: name -> (base op, per-element argument builder)."""


def foreach_lowering(op: torch._ops.OpOverload, table: dict) -> Lowering | None:
    """The lowering of functional foreach op `op` applying `table`'s per-element lowering, or None."""
    name = op.overloadpacket.__name__[len("_foreach_"):]
    if name.endswith("_") or any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        return None
    if name in FOREACH_SPECIAL:
        base, build = FOREACH_SPECIAL[name]
        if base not in table:
            return None
        fn = table[base].fn

        def special(*args, **kwargs):
            return tuple(fn(*a, **k) for a, k in (build(x, *args[1:], **kwargs) for x in args[0]))

        return Lowering(special)
    pkt = getattr(aten, name, None)
    base = None
    for ov in FOREACH_BASE_OVERLOAD.get(op._overloadname, ()):
        cand = getattr(pkt, ov, None) if pkt is not None else None
        if cand is not None and cand in table:
            base = cand
            break
    if base is None:
        return None
    fn = table[base].fn
    per_element = [isinstance(a.type, torch._C.ListType) for a in op._schema.arguments if not a.kwarg_only]
    base_args = [(a.name, a.kwarg_only) for a in base._schema.arguments]

    def call(vals, kwargs):
        pos, kw = [], dict(kwargs)
        for v, (name, kwarg_only) in zip(vals, base_args, strict=False):
            if kwarg_only:
                kw[name] = v
            else:
                pos.append(v)
        return fn(*pos, **kw)

    def apply(*args, **kwargs):
        n = next(len(a) for a, listy in zip(args, per_element, strict=False) if listy)
        return tuple(call([a[i] if listy else a for a, listy in zip(args, per_element, strict=False)], kwargs)
                     for i in range(n))

    return Lowering(apply)

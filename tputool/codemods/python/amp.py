"""TPU3xx handlers: autocast, GradScaler, custom_fwd/bwd, fp16 and fp64 use."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from tputool.codemods.python.context import PortBase, keyword_args
from tputool.codemods.python.device import _commas
from tputool.codemods.python.strings import literal, replace_prefix, tpu_device_expr
from tputool.codemods.python.tables import (
    AUTOCAST_CUDA,
    AUTOCAST_GENERIC,
    CUDA_AUTOCAST_POSITIONAL,
    CUDA_GRAD_SCALERS,
    CUSTOM_FWD_BWD,
    FP16_KWARGS,
    FP16_QNAMES,
    FP16_STRING_KWARGS,
    FP16_STRINGS,
    FP64_STRINGS,
    GRAD_SCALERS,
    INT64_SORTS,
    NUMPY_FP64,
)

_N_BF16 = "CUDA autocast defaulted to float16; TPU autocast uses bfloat16 (no loss scaling needed)"


def _kw(args, name: str) -> int | None:
    return next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == name), None)


def partial_of(t: PortBase, call: cst.Call, names: frozenset[str]) -> bool:
    """True for `functools.partial(f, ...)` where `f` (an original node) is one of `names`: a callable reference
    to f, rewritten like a call of it."""
    return (t.qname(call.func) == "functools.partial" and bool(call.args) and call.args[0].keyword is None
            and not call.args[0].star and t.qname(call.args[0].value) in names)


def cuda_autocast(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU301: torch.cuda.amp.autocast(...) -> torch.autocast("tpu", dtype=torch.bfloat16, ...); so does
    `partial(torch.cuda.amp.autocast, ...)` -> `partial(torch.autocast, "tpu", dtype=torch.bfloat16, ...)`."""
    skip = 0
    if q not in AUTOCAST_CUDA:
        if not partial_of(t, orig, AUTOCAST_CUDA):
            return upd
        skip = 1  # the partial's callee; the autocast arguments follow it
    at = orig.args[0].value if skip else orig
    if any(a.star for a in upd.args[skip:]):
        t.fire("TPU301", at, fixable=False, message="torch.cuda.amp.autocast(*args/**kwargs): rewrite by hand as "
                                                    'torch.autocast("tpu", dtype=torch.bfloat16, ...)')
        return upd
    if not t.fire("TPU301", at, note=_N_BF16):
        return upd
    t.replaced(orig.args[0].value if skip else orig.func)
    kwargs = []
    for i, a in enumerate(upd.args[skip:]):
        if a.keyword is None and i < len(CUDA_AUTOCAST_POSITIONAL):
            a = a.with_changes(keyword=cst.Name(CUDA_AUTOCAST_POSITIONAL[i]),
                               equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                     whitespace_after=cst.SimpleWhitespace("")))
        kwargs.append(a)
    if _kw(kwargs, "dtype") is None:
        kwargs.insert(0, cst.Arg(keyword=cst.Name("dtype"), value=t.expr(t.torch("bfloat16")),
                                 equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                       whitespace_after=cst.SimpleWhitespace(""))))
    else:
        idx = _kw(kwargs, "dtype")
        orig_dtype = _orig_dtype(orig, skip)
        if orig_dtype is not None and t.qname(orig_dtype.value) in FP16_QNAMES and t.fire("TPU303", orig_dtype):
            kwargs[idx] = kwargs[idx].with_changes(value=t.expr(t.torch("bfloat16")))
    args = [cst.Arg(cst.SimpleString('"tpu"')), *kwargs]
    if skip:
        return upd.with_changes(args=_commas([upd.args[0].with_changes(value=t.expr(t.torch("autocast"))), *args]))
    return upd.with_changes(func=t.expr(t.torch("autocast")), args=_commas(args))


def _orig_dtype(orig: cst.Call, skip: int = 0) -> cst.Arg | None:
    for i, a in enumerate(orig.args[skip:]):
        if (a.keyword is not None and a.keyword.value == "dtype") or (a.keyword is None and i == 1):
            return a
    return None


def generic_autocast(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU302: torch.autocast("cuda"/device_type="cuda") -> "tpu" (+ bf16 when no dtype); TPU303 fp16."""
    if q not in AUTOCAST_GENERIC or not upd.args:
        return upd
    args = list(upd.args)
    d_idx = 0 if args[0].keyword is None else _kw(args, "device_type")
    dtype_idx = _kw(args, "dtype")
    if dtype_idx is None and len(args) > 1 and args[1].keyword is None:
        dtype_idx = 1
    if d_idx is not None:
        new_dev = tpu_device_expr(args[d_idx].value)
        if new_dev is not None and t.fire("TPU302", orig):
            args[d_idx] = args[d_idx].with_changes(value=new_dev)
            en_idx = _kw(args, "enabled")
            disabled = en_idx is not None and m.matches(args[en_idx].value, m.Name("False"))
            if dtype_idx is None and not disabled:  # (autocast(..., enabled=False) casts nothing: no dtype to add)
                args.append(cst.Arg(keyword=cst.Name("dtype"), value=t.expr(t.torch("bfloat16")),
                                    equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                          whitespace_after=cst.SimpleWhitespace(""))))
                args = _commas(args)
    dev_val = literal(args[d_idx].value) if d_idx is not None else None
    if dtype_idx is not None and dev_val in ("tpu", "cuda"):
        o = t.at(orig, upd, dtype_idx)
        o = o if isinstance(o, cst.Arg) else None
        if o is not None and t.qname(o.value) in FP16_QNAMES and t.fire("TPU303", o):
            args[dtype_idx] = args[dtype_idx].with_changes(value=t.expr(t.torch("bfloat16")))
    return upd.with_changes(args=args)


def grad_scaler(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU304: a CUDA GradScaler moves to tpu, keeping its arguments (enabled= too); with --unsafe-fixes it is
    also disabled (bfloat16 needs no loss scaling)."""
    if q not in GRAD_SCALERS:
        return upd
    args = list(upd.args)
    en = _kw(args, "enabled")
    if en is not None and isinstance(args[en].value, cst.Name) and args[en].value.value == "False":
        return upd
    if q not in CUDA_GRAD_SCALERS:
        dev = args[0] if args and args[0].keyword is None else (args[_kw(args, "device")]
                                                                  if _kw(args, "device") is not None else None)
        if dev is None or literal(dev.value) not in ("cuda", "tpu"):
            return upd  # a CPU scaler, or a device we cannot read
        if literal(dev.value) == "tpu" and not t.settings.unsafe_fixes:
            return upd  # already moved
    disable = t.settings.unsafe_fixes
    note = ("scaler disabled: bfloat16 needs no loss scaling; scale()/step()/update() now do plain backward/step"
            if disable else "the scaler still scales the loss as before; with bfloat16 it is not needed "
                            "(--unsafe-fixes disables it)")
    if not t.fire("TPU304", orig, note=note):
        return upd
    t.replaced(orig.func)
    keep = [a for a in args if a.keyword is not None and a.keyword.value not in ("device",)
            and not (disable and a.keyword.value == "enabled")]
    if q in CUDA_GRAD_SCALERS:  # torch.cuda.amp.GradScaler(init_scale, growth_factor, ...): positionals kept
        keep = [a for a in args if a.keyword is None] + keep
    new_args = [cst.Arg(cst.SimpleString('"tpu"')), *keep]
    if disable:
        new_args.append(cst.Arg(keyword=cst.Name("enabled"), value=cst.Name("False"),
                                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                      whitespace_after=cst.SimpleWhitespace(""))))
    return upd.with_changes(func=t.expr(t.torch("amp.GradScaler")), args=_commas(new_args))


def _device_type_arg() -> cst.Arg:
    return cst.Arg(keyword=cst.Name("device_type"), value=cst.SimpleString('"tpu"'),
                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                         whitespace_after=cst.SimpleWhitespace("")))


def custom_fwd_call(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU305: @torch.cuda.amp.custom_fwd(cast_inputs=...) -> @torch.amp.custom_fwd(device_type="tpu", ...)."""
    name = CUSTOM_FWD_BWD.get(q or "")
    if name is None or not t.fire("TPU305", orig):
        return upd
    t.replaced(orig.func)
    return upd.with_changes(func=t.expr(t.torch(f"amp.{name}")), args=_commas([_device_type_arg(), *upd.args]))


def decorator(t: PortBase, orig: cst.Decorator, upd: cst.Decorator) -> cst.Decorator:
    """TPU305 bare @custom_fwd/@custom_bwd; TPU415 bare @torch.compile."""
    q = t.qname(orig.decorator) if isinstance(orig.decorator, cst.Name | cst.Attribute) else None
    if q in CUSTOM_FWD_BWD and t.fire("TPU305", orig.decorator):
        t.replaced(orig.decorator)
        call = cst.Call(func=t.expr(t.torch(f"amp.{CUSTOM_FWD_BWD[q]}")), args=[_device_type_arg()])
        return upd.with_changes(decorator=call)
    if q == "torch.compile" and t.fire("TPU415", orig.decorator):
        arg = cst.Arg(keyword=cst.Name("backend"), value=cst.SimpleString('"tpu"'),
                      equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                            whitespace_after=cst.SimpleWhitespace("")))
        return upd.with_changes(decorator=cst.Call(func=upd.decorator, args=[arg]))
    return upd


def _moved_to_host(expr: cst.BaseExpression) -> bool:
    """Whether a method chain's last device move is to the host (`x.cpu().double()`, `x.to("cpu").sum()`): a float64
    made from it stays on the CPU."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        name = expr.func.attr.value
        if name == "cpu":
            return True
        if name in ("to", "cuda", "tpu"):
            first = expr.args[0].value if expr.args else None
            return isinstance(first, cst.SimpleString) and first.evaluated_value == "cpu"
        expr = expr.func.value
    return False


def precision_methods(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU306 .half() (unsafe -> .bfloat16()), TPU307 .double(), TPU308 int64 sorts."""
    func = upd.func
    if not isinstance(func, cst.Attribute) or t.foreign(orig.func.value):
        return upd
    name = func.attr.value
    if name == "half" and not upd.args:
        from tputool.codemods.python.api import fp16_is_deliberate

        if not fp16_is_deliberate(t, orig) and t.fire("TPU306", orig):
            return upd.with_changes(func=func.with_changes(attr=cst.Name("bfloat16")))
    elif name == "double" and not upd.args:
        from tputool.codemods.python.api import fp64_is_deliberate

        if t.uses_accelerator and not fp64_is_deliberate(t, orig) and not _moved_to_host(orig.func.value):
            t.fire("TPU307", orig)
    elif name in INT64_SORTS:
        recv = orig.func.value
        if isinstance(recv, cst.Call) and isinstance(recv.func, cst.Attribute) and recv.func.attr.value == "long":
            t.fire("TPU308", orig)
    return upd


def dtype_kwargs(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU306 fp16=True / dtype="float16" / mixed_precision="fp16"; TPU307 dtype="float64"/np.float64."""
    args = list(upd.args)
    changed = False
    for i, a, kw in keyword_args(args):
        if kw in FP16_KWARGS and isinstance(a.value, cst.Name) and a.value.value == "True":
            new_kw = FP16_KWARGS[kw]
            if t.fire("TPU306", t.at(orig, upd, i), fixable=new_kw is not None) and new_kw:
                args[i] = a.with_changes(keyword=cst.Name(new_kw))
                changed = True
        elif kw in FP16_STRING_KWARGS or kw == "dtype":
            v = literal(a.value)
            if v in FP16_STRINGS and kw in FP16_STRING_KWARGS:
                if t.fire("TPU306", t.at(orig, upd, i)):
                    args[i] = a.with_changes(value=replace_prefix(a.value, v, FP16_STRINGS[v]))
                    changed = True
            elif v in FP64_STRINGS or t.qname(getattr(t.at(orig, upd, i), "value", orig)) in NUMPY_FP64:
                numpy_call = (q or "").startswith("numpy.") or (
                    isinstance(orig.func, cst.Attribute) and orig.func.attr.value == "astype")
                from tputool.codemods.python.api import fp64_is_deliberate

                if t.uses_accelerator and not numpy_call and not fp64_is_deliberate(t, orig):
                    t.fire("TPU307", t.at(orig, upd, i))
    return upd.with_changes(args=args) if changed else upd

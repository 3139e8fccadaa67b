"""TPU6xx handlers: performance lints (host syncs in loops, dynamic shapes, MXU-unfriendly sizes, GPU FLOPs)."""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from tputool.codemods.python.context import PortBase
from tputool.codemods.python.tables import DIM_NAMES, DYNAMIC_SHAPE_FUNCS, GPU_MODEL_RE, HOST_SYNC_METHODS

_COMPS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)


def _in_loop(t: PortBase, node: cst.CSTNode) -> bool:
    """True when an original node runs once per iteration of an enclosing loop of the same function."""
    child, cur = node, t.parent(node)
    while cur is not None:
        if isinstance(cur, cst.FunctionDef | cst.ClassDef | cst.Lambda):
            return False
        if isinstance(cur, cst.For | cst.While) and child is cur.body:
            return True
        if isinstance(cur, _COMPS) and child is not getattr(cur, "for_in", None):
            return True
        child, cur = cur, t.parent(cur)
    return False


_MODULE_NAME = re.compile(r"(model|module|net|ema|encoder|decoder|state_dict)", re.I)


def _periodic(t: PortBase, node: cst.CSTNode) -> bool:
    """True under `if step % N == 0:` (logging or checkpointing every N steps, not every iteration)."""
    cur = t.parent(node)
    while cur is not None and not isinstance(cur, cst.For | cst.While | cst.FunctionDef):
        if isinstance(cur, cst.If) and m.findall(cur.test, m.BinaryOperation(operator=m.Modulo())):
            return True
        cur = t.parent(cur)
    return False


def _module_to_host(method: str, receiver: cst.BaseExpression) -> bool:
    """`model.cpu()` / `model.state_dict()...`: a module moved for saving, not a tensor read every step."""
    if method != "cpu":
        return False
    name = receiver.attr.value if isinstance(receiver, cst.Attribute) else (
        receiver.value if isinstance(receiver, cst.Name) else "")
    return bool(_MODULE_NAME.search(name))


def call_lints(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU601 .item()/.cpu()/.tolist()/.numpy() inside loops; TPU602 data-dependent-shape ops."""
    func = orig.func
    if isinstance(func, cst.Attribute):
        name = func.attr.value
        if t.foreign(func.value):
            return upd
        if name in HOST_SYNC_METHODS and not orig.args and _in_loop(t, orig):
            if t.uses_accelerator and not _periodic(t, orig) and not _module_to_host(name, func.value):
                t.fire("TPU601", orig, message=f".{name}() inside a loop forces a host sync every iteration")
            return upd
    else:
        name = func.value if isinstance(func, cst.Name) else ""
    is_torch_fn = q is not None and q.startswith("torch.") and q.rsplit(".", 1)[-1] == name
    if name in DYNAMIC_SHAPE_FUNCS and (is_torch_fn or isinstance(func, cst.Attribute)):
        t.fire("TPU602", orig, message=f"{name}() has a data-dependent output shape (recompiles on TPU)")
    elif name == "where" and is_torch_fn and len(orig.args) == 1:
        t.fire("TPU602", orig, message="one-argument torch.where() has a data-dependent output shape")
    for a in orig.args:
        if a.keyword is not None and a.keyword.value in DIM_NAMES:
            _dim(t, a, a.value)
    return upd


def _dim(t: PortBase, at: cst.CSTNode, value: cst.BaseExpression) -> None:
    if isinstance(value, cst.Integer):
        v = int(value.evaluated_value)
        if v >= 8 and v % 128 and "TPU603" not in t.reported_once:
            t.reported_once.add("TPU603")  # architecture constants repeat through a model file: the first says it
            t.fire("TPU603", at, message=f"size {v} is not a multiple of 128 (pads the TPU MXU); reported once "
                                         "per file")


def _number(node: cst.BaseExpression) -> float | None:
    if isinstance(node, cst.Integer | cst.Float):
        return float(node.evaluated_value)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply | cst.Power):
        a, b = _number(node.left), _number(node.right)
        if a is None or b is None:
            return None
        try:
            return a * b if isinstance(node.operator, cst.Multiply) else a ** b
        except OverflowError:
            return None
    return None


def assign_lints(t: PortBase, orig: cst.Assign | cst.AnnAssign, upd: cst.Assign | cst.AnnAssign
                 ) -> cst.Assign | cst.AnnAssign:
    """TPU603 head_dim = 64; TPU604 flops_promised = 312e12 (# A100) (findings only: `upd` comes back)."""
    if orig.value is None:
        return upd
    targets = [orig.target] if isinstance(orig, cst.AnnAssign) else [x.target for x in orig.targets]
    names = [x.value if isinstance(x, cst.Name) else x.attr.value for x in targets
             if isinstance(x, cst.Name | cst.Attribute)]
    if any(n in DIM_NAMES for n in names):
        _dim(t, orig, orig.value)
    n = _number(orig.value)
    if n is None or not n >= 1e12:  # both TPU604 conditions need n >= 1e12; checked before the position
        return upd
    line = t.pos(orig)[0]
    text = t.lines[line - 1] if 0 < line <= len(t.lines) else ""
    comment = text.split("#", 1)[1] if "#" in text else ""
    flops_name = any("flop" in x.lower() for x in names)
    if flops_name or GPU_MODEL_RE.search(comment):
        t.fire("TPU604", orig)
    return upd


def dict_lints(t: PortBase, orig: cst.Dict, upd: cst.BaseExpression) -> cst.BaseExpression:
    """TPU603 in config dicts: {"head_dim": 64} (findings only: `upd` comes back)."""
    from tputool.codemods.python.strings import literal

    for e in orig.elements:
        if isinstance(e, cst.DictElement) and (literal(e.key) or "") in DIM_NAMES:
            _dim(t, e, e.value)
    return upd

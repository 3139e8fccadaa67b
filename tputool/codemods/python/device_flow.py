"""Which expressions hold a device: the port moves a device value and every test on it together.

A comparison with 'cuda' (TPU109), a map keyed by device type or a `'cuda' if ... else 'cpu'` choice is rewritten
safely only when the other side is known to be a device: a name or attribute named like one (`device`,
`device_type`, `args.device`, `x.device.type`), `str(d)` of one, any `d.type` read as a value, `torch.device(...)`, or a name
this module assigns from such a value (`dev = batch.device`). Anything else is left and reported.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from tputool.codemods.python.strings import is_cuda_device, literal
from tputool.codemods.python.tables import DEVICE_NAME_RE

# Device types a map keyed by device may hold next to 'cuda'.
DEVICE_TYPES = frozenset({"cuda", "cpu", "mps", "xpu", "hpu", "tpu", "xla", "meta", "npu", "mtia"})


def _last_name(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def is_device(node: cst.CSTNode, names: frozenset[str] = frozenset()) -> bool:
    """True when `node` (original or updated) evaluates to a device, a device type or a device string."""
    if isinstance(node, cst.Name):
        return node.value in names or DEVICE_NAME_RE.search(node.value) is not None
    if isinstance(node, cst.Attribute):
        attr = node.attr.value
        if DEVICE_NAME_RE.search(attr):
            return True
        return attr == "type"  # `d.type`: torch.device's type (a tensor's .type is a method, called)
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        key = node.slice[0].slice
        return isinstance(key, cst.Index) and DEVICE_NAME_RE.search(literal(key.value) or "-") is not None
    if isinstance(node, cst.Call):
        fn = node.func
        name = _last_name(fn)
        if name == "str" and len(node.args) == 1:
            return is_device(node.args[0].value, names)
        if name == "device" and isinstance(fn, cst.Attribute):
            return True  # torch.device(...)
        if name == "getattr" and len(node.args) >= 2:
            return DEVICE_NAME_RE.search(literal(node.args[1].value) or "-") is not None
        if name in ("get", "getenv") and node.args:
            return DEVICE_NAME_RE.search(literal(node.args[0].value) or "-") is not None
    return is_cuda_device(node)


def assigned_device_names(module: cst.Module) -> frozenset[str]:
    """Plain names the module assigns from a device value (`dev = x.device`, `d = torch.device('cuda')`)."""
    return names_from_assigns(device_assigns(module))


class _AnyName(frozenset):
    """Holds every name: `is_device(value, _ANY)` is False only for a value no set of names makes a device."""

    def __contains__(self, name: object) -> bool:
        return True


_ANY = _AnyName()


def device_assigns(module: cst.Module) -> list[tuple[str, cst.BaseExpression]]:
    """(name, value) of the module's `name = value` statements, in order, leaving out those whose value is a
    device under no set of names (they never count); names_from_assigns() reads the names from them."""
    out = []
    for a in m.findall(module, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        if not isinstance(a, cst.Assign):
            continue
        value = a.value
        parts = (value.body, value.orelse) if isinstance(value, cst.IfExp) else (value,)
        if any(is_device(p, _ANY) for p in parts) or _is_device_string(value):
            out.append((a.targets[0].target.value, value))
    return out


def names_from_assigns(assigns: list[tuple[str, cst.BaseExpression]]) -> frozenset[str]:
    """The names assigned from a device value, following one hop of `d2 = d`, from device_assigns()."""
    names: set[str] = set()
    for _ in range(2):  # one hop of `d2 = d` is enough in practice
        for target, value in assigns:
            if isinstance(value, cst.IfExp):
                if is_device(value.body, frozenset(names)) or is_device(value.orelse, frozenset(names)):
                    names.add(target)
            elif is_device(value, frozenset(names)) or _is_device_string(value):
                names.add(target)
    return frozenset(names)


def _is_device_string(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.FormattedString) and node.parts:
        first = node.parts[0]
        return isinstance(first, cst.FormattedStringText) and first.value.startswith(("cuda:", "cpu:"))
    return False


def keyed_by_device(d: cst.Dict) -> bool:
    """True for a dict literal whose keys are device types, one of them 'cuda' (and none 'tpu')."""
    keys = [literal(e.key) for e in d.elements if isinstance(e, cst.DictElement)]
    if "cuda" not in keys or "tpu" in keys or any(k is None for k in keys):
        return False
    return len(keys) > 1 and all(k in DEVICE_TYPES for k in keys)

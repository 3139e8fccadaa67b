"""TPU1xx handlers: device placement (.cuda(), .to("cuda"), device= arguments, device strings and checks)."""

from __future__ import annotations

import libcst as cst

from tputool.codemods.python.context import PortBase, keyword_args
from tputool.codemods.python.device_flow import DEVICE_TYPES, is_device, keyed_by_device
from tputool.codemods.python.strings import (
    is_cuda_device,
    literal,
    replace_prefix,
    tpu_device_expr,
    tpu_dynamic_string,
)
from tputool.codemods.python.tables import (
    AUTOCAST_GENERIC,
    DEVICE_KWARG_RE,
    DEVICE_NAME_RE,
    DEVICE_VALUE_RE,
    NOT_DEVICE_KWARGS,
    RANK_NAME_RE,
    RENAME,
)

_N_CUDA = "call site rewritten; .to() returns the moved tensor (a module moves in place) like .cuda()"
_N_INDEX = "check that the index means a local TPU chip"


def _last_name(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def _is_rank_like(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Integer):
        return True
    name = _last_name(node)
    return name is not None and RANK_NAME_RE.match(name) is not None


def _device_of_index(t: PortBase, value: cst.BaseExpression) -> cst.BaseExpression:
    """An argument of .cuda(x) as a TPU device: literal strings swapped, device variables kept."""
    if isinstance(value, cst.SimpleString):
        return tpu_device_expr(value) or value
    name = _last_name(value)
    if name is not None and DEVICE_VALUE_RE.search(name):
        return value
    return t.expr(f'{t.torch("device")}("tpu", {t.code(value)})')


def own_cuda_method(t: PortBase, node: cst.FunctionDef, upd: cst.FunctionDef) -> cst.FunctionDef:
    """TPU101 (report): a class of the user's defines its own `cuda()` method. Port rewrites `x.cuda()` calls to
    `x.to("tpu")`, which such a class may not have; give it a `to(device)` method (or rename the call)."""
    cls = t.parent(t.parent(node))
    if node.name.value != "cuda" or not isinstance(cls, cst.ClassDef):
        return upd
    if _defines_to(cls) or "cuda" not in t.whole_code(node.body):
        return upd  # the class has its own `to`, or its cuda() was already ported (the file was ported before)
    params = node.params.params
    if params and params[0].name.value in ("self", "cls"):
        t.fire("TPU101", node, fixable=False,
               message="this class defines its own cuda(); port rewrites `.cuda()` calls to `.to(\"tpu\")`, so give "
                       "the class a `to(device)` method (or keep the calls on its objects by hand)")
    return upd


def _defines_to(cls: cst.ClassDef) -> bool:
    """True when a class body defines a `to` method (so `obj.to("tpu")` calls the class's own)."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return any(isinstance(s, cst.FunctionDef) and s.name.value == "to" for s in body)


def cuda_method(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU101/102/103: x.cuda(...) -> x.to("tpu"/torch.device("tpu", i), ...)."""
    func = upd.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "cuda"):
        return upd
    if t.foreign(orig.func.value):  # a module's .cuda (numba.cuda, cupy.cuda) is not a tensor method
        return upd
    args = list(upd.args)
    dev_idx = next((i for i, a in enumerate(args) if a.keyword is None or a.keyword.value == "device"), None)
    if any(a.star for a in args):
        return upd
    if dev_idx is None:
        only_nb = bool(args) and all(a.keyword is not None and a.keyword.value == "non_blocking" for a in args)
        code = "TPU103" if only_nb else "TPU101"
        if not t.fire(code, orig, note=None if only_nb else _N_CUDA):
            return upd
        new_args = [cst.Arg(cst.SimpleString('"tpu"')), *args]
    else:
        if not t.fire("TPU102", orig, note=_N_INDEX):
            return upd
        dev = _device_of_index(t, args[dev_idx].value)
        rest = [a for i, a in enumerate(args) if i != dev_idx]
        new_args = [cst.Arg(dev, comma=args[dev_idx].comma if dev_idx == 0 else cst.MaybeSentinel.DEFAULT), *rest]
    keeps_last = bool(args) and (new_args[-1] is args[-1] or (dev_idx == 0 and len(args) == 1))
    last = args[-1].comma if keeps_last else cst.MaybeSentinel.DEFAULT
    return upd.with_changes(func=func.with_changes(attr=cst.Name("to")), args=_commas(new_args, last))


def _commas(args: list[cst.Arg], last_comma=cst.MaybeSentinel.DEFAULT) -> list[cst.Arg]:
    """Arguments separated by commas (an argument's own comma is kept, so comments after it survive)."""
    out = []
    for i, a in enumerate(args):
        if i == len(args) - 1:
            comma = last_comma
        elif isinstance(a.comma, cst.Comma):
            comma = a.comma
        else:
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        out.append(a.with_changes(comma=comma))
    return out


def _rewrite_arg(t: PortBase, code: str, orig_node: cst.CSTNode, arg: cst.Arg, note: str | None = None
                 ) -> cst.Arg | None:
    new = tpu_device_expr(arg.value)
    if new is None or not t.fire(code, orig_node, note=note):
        return None
    return arg.with_changes(value=new)


def to_call(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU104 .to("cuda") and TPU110 .to(0) / .to(local_rank)."""
    func = upd.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "to") or not upd.args:
        return upd
    args = list(upd.args)
    for i, a in enumerate(args):
        if (a.keyword is None and i == 0) or (a.keyword is not None and a.keyword.value == "device"):
            new = _rewrite_arg(t, "TPU104", t.at(orig, upd, i), a)
            if new is not None:
                args[i] = new
                return upd.with_changes(args=args)
            if a.keyword is None and _is_rank_like(a.value) and not isinstance(a.value, cst.SimpleString):
                if t.fire("TPU110", t.at(orig, upd, i)):
                    args[i] = a.with_changes(value=t.expr(f'{t.torch("device")}("tpu", {t.code(a.value)})'))
                    return upd.with_changes(args=args)
            break
    return upd


def device_kwargs(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU105 device="cuda" (and device_type=, *_device=) on any call; TPU112 map_location; TPU116."""
    func = upd.func
    is_to = isinstance(func, cst.Attribute) and func.attr.value == "to"
    args = list(upd.args)
    changed = False
    for i, a, kw in keyword_args(args):
        if kw == "map_location":
            v = a.value
            if isinstance(v, cst.Lambda):
                continue  # `lambda s, loc: s` loads on the CPU; a body's .cuda() is ported like any other
            if isinstance(v, cst.Dict):
                if "cuda" in t.code(t.at(orig, upd, i)):
                    t.fire("TPU112", t.at(orig, upd, i), fixable=False,
                           message="dict map_location maps CUDA devices: load on 'cpu', then move with .to('tpu')")
                continue
            new = _rewrite_arg(t, "TPU112", t.at(orig, upd, i), a, note="tensors saved on GPU now load onto the TPU")
        elif kw == "pin_memory_device":
            if is_cuda_device(a.value) and t.fire("TPU116", t.at(orig, upd, i)):
                args[i] = None  # type: ignore[call-overload]
                changed = True
            continue
        elif kw in NOT_DEVICE_KWARGS or not DEVICE_KWARG_RE.match(kw) or (is_to and kw == "device"):
            continue
        elif q == "torch.device" or (kw == "device_type" and q in AUTOCAST_GENERIC):
            continue
        else:
            new = _rewrite_arg(t, "TPU105", t.at(orig, upd, i), a)
        if new is not None:
            args[i] = new
            changed = True
    if not changed:
        return upd
    kept = [a for a in args if a is not None]
    return upd.with_changes(args=_commas(kept) if len(kept) != len(args) else kept)


def torch_device(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU106 torch.device("cuda"...) and TPU110 torch.device(0)."""
    if q not in ("torch.device", "torch.set_default_device") or not upd.args:
        return upd
    code = "TPU106" if q == "torch.device" else "TPU113"
    args = list(upd.args)
    a = args[0]
    if a.keyword is not None and a.keyword.value not in ("type", "device"):
        return upd
    new = _rewrite_arg(t, code, t.at(orig, upd, 0), a)
    if new is not None:
        args[0] = new
        return upd.with_changes(args=args)
    if q == "torch.device" and len(args) == 1 and a.keyword is None and _is_rank_like(a.value):
        if t.fire("TPU110", t.at(orig, upd, 0)):
            return upd.with_changes(args=_commas([cst.Arg(cst.SimpleString('"tpu"')), a]))
    return upd


def set_device_arg(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU201/TPU202/...: a 'cuda:N' first argument of a torch.cuda call renamed to torch.tpu
    (`set_device("cuda:1")`, `get_device_properties("cuda")`, `memory_allocated("cuda:0")`) becomes 'tpu:N', so the
    call moves whole (the module and its device together)."""
    from tputool.codemods.python.api import lookup

    hit = lookup(q) if q and q.startswith("torch.cuda.") and upd.args and upd.args[0].keyword is None else None
    if hit is None or hit[1].kind != RENAME or not (hit[1].target or "").startswith("torch.tpu."):
        return upd
    if t.code(upd.func) == t.code(orig.func):
        return upd  # the call was kept as CUDA (not renamed): its argument stays too
    new = tpu_device_expr(upd.args[0].value)
    if new is None or not t.fire(hit[1].code, orig):
        return upd
    return upd.with_changes(args=[upd.args[0].with_changes(value=new), *upd.args[1:]])


def argparse_call(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU108 argparse default='cuda' / choices=[..., 'cuda']; TPU406 --dist-backend nccl; TPU419 --no-cuda."""
    func = upd.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "add_argument"):
        return upd
    flags = [literal(a.value) or "" for a in upd.args if a.keyword is None]
    if any(f in ("--no-cuda", "--no_cuda", "--cuda", "--use-cuda", "--use_cuda") for f in flags) \
            and not t.mentions_tpu:
        t.fire("TPU419", orig)
    args = list(upd.args)
    changed = False
    for i, a in enumerate(args):
        kw = a.keyword.value if a.keyword is not None else None
        if kw in ("default", "const"):
            if literal(a.value) == "inductor" and any("compile" in f or "backend" in f for f in flags):
                if t.fire("TPU415", t.at(orig, upd, i)):
                    args[i] = a.with_changes(value=replace_prefix(a.value, "inductor", "tpu"))
                    changed = True
                continue
            if literal(a.value) == "nccl":
                if t.fire("TPU406", t.at(orig, upd, i)):
                    args[i] = a.with_changes(value=replace_prefix(a.value, "nccl", "tpu"))
                    changed = True
                continue
            new = tpu_device_expr(a.value)
            if new is not None and t.fire("TPU108", t.at(orig, upd, i), note="update the option's help text"):
                args[i] = a.with_changes(value=new)
                changed = True
        elif kw == "choices" and isinstance(a.value, cst.List | cst.Tuple | cst.Set):
            elems = list(a.value.elements)
            hits = [j for j, e in enumerate(elems) if literal(e.value) == "cuda"]
            has_tpu = any(literal(e.value) == "tpu" for e in elems)
            if hits and not has_tpu and t.fire("TPU108", t.at(orig, upd, i), note="update the option's help text"):
                for j in hits:
                    elems[j] = elems[j].with_changes(value=replace_prefix(elems[j].value, "cuda", "tpu"))
                args[i] = a.with_changes(value=a.value.with_changes(elements=elems))
                changed = True
    return upd.with_changes(args=args) if changed else upd


def startswith_check(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU109: str(d).startswith('cuda')."""
    func = upd.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in ("startswith", "endswith")) or not upd.args:
        return upd
    a = upd.args[0]
    safe = is_device(orig.func.value, t.device_names()) or None
    if literal(a.value) in ("cuda", "cuda:") and t.fire("TPU109", orig, safe=safe):
        return upd.with_changes(args=[a.with_changes(value=replace_prefix(a.value, "cuda", "tpu")),
                                      *upd.args[1:]])
    return upd


def is_cuda_attr(t: PortBase, orig: cst.Attribute, upd: cst.Attribute) -> cst.BaseExpression:
    """TPU111: t.is_cuda -> (t.device.type == "tpu"), parenthesised unless the context makes it unneeded."""
    if upd.attr.value != "is_cuda":
        return upd
    if t.foreign(orig.value):
        return upd
    parent = t.parent(orig)
    if isinstance(parent, cst.Assign | cst.AssignTarget) and getattr(parent, "target", None) is orig:
        return upd
    if isinstance(parent, cst.Call) and parent.func is orig:
        return upd  # `x.is_cuda()` is some other API, not the tensor property
    from tputool.codemods.python.cuda_only import guarded_cuda_only

    what = guarded_cuda_only(t, orig)
    if what is not None:
        t.fire("TPU220", orig, fixable=False,
               message=f"`.is_cuda` guards CUDA-only code ({what}): kept, so that code is skipped on TPU as on any "
                       "machine without CUDA")
        t.hold(orig)
        return upd
    if not t.fire("TPU111", orig):
        return upd
    text = f'{t.code(upd.value)}.device.type == "tpu"'
    bare_ok = isinstance(parent, cst.If | cst.While | cst.Assert | cst.Return | cst.BooleanOperation | cst.Arg
                         | cst.Assign | cst.AnnAssign | cst.IfExp) or (
        isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not))
    if isinstance(parent, cst.IfExp) and parent.test is not orig:
        bare_ok = False
    node = t.expr(text if bare_ok else f"({text})")
    return node


def availability_test(t: PortBase, test: cst.BaseExpression) -> bool:
    """True when a condition calls torch.cuda.is_available() or device_count() (ported to torch.tpu's)."""
    import libcst.matchers as m

    for call in m.findall(test, m.Call()):
        if t.qname(call.func) in ("torch.cuda.is_available", "torch.cuda.device_count"):
            return True
    return False


def ifexp(t: PortBase, orig: cst.IfExp, upd: cst.IfExp) -> cst.BaseExpression:
    """TPU114: 'cuda' if torch.cuda.is_available() else 'cpu'."""
    if not (is_cuda_device(upd.body) or is_cuda_device(upd.orelse)) or not availability_test(t, orig.test):
        return upd
    if not t.fire("TPU114", orig):
        return upd
    return upd.with_changes(body=tpu_device_expr(upd.body) or upd.body,
                            orelse=tpu_device_expr(upd.orelse) or upd.orelse)


def dynamic_string(t: PortBase, orig: cst.BaseExpression, upd: cst.BaseExpression) -> cst.BaseExpression:
    """TPU107: f"cuda:{rank}", "cuda:%d" % i, "cuda:" + str(i) (the .format form is a call handler)."""
    new = tpu_dynamic_string(upd)
    if new is None or not t.fire("TPU107", orig, note=_N_INDEX):
        return upd
    return new


def format_call(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU107: 'cuda:{}'.format(gpu)."""
    if not (isinstance(upd.func, cst.Attribute) and upd.func.attr.value == "format"):
        return upd
    return dynamic_string(t, orig, upd)


def _target_is_device(target: cst.BaseExpression) -> bool:
    name = _last_name(target)
    return name is not None and DEVICE_NAME_RE.search(name) is not None


def assign_default(t: PortBase, orig: cst.Assign | cst.AnnAssign, upd: cst.Assign | cst.AnnAssign
                   ) -> cst.BaseSmallStatement:
    """TPU108: device = 'cuda' (a variable/attribute named like a device)."""
    if upd.value is None:
        return upd
    targets = [upd.target] if isinstance(upd, cst.AnnAssign) else [a.target for a in upd.targets]
    if not any(_target_is_device(x) for x in targets):
        return upd
    new = tpu_device_expr(upd.value)
    if new is None or not t.fire("TPU108", orig, note="check every place that reads this value"):
        return upd
    return upd.with_changes(value=new)


def param_default(t: PortBase, orig: cst.Param, upd: cst.Param) -> cst.Param:
    """TPU108: def f(device='cuda')."""
    if upd.default is None or not DEVICE_NAME_RE.search(upd.name.value):
        return upd
    new = tpu_device_expr(upd.default)
    if new is None or not t.fire("TPU108", orig):
        return upd
    return upd.with_changes(default=new)


def dict_default(t: PortBase, orig: cst.Dict, upd: cst.Dict) -> cst.BaseExpression:
    """TPU108: {"device": "cuda"} in a config dict; TPU109: a map keyed by device type gets a 'tpu' key."""
    elems = list(upd.elements)
    changed = False
    keyed = keyed_by_device(orig)
    for i, e in enumerate(elems):
        if not isinstance(e, cst.DictElement):
            continue
        if keyed and literal(e.key) == "cuda":
            if t.fire("TPU109", orig.elements[i], safe=True,
                      message="a map keyed by device type: its 'cuda' entry becomes the 'tpu' entry"):
                value = replace_prefix(e.value, "nccl", "tpu") if literal(e.value) == "nccl" else e.value
                elems[i] = e.with_changes(key=replace_prefix(e.key, "cuda", "tpu"), value=value)
                changed = True
        elif DEVICE_NAME_RE.search(literal(e.key) or "-"):
            new = tpu_device_expr(e.value)
            if new is not None and t.fire("TPU108", orig.elements[i]):
                elems[i] = e.with_changes(value=new)
                changed = True
    return upd.with_changes(elements=elems) if changed else upd


def lookup_default(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU108: a 'cuda' default of getattr(args, "device", ...), os.environ.get(..) / os.getenv(..), d.get("device", ..)."""
    func = upd.func
    name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
    pos = {"getattr": 2, "get": 1, "getenv": 1, "setdefault": 1}.get(name or "")
    if pos is None or len(upd.args) <= pos or any(a.keyword is not None or a.star for a in upd.args[:pos + 1]):
        return upd
    key = literal(upd.args[pos - 1].value)
    env = q in ("os.environ.get", "os.getenv", "os.environ.setdefault")
    if not env and not DEVICE_NAME_RE.search(key or "-"):
        return upd
    new = tpu_device_expr(upd.args[pos].value)
    if new is None or not t.fire("TPU108", t.at(orig, upd, pos), note="check every place that reads this value"):
        return upd
    args = list(upd.args)
    args[pos] = args[pos].with_changes(value=new)
    return upd.with_changes(args=args)


def _adds_privateuse1(t: PortBase, orig: cst.CSTNode) -> bool:
    """Whether the function holding `orig` also names the PrivateUse1 backend (`torch._C._get_privateuse1_backend_name()`:
    'tpu' under TorchTPU), as torch.optim's and timm's lists of capturable devices append it to theirs."""
    cur = t.parent(orig)
    while cur is not None and not isinstance(cur, cst.FunctionDef | cst.Module):
        cur = t.parent(cur)
    return cur is not None and "_get_privateuse1_backend_name" in t.whole_code(cur)


def sequence_devices(t: PortBase, orig: cst.List | cst.Tuple | cst.Set, upd: cst.List | cst.Tuple | cst.Set) -> cst.BaseExpression:
    """TPU108: 'cuda:N' strings (an explicit device index) as elements of a tuple or list, e.g. `("cuda:0",) + args`."""
    parent = t.parent(orig)
    if isinstance(parent, cst.ComparisonTarget | cst.Comparison) or (
            isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "choices"):
        return upd
    elems = list(upd.elements)
    hits = [j for j, e in enumerate(elems) if (literal(e.value) or "").startswith("cuda:") and is_cuda_device(e.value)]
    if not hits:
        kinds = [literal(e.value) for e in elems]
        if len(kinds) > 1 and "cuda" in kinds and "tpu" not in kinds and all(k in DEVICE_TYPES for k in kinds) \
                and not _adds_privateuse1(t, orig):
            t.fire("TPU109", orig, fixable=False,
                   message="a list of device types names 'cuda' but not 'tpu': add 'tpu' if what it lists holds on TPU")
        return upd
    if not t.fire("TPU108", orig.elements[hits[0]], note="check every place that reads this value"):
        return upd
    for j in hits:
        elems[j] = elems[j].with_changes(value=replace_prefix(elems[j].value, "cuda", "tpu"))
    return upd.with_changes(elements=elems)


def _swap(node: cst.BaseExpression, word: str, new_word: str) -> cst.BaseExpression | None:
    """`word` -> `new_word` in a literal or in the literal elements of a list/tuple/set, else None."""
    v = literal(node)
    if v is not None and (v == word or (word == "cuda" and is_cuda_device(node))):
        return replace_prefix(node, word, new_word)
    if isinstance(node, cst.List | cst.Tuple | cst.Set):
        elems = list(node.elements)
        idx = [j for j, e in enumerate(elems) if literal(e.value) == word]
        if idx:
            for j in idx:
                elems[j] = elems[j].with_changes(value=replace_prefix(elems[j].value, word, new_word))
            return node.with_changes(elements=elems)
    return None


def _backend_like(node: cst.CSTNode) -> bool:
    name = _last_name(node.func) if isinstance(node, cst.Call) else _last_name(node)
    return name is not None and ("backend" in name.lower())


def comparison(t: PortBase, orig: cst.Comparison, upd: cst.Comparison) -> cst.BaseExpression:
    """TPU109 comparisons with 'cuda'; TPU407 comparisons with 'nccl'.

    The fix swaps the literal; it is safe where every other operand is a device (TPU109) or a backend name
    (TPU407), since the port moves that value to 'tpu' too, and unsafe elsewhere.
    """
    operands = [orig.left, *(c.comparator for c in orig.comparisons)]
    for word, code, new_word, like in (("cuda", "TPU109", "tpu", lambda n: is_device(n, t.device_names())),
                                       ("nccl", "TPU407", "tpu", _backend_like)):
        hit = False
        left = upd.left
        comps = list(upd.comparisons)

        new_left = _swap(left, word, new_word) if isinstance(left, cst.SimpleString) else None
        hit = new_left is not None
        new_comps = []
        for c in comps:
            n = _swap(c.comparator, word, new_word)
            hit = hit or n is not None
            new_comps.append(c.with_changes(comparator=n) if n is not None else c)
        if not hit:
            continue
        others = [o for o in operands if _swap(o, word, new_word) is None]
        safe = bool(others) and all(like(o) for o in others)
        if t.fire(code, orig, safe=safe or None):
            upd = upd.with_changes(left=new_left or left, comparisons=new_comps)
    return upd


def modulo_device_count(t: PortBase, orig: cst.BinaryOperation, upd: cst.BaseExpression) -> cst.BaseExpression:
    """TPU110: rank % torch.cuda.device_count() used as a device index (finding only)."""
    if isinstance(orig.operator, cst.Modulo) and isinstance(orig.right, cst.Call) \
            and t.qname(orig.right.func) == "torch.cuda.device_count":
        t.fire("TPU110", orig, fixable=False,
               message="rank % device_count() as a device index; use torch.device('tpu', rank % n)")
    return upd

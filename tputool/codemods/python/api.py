"""TPU2xx and reference handlers: qualified-name renames/findings, statement removal, `with` unwrapping."""

from __future__ import annotations

import re

import libcst as cst

from tputool.codemods.python.context import PortBase
from tputool.codemods.python.strings import literal
from tputool.codemods.python.tables import (
    ASSIGN,
    ASSIGN_TARGETS,
    AUTOCAST_CUDA,
    AUTOCAST_GENERIC,
    BUILTIN_OP_NAMESPACES,
    CUDA_CATCH_ALL,
    CUDA_ENV_EXACT,
    CUDA_ENV_PREFIXES,
    CUDA_VISIBLE,
    FIND,
    FP16_QNAMES,
    OWNED,
    REFS,
    STATEMENT_CALLS,
    WITH_UNWRAP,
    Ref,
)
from tputool.rules.model import Severity
from tputool.rules.port import RULES


def lookup(q: str) -> tuple[str, Ref] | None:
    """The longest REFS prefix of qualified name `q` and its entry."""
    parts = q.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        ref = REFS.get(key)
        if ref is not None:
            return key, ref
    return None


def prefix_match(q: str, table: dict[str, str]) -> str | None:
    """The code of the longest key of `table` that is `q` or a dotted prefix of it."""
    parts = q.split(".")
    for n in range(len(parts), 0, -1):
        code = table.get(".".join(parts[:n]))
        if code is not None:
            return code
    return None


def _is_outermost(t: PortBase, orig: cst.BaseExpression) -> bool:
    parent = t.parent(orig)
    if isinstance(parent, cst.Attribute) and (parent.value is orig or parent.attr is orig):
        return False
    return True


def _is_dotted(node: cst.BaseExpression) -> bool:
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _called_or_decorated(t: PortBase, orig: cst.CSTNode) -> bool:
    parent = t.parent(orig)
    return (isinstance(parent, cst.Call) and parent.func is orig) or isinstance(parent, cst.Decorator)


def _partial_callee(t: PortBase, orig: cst.CSTNode) -> bool:
    """True for the callee of `functools.partial(torch.cuda.amp.autocast, ...)`, which TPU301 rewrites."""
    from tputool.codemods.python.amp import partial_of

    arg = t.parent(orig)
    call = t.parent(arg) if isinstance(arg, cst.Arg) else None
    return isinstance(call, cst.Call) and partial_of(t, call, AUTOCAST_CUDA) and call.args[0] is arg


def _in_autocast_dtype(t: PortBase, orig: cst.CSTNode) -> bool:
    arg = t.parent(orig)
    if not isinstance(arg, cst.Arg):
        return False
    call = t.parent(arg)
    if not isinstance(call, cst.Call):
        return False
    q = t.qname(call.func)
    return q in AUTOCAST_CUDA or q in AUTOCAST_GENERIC


def reference(t: PortBase, orig: cst.BaseExpression, upd: cst.BaseExpression) -> cst.BaseExpression:
    """Rename or report an outermost dotted name by the REFS table (plus the torch.cuda catch-all)."""
    if not _is_outermost(t, orig) or not _is_dotted(orig):
        return upd
    q = t.qname(orig)
    if q is None:
        return upd
    hit = lookup(q)
    if hit is None:
        if q.startswith(CUDA_CATCH_ALL[0] + "."):
            t.fire(CUDA_CATCH_ALL[1], orig, message=f"{q} has no known TPU equivalent; remove it or find the "
                                                    "torch.tpu name")
            parent = t.parent(orig)
            if isinstance(parent, cst.Call) and parent.func is orig:
                t.hold(parent)
        elif q.startswith("torch.ops."):
            ns = q.split(".")[2] if q.count(".") >= 2 else ""
            if ns and ns not in BUILTIN_OP_NAMESPACES and q.count(".") >= 3:
                t.fire("TPU502", orig, message=f"custom op {q} (an extension) cannot run on TPU unless "
                                               "re-registered for it")
        return upd
    key, ref = hit
    if ref.kind == ASSIGN:
        return upd
    call = t.parent(orig)
    call = call if isinstance(call, cst.Call) and call.func is orig else None
    if call is not None and _kept_as_cuda(t, key, call):
        return upd
    if ref.kind == OWNED:
        if not _called_or_decorated(t, orig) and not _partial_callee(t, orig):
            t.fire(ref.code, orig, fixable=False, message=ref.message)
        return upd
    if ref.kind == FIND:
        if not _matters_here(t, ref.code, orig) or (ref.code == "TPU213" and _in_default_tensor_type(t, orig)) \
                or (key == "torch.set_default_tensor_type" and "cuda" not in t.code(t.parent(orig) or orig)):
            return upd
        severity, message = _guarded(t, orig) if ref.code == "TPU410" else (None, ref.message)
        if t.optional_import(orig):
            severity = Severity.INFO
            message = (f"{ref.message or RULES[ref.code].message} (through an optional import: runs only where the "
                       "library is installed)")
        t.fire(ref.code, orig, fixable=False, message=message, note=ref.note, severity=severity)
        if call is not None and q.startswith(("torch.cuda.", "torch.backends.cudnn.", "torch.version.")):
            t.hold(call)  # a CUDA call left as it is keeps its arguments: nothing in it is half-moved
        return upd
    # RENAME
    if q in FP16_QNAMES and _in_autocast_dtype(t, orig):
        return upd  # TPU303 owns the autocast dtype
    if q in FP16_QNAMES and fp16_is_deliberate(t, orig):
        return upd
    if not t.fire(ref.code, orig, message=ref.message, note=ref.note):
        return upd
    target = (ref.target or "") + q[len(key):]
    root = _torch_root(t, orig)
    if target.startswith("torch.") and root is not None:
        text = root + target[len("torch"):]
    else:
        text = t.torch(target[len("torch."):]) if target.startswith("torch.") else target
    t.replaced(orig)
    new = t.expr(text)
    if isinstance(upd, cst.Name | cst.Attribute) and (upd.lpar or upd.rpar) and hasattr(new, "lpar"):
        new = new.with_changes(lpar=upd.lpar, rpar=upd.rpar)
    return new


def _kept_as_cuda(t: PortBase, key: str, call: cst.Call) -> bool:
    """TPU203/TPU220: a CUDA hardware query, an availability check guarding CUDA-only code, or a torch.cuda operand
    of an `and` check that queries CUDA versions stays CUDA (held whole: its arguments are not moved either) and is
    reported; True when so."""
    from tputool.codemods.python.cuda_only import (
        PROPERTIES,
        cuda_query,
        guarded_cuda_only,
        in_cuda_only_conjunction,
        low_precision_choice,
    )

    if key == PROPERTIES:
        what = cuda_query(t, call)
        if what is None:
            return False
        t.fire("TPU203", call, fixable=False,
               message=f"CUDA hardware query ({what}): kept as CUDA, so it runs only where CUDA is available; the "
                       "tpu properties have no such fields")
    elif key == "torch.cuda.is_available":
        what = guarded_cuda_only(t, call)
        if what is None:
            return False
        message = (f"torch.cuda.is_available() guards CUDA-only code ({what}): kept as a CUDA check, so that "
                   "code is skipped (or the check fails) on TPU as on any machine without CUDA")
        if dtype := low_precision_choice(t, call):
            message += (f"; that code picks {dtype} on a GPU, so on TPU the port computes in the other path's "
                        "precision, not the original's (TPUs compute in bfloat16 natively: choose the dtype for "
                        "torch.tpu.is_available() yourself)")
        t.fire("TPU220", call, fixable=False, message=message)
    elif key.startswith("torch.cuda.") and (what := in_cuda_only_conjunction(t, call)):
        t.fire("TPU220", call, fixable=False,
               message=f"{key}() is one operand of an `and` check that also queries CUDA ({what}): the check is "
                       "kept whole as a CUDA check, False on TPU as on any machine without CUDA")
    else:
        return False
    t.hold(call)
    return True


def _matters_here(t: PortBase, code: str, orig: cst.CSTNode) -> bool:
    """False where a finding says nothing to act on: a device ladder that already has its tpu branch (TPU419),
    float64 in a file that never uses an accelerator (TPU307)."""
    if code == "TPU419":
        return not t.mentions_tpu
    if code == "TPU307":
        return t.uses_accelerator and not fp64_is_deliberate(t, orig)
    return True


def fp64_is_deliberate(t: PortBase, orig: cst.CSTNode) -> bool:
    """True where float64 is asked for on purpose or kept off the device: a dtype test or a choice that follows
    one (`torch.float64 if torch.get_default_dtype() == torch.float64 else ...`), a `device='cpu'` call, an entry
    of a dtype table, or a host computation at construction stored as float32 buffers (a diffusion schedule)."""
    from tputool.codemods.python.strings import literal

    if _in_dtype_table(t, orig) or _host_init_to_float32_buffers(t, orig):
        return True
    parent = t.parent(orig)
    while parent is not None and not isinstance(parent, cst.BaseStatement | cst.BaseSmallStatement):
        if isinstance(parent, cst.Comparison | cst.ComparisonTarget):
            return True
        if isinstance(parent, cst.IfExp) and _tests_a_dtype_choice(parent.test):
            return True
        if isinstance(parent, cst.Call) and any(
                a.keyword is not None and a.keyword.value == "device" and literal(a.value) == "cpu"
                for a in parent.args):
            return True
        parent = t.parent(parent)
    return _under_choice_branch(t, orig)


_TORCH_DTYPES = frozenset(f"torch.{n}" for n in (
    "float16 half bfloat16 float32 float float64 double int8 int16 short int32 int int64 long uint8 bool complex64 "
    "cfloat complex128 cdouble float8_e4m3fn float8_e5m2").split())


def _is_dtype(t: PortBase, node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Attribute | cst.Name) and t.qname(node) in _TORCH_DTYPES


def _in_dtype_table(t: PortBase, orig: cst.CSTNode) -> bool:
    """True for a dtype that is an entry of a table of dtypes: a dict key (`{torch.float16: "f16", ...}`), a dict
    value beside other dtypes (`{"half": torch.half, "float": torch.float}`), or one of several dtypes in a list,
    tuple or set. A table names dtypes (for lookup, printing, tests); it chooses none for the device."""
    parent = t.parent(orig)
    if isinstance(parent, cst.DictElement):
        table = t.parent(parent)
        if parent.key is orig:
            return True
        return isinstance(table, cst.Dict) and sum(
            _is_dtype(t, e.value) for e in table.elements if isinstance(e, cst.DictElement)) >= 2
    if isinstance(parent, cst.Element):
        seq = t.parent(parent)
        return isinstance(seq, cst.List | cst.Tuple | cst.Set) and sum(
            _is_dtype(t, e.value) for e in seq.elements) >= 2
    return False


# A float32 buffer store: `register_buffer(name, v.float())`, `... v.to(torch.float32))`, or a float32 converter
# (`to_torch = partial(torch.tensor, dtype=torch.float32)`) in a file that registers buffers.
_FLOAT32_BUFFERS = re.compile(r"register_buffer\(.*(?:\.float\(\)|float32)|partial\(torch\.tensor, dtype=torch\.float32\)")
_PLACES = re.compile(r"\.to\((?!\s*(?:dtype\s*=\s*)?torch\.float(?:32)?\s*\))|\.cuda\(|\bdevice(?:_type)?\s*=(?!\s*['\"]cpu['\"])|\.tpu\b|['\"](?:cuda|tpu)")


def _host_init_to_float32_buffers(t: PortBase, orig: cst.CSTNode) -> bool:
    """True for float64 computed on the host by a function that places nothing on a device, in a file that stores
    float32 buffers (a diffusion noise schedule: `betas = torch.linspace(..., dtype=torch.float64)` in `__init__`
    or a schedule function, then `register_buffer(name, v.float())`): the device only sees the float32 copies."""
    func = t.parent(orig)
    while func is not None and not isinstance(func, cst.FunctionDef):
        func = t.parent(func)
    if func is None:
        return False
    body = t.code(func.body)  # placements and buffer stores hold trigger words: never hidden as cold
    if _PLACES.search(body) or not _stores_float32_buffers(t):
        return False
    if "register_buffer" in body:
        return True
    t.whole_code(func.body)  # deciding "returns only" needs the statements the masking hid
    return _returns_only(func)


def _stores_float32_buffers(t: PortBase) -> bool:
    """True when the file stores float32 buffers (the `register_buffer` lines are hot: a TPU307 trigger)."""
    found = getattr(t, "_float32_buffers", None)
    if found is None:
        found = t._float32_buffers = stores_float32_buffers("\n".join(t.lines))
    return found


def stores_float32_buffers(text: str) -> bool:
    """True when a file's text stores float32 buffers (what _stores_float32_buffers caches per file)."""
    return _FLOAT32_BUFFERS.search(text) is not None


def _returns_only(func: cst.FunctionDef) -> bool:
    """True for a function that computes a value and returns it (no attribute stores, no buffers, no side calls
    at statement level): a schedule function whose result its caller stores."""
    import libcst.matchers as m

    return not m.findall(func.body, m.Assign(targets=[m.AssignTarget(target=m.Attribute())]) | m.AugAssign(
        target=m.Attribute())) and bool(m.findall(func.body, m.Return(value=m.MatchIfTrue(lambda v: v is not None))))


def _guarded(t: PortBase, orig: cst.CSTNode) -> tuple[Severity | None, str | None]:
    """DataParallel under `if n_gpu > 1:` (a branch for several local devices): a warning, not a blocker."""
    import libcst.matchers as m

    cur = t.parent(orig)
    while cur is not None and not isinstance(cur, cst.FunctionDef | cst.Module):
        if isinstance(cur, cst.If) and m.findall(cur.test, m.Comparison()):
            text = t.code(cur.test).lower()
            if "gpu" in text or "device_count" in text or "devices" in text:
                return Severity.WARNING, ("nn.DataParallel under a several-devices branch: on a multi-chip TPU host "
                                          "that branch runs; use DDP (one process per chip) or drop it")
        cur = t.parent(cur)
    return None, None


def _torch_root(t: PortBase, orig: cst.BaseExpression) -> str | None:
    """The name at the root of a dotted reference when it is bound to the torch module itself."""
    root = orig
    while isinstance(root, cst.Attribute):
        root = root.value
    if isinstance(root, cst.Name) and root is not orig and t.qname(root) == "torch":
        return root.value
    return None


_FP16_NAMES = frozenset({"float16", "fp16", "half", "f16"})


def fp16_is_deliberate(t: PortBase, orig: cst.CSTNode) -> bool:
    """True where float16 is data, not a choice the port should make for TPU: a dtype test (`dtype ==
    torch.float16`, `in {torch.float16, torch.bfloat16}`), the float16 entry of a user's dtype table
    (`{'float16': torch.float16}`), or code under a CPU/MPS-only branch. There TPU306 stays silent."""
    from tputool.codemods.python.strings import literal

    node, parent = orig, t.parent(orig)
    while parent is not None and not isinstance(parent, cst.BaseStatement | cst.BaseSmallStatement):
        if isinstance(parent, cst.Comparison | cst.ComparisonTarget):
            return True
        if isinstance(parent, cst.DictElement) and parent.value is node \
                and (literal(parent.key) or "").lower() in _FP16_NAMES:
            return True
        if isinstance(parent, cst.Set | cst.List | cst.Tuple) and any(
                (t.qname(e.value) or "").endswith(("bfloat16", "float32")) for e in parent.elements):
            return True  # one of several dtypes the code accepts or tests for
        if node is orig and _in_dtype_table(t, orig):
            return True
        if isinstance(parent, cst.IfExp) and node is not parent.test and _tests_a_dtype_choice(parent.test):
            return True  # `torch.bfloat16 if args.amp_dtype == 'bfloat16' else torch.float16`
        node, parent = parent, t.parent(parent)
    return _under_host_only_branch(t, orig) or _under_choice_branch(t, orig)


_DTYPE_WORDS = frozenset({"float16", "fp16", "half", "f16", "bfloat16", "bf16", "float32", "fp32", "float64",
                          "double", "fp64"})


def _tests_a_dtype_choice(test: cst.CSTNode) -> bool:
    """`precision == 'float16'`, `args.dtype in ('fp16', 'bf16')`, `torch.get_default_dtype() == torch.float64`."""
    import libcst.matchers as m

    from tputool.codemods.python.strings import literal

    for c in m.findall(test, m.Comparison()):
        for part in (c.left, *(x.comparator for x in c.comparisons)):
            elems = [e.value for e in part.elements] if isinstance(part, cst.List | cst.Tuple | cst.Set) else [part]
            for e in elems:
                word = literal(e) or (e.attr.value if isinstance(e, cst.Attribute) else None)
                if (word or "").lower() in _DTYPE_WORDS:
                    return True
    return False


def _under_choice_branch(t: PortBase, orig: cst.CSTNode) -> bool:
    """True in the body of `if precision == 'float16':` or `if fp16:` (the user chose this dtype)."""
    node, parent = orig, t.parent(orig)
    while parent is not None and not isinstance(parent, cst.FunctionDef | cst.Module):
        if isinstance(parent, cst.If) and parent.body is node:
            test = parent.test
            flag = test.value if isinstance(test, cst.Name) else test.attr.value if isinstance(
                test, cst.Attribute) else None
            if (flag or "").lower() in _FP16_NAMES or _tests_a_dtype_choice(test):
                return True
        node, parent = parent, t.parent(parent)
    return False


def _under_host_only_branch(t: PortBase, orig: cst.CSTNode) -> bool:
    """True inside the body of `if device == 'cpu'` / `if device.type in ('cpu', 'mps')` and similar."""
    from tputool.codemods.python.strings import literal

    node, parent = orig, t.parent(orig)
    while parent is not None:
        if isinstance(parent, cst.If) and parent.body is node and isinstance(parent.test, cst.Comparison):
            comps = parent.test.comparisons
            words = {literal(parent.test.left), *(literal(c.comparator) for c in comps)}
            for c in comps:
                if isinstance(c.comparator, cst.List | cst.Tuple | cst.Set):
                    words |= {literal(e.value) for e in c.comparator.elements}
            positive = all(isinstance(c.operator, cst.Equal | cst.In | cst.Is) for c in comps)
            if positive and words & {"cpu", "mps"} and not words & {"cuda", "tpu"}:
                return True
        node, parent = parent, t.parent(parent)
    return False


def bf16_supported(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU204: torch.cuda.is_bf16_supported() -> True (not inside a CUDA-only `and` check, kept whole)."""
    from tputool.codemods.python.cuda_only import in_cuda_only_conjunction

    if q != "torch.cuda.is_bf16_supported" or in_cuda_only_conjunction(t, orig) \
            or not t.fire("TPU204", orig, note="TPUs compute natively in bf16"):
        return upd
    t.replaced(orig.func)
    return cst.Name("True")


def and_true(t: PortBase, orig: cst.BooleanOperation, upd: cst.BooleanOperation) -> cst.BaseExpression:
    """`torch.tpu.is_available() and True` (TPU204 made the right side True): keep the left side only."""
    if not isinstance(upd.operator, cst.And):
        return upd
    for o_side, keep in ((orig.right, upd.left), (orig.left, upd.right)):
        new_side = upd.right if o_side is orig.right else upd.left
        if isinstance(new_side, cst.Name) and new_side.value == "True" and isinstance(o_side, cst.Call) \
                and t.qname(o_side.func) == "torch.cuda.is_bf16_supported":
            return keep.with_changes(lpar=upd.lpar, rpar=upd.rpar) if upd.lpar and hasattr(keep, "lpar") else keep
    return upd


def owned_elsewhere(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """Statement/with-owned calls used in another position: report them without a fix."""
    if q is None:
        return upd
    parent = t.parent(orig)
    if q in STATEMENT_CALLS and not isinstance(parent, cst.Expr):
        t.fire(STATEMENT_CALLS[q], orig, fixable=False)
    elif q in WITH_UNWRAP and not isinstance(parent, cst.WithItem):
        t.fire(WITH_UNWRAP[q], orig, fixable=False)
    return upd


_REMOVE = None


_LEGACY_DTYPES = {"HalfTensor": "float16", "FloatTensor": "float32", "DoubleTensor": "float64",
                  "BFloat16Tensor": "bfloat16"}


def _default_tensor_type(t: PortBase, call: cst.Call, prefix: str = "torch.cuda.") -> str | None:
    """The dtype of `torch.set_default_tensor_type(torch.cuda.HalfTensor)` (or its string form), else None;
    with `prefix="torch."`, of a CPU type (`torch.FloatTensor`: the restore of a CUDA default)."""
    if t.qname(call.func) != "torch.set_default_tensor_type" or len(call.args) != 1:
        return None
    arg = call.args[0].value
    name = t.qname(arg) if isinstance(arg, cst.Attribute) else (literal(arg) or "")
    if not name or not name.startswith(prefix) or name.count(".") != prefix.count("."):
        return None
    return _LEGACY_DTYPES.get(name.rsplit(".", 1)[-1])


def _sets_cuda_default(t: PortBase) -> bool:
    """True when the file sets a CUDA default tensor type somewhere (its CPU restores then move with it)."""
    found = getattr(t, "_sets_cuda_default", None)
    if found is None:
        found = t._sets_cuda_default = sets_cuda_default(t, t.wrapper.module)
    return found


def sets_cuda_default(t: PortBase, module: cst.Module) -> bool:
    """True when `module` calls `torch.set_default_tensor_type` with a CUDA type (names resolved by `t.qname`)."""
    import libcst.matchers as m

    return any(_default_tensor_type(t, c) is not None for c in m.findall(
        module, m.Call(func=m.Attribute(attr=m.Name("set_default_tensor_type")) | m.Name("set_default_tensor_type"))))


def _in_default_tensor_type(t: PortBase, orig: cst.CSTNode) -> bool:
    """True for the callee or argument of a set_default_tensor_type(torch.cuda.XTensor) call (reported once)."""
    parent = t.parent(orig)
    call = t.parent(parent) if isinstance(parent, cst.Arg) else parent
    return isinstance(call, cst.Call) and _default_tensor_type(t, call) is not None


def _statement(t: PortBase, o: cst.BaseSmallStatement, u: cst.BaseSmallStatement
               ) -> cst.BaseSmallStatement | list | None:
    """One small statement: itself, a replacement (one or a list), or None (removed)."""
    if isinstance(o, cst.Expr) and isinstance(o.value, cst.Call):
        dtype = _default_tensor_type(t, o.value)
        if dtype is not None and t.fire("TPU213", o.value, safe=True,
                                        message="set_default_tensor_type(torch.cuda.*Tensor): the default "
                                                "device and dtype are set one by one"):
            t.replaced(o.value.func)
            if dtype == "float16" and t.settings.unsafe_fixes:
                dtype = "bfloat16"  # what TPU306's unsafe fix would make of it on the next run
            return [cst.Expr(t.expr(f'{t.torch("set_default_device")}("tpu")')),
                    cst.Expr(t.expr(f'{t.torch("set_default_dtype")}({t.torch(dtype)})'))]
        restore = _default_tensor_type(t, o.value, "torch.")
        if restore is not None and _sets_cuda_default(t) and t.fire(
                "TPU213", o.value, message="set_default_tensor_type(torch.*Tensor) restores the CPU default after a "
                                           "CUDA one: the default device is reset with the dtype"):
            t.replaced(o.value.func)
            return [cst.Expr(t.expr(f'{t.torch("set_default_device")}("cpu")')),
                    cst.Expr(t.expr(f'{t.torch("set_default_dtype")}({t.torch(restore)})'))]
        q = t.qname(o.value.func)
        code = STATEMENT_CALLS.get(q) if q else None
        if code is not None and t.fire(code, o.value, note=_note(code)):
            t.replaced(o.value.func)
            return _REMOVE
        return u
    if isinstance(o, cst.Assign) and len(o.targets) == 1:
        q = t.qname(o.targets[0].target)
        code = prefix_match(q, ASSIGN_TARGETS) if q else None
        if code is None:
            return u
        value = u.value
        if code == "TPU402":
            if t.fire(code, o):
                t.replaced(o.targets[0].target)
                return cst.Expr(t.expr(f"{t.torch('use_deterministic_algorithms')}({t.code(value)})"))
            return u
        if code == "TPU309":
            level = {"True": "high", "False": "highest"}.get(value.value) if isinstance(value, cst.Name) else None
            if q.endswith("allow_tf32") and level is not None:
                if t.fire(code, o):
                    t.replaced(o.targets[0].target)
                    return cst.Expr(t.expr(f'{t.torch("set_float32_matmul_precision")}("{level}")'))
            else:
                t.fire(code, o, fixable=False)
            return u
        if t.fire(code, o, note=_note(code)):
            t.replaced(o.targets[0].target)
            return _REMOVE
        return u
    return u


def _note(code: str) -> str | None:
    """The note a statement removal or `with` unwrapping of rule `code` carries (its catalogue entry's)."""
    return RULES[code].port.fix_note


def statements(t: PortBase, orig_body, upd_body) -> list | None:
    """The small statements of a line after removal/replacement, or None when nothing changed."""
    out = []
    changed = False
    for o, u in zip(orig_body, upd_body, strict=True):
        r = _statement(t, o, u)
        if r is not u:
            changed = True
        if isinstance(r, list):
            out.extend(s.with_changes(semicolon=cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" ")))
                       for s in r)
        elif r is not None:
            out.append(r)
    if not changed:
        return None
    return [s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) if i == len(out) - 1 else s
            for i, s in enumerate(out)]


def with_unwrap(t: PortBase, orig: cst.With, upd: cst.With):
    """TPU404/TPU218: drop sdp_kernel/sdpa_kernel/emit_nvtx items; unwrap the body when none is left."""
    keep = []
    dropped = False
    for oi, ui in zip(orig.items, upd.items, strict=True):
        call = oi.item
        q = t.qname(call.func) if isinstance(call, cst.Call) else None
        code = WITH_UNWRAP.get(q) if q else None
        if code is not None:
            if oi.asname is None and t.fire(code, call, note=_note(code)):
                t.replaced(call.func)
                dropped = True
                continue
            if oi.asname is not None:
                t.fire(code, call, fixable=False)
        keep.append(ui)
    if not dropped:
        return upd
    if keep:
        keep = [k.with_changes(comma=cst.MaybeSentinel.DEFAULT) if i == len(keep) - 1 else k
                for i, k in enumerate(keep)]
        return upd.with_changes(items=keep)
    body = upd.body
    if isinstance(body, cst.SimpleStatementSuite):
        return cst.SimpleStatementLine(body=body.body, leading_lines=upd.leading_lines)
    stmts = list(body.body)
    if not stmts:
        return cst.RemovalSentinel.REMOVE
    header = [cst.EmptyLine(comment=body.header.comment)] if body.header.comment is not None else []
    stmts[0] = stmts[0].with_changes(leading_lines=[*upd.leading_lines, *header, *stmts[0].leading_lines])
    return cst.FlattenSentinel(stmts)


def string_literal(t: PortBase, orig: cst.SimpleString, upd: cst.BaseExpression) -> cst.BaseExpression:
    """TPU412/TPU413 env var names, TPU512 nvidia-smi in Python strings (findings only: `upd` comes back)."""
    v = literal(orig)
    if not v or len(v) > 80:
        return upd
    if v in CUDA_VISIBLE:
        t.fire("TPU412", orig)
    elif v in CUDA_ENV_EXACT or v.startswith(CUDA_ENV_PREFIXES):
        t.fire("TPU413", orig, message=f"{v} has no effect on TPU; remove it")
    elif v.split(" ")[0] in ("nvidia-smi", "gpustat"):
        t.fire("TPU512", orig)
    return upd


_KERNEL_REGISTRATIONS = {"torch.library.custom_op": "device_types", "torch.library.impl": "types",
                         "torch.library.register_kernel": "device_types"}


def _device_types(node: cst.BaseExpression) -> list[str] | None:
    """The literal device types of a registration argument ("cuda", ["cpu", "cuda"]), else None."""
    elems = [e.value for e in node.elements] if isinstance(node, cst.List | cst.Tuple | cst.Set) else [node]
    words = [literal(e) for e in elems]
    return None if any(w is None for w in words) else [w.lower() for w in words]


def cuda_kernel_registration(t: PortBase, orig: cst.Call, upd: cst.Call, q: str | None) -> cst.BaseExpression:
    """TPU502: a custom op kernel registered for CUDA and not for tpu (`torch.library.custom_op(...,
    device_types="cuda")`, `torch.library.impl(name, "cuda")`, `register_kernel(op, "cuda")`, `op.register_kernel(
    "cuda")`, `Library.impl(name, fn, "CUDA")`): the tpu device never dispatches to it. Reported with the op's name."""
    kw = _KERNEL_REGISTRATIONS.get(q or "")
    func = orig.func
    method = isinstance(func, cst.Attribute) and q is None and func.attr.value in ("register_kernel", "impl")
    if kw is None and not method:
        return upd
    positional = [a.value for a in orig.args if a.keyword is None]
    named = {a.keyword.value: a.value for a in orig.args if a.keyword is not None}
    if kw is not None:  # torch.library.X(op, types)
        name_node, types = (positional or [named.get("qualname") or named.get("name")])[0], (
            named.get(kw) if kw in named else positional[1] if len(positional) > 1 else None)
    elif func.attr.value == "register_kernel":  # op.register_kernel(types)
        name_node, types = func.value, named.get("device_types") or (positional[0] if positional else None)
    else:  # Library.impl(op_name, fn, dispatch_key)
        name_node = positional[0] if positional else named.get("op_name")
        types = named.get("dispatch_key") or (positional[2] if len(positional) > 2 else None)
    kinds = _device_types(types) if types is not None else None
    if not kinds or "cuda" not in kinds or {"tpu", "privateuse1", "privateuseone"} & set(kinds):
        return upd
    name = (literal(name_node) if name_node is not None else None) or (t.code(name_node) if name_node else "?")
    t.fire("TPU502", orig, fixable=False,
           message=f"custom op {name} has its kernel registered for {', '.join(kinds)} only: the tpu device never "
                   "dispatches to it; register a tpu kernel (torch ops, or a Pallas kernel through "
                   "torch.tpu.pallas.jax_op)")
    return upd

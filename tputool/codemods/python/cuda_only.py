"""CUDA code that port keeps as CUDA (TPU203, TPU220): hardware queries and the availability checks guarding them.

A query of CUDA hardware (compute capability, SM count, cuDNN/NCCL versions) is not a device move: on a
machine without CUDA the original takes its non-CUDA path, and so must the port. The call is left as it is
(with its arguments: `get_device_properties("cuda")` is never half-moved) and reported. A
`torch.cuda.is_available()` check is kept as well when what it guards is CUDA-only: such a query, or a
CUDA-only library (the code in the guarded region imports or uses one, or the check's message names one).
Anything else it guards is a device move, and the check moves with it (TPU201).
"""

from __future__ import annotations

import builtins
import os
import re

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from tputool.codemods.python.context import PortBase
from tputool.codemods.python.speed.cold import MARKER
from tputool.codemods.python.strings import literal
from tputool.rules.port import CUDA_PROPERTY_FIELDS

PROPERTIES = "torch.cuda.get_device_properties"
# Calls that query CUDA hardware or CUDA library versions whatever is read from them.
CUDA_QUERIES = frozenset({"torch.cuda.get_device_capability", "torch.cuda.get_arch_list", "torch.version.cuda",
                          "torch.backends.cudnn.version", "torch.cuda.nccl.version", "torch.cuda.nccl.is_available"})
# CUDA-only libraries: module roots (imports and uses) and the words that name one in a check's message.
CUDA_ONLY_MODULES = frozenset({"apex", "bitsandbytes", "flash_attn", "xformers", "triton", "cuml", "cudf", "cugraph",
                               "cupy", "pycuda", "transformer_engine", "pynvml", "numba.cuda"})
_LIBRARY_WORDS = re.compile(r"\b(apex|bitsandbytes|bnb|flash[-_ ]?attn|flash[-_ ]?attention|xformers|triton|cuml|"
                            r"cudf|rapids|cupy|pycuda|transformer[-_ ]?engine|nvml)\b", re.IGNORECASE)


def _scope(t: PortBase, node: cst.CSTNode) -> cst.CSTNode:
    cur = t.parent(node)
    while cur is not None and not isinstance(cur, cst.FunctionDef | cst.Module):
        cur = t.parent(cur)
    return cur if cur is not None else node


def cuda_fields_read(t: PortBase, call: cst.Call) -> list[str]:
    """The CUDA-only fields read from `torch.cuda.get_device_properties(...)`'s result: directly on the call, or
    on the name it is assigned to, in the same function (empty: the result is portable or not read)."""
    parent = t.parent(call)
    fields: list[str] = []
    if isinstance(parent, cst.Attribute) and parent.value is call:
        fields.append(parent.attr.value)
    elif isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name):
        name = parent.targets[0].target.value
        for a in m.findall(_scope(t, call), m.Attribute(value=m.Name(name))):
            fields.append(a.attr.value)
    return [f for f in dict.fromkeys(fields) if f in CUDA_PROPERTY_FIELDS]


def cuda_query(t: PortBase, call: cst.Call) -> str | None:
    """What makes a call a CUDA hardware query (its name, or the CUDA-only fields read), else None."""
    q = t.qname(call.func) if isinstance(call.func, cst.Name | cst.Attribute) else None
    if q in CUDA_QUERIES:
        return q.rsplit(".", 1)[-1] + "()"
    if q == PROPERTIES:
        fields = cuda_fields_read(t, call)
        return "get_device_properties().{}".format("/.".join(fields)) if fields else None
    return None


def _region(t: PortBase, check: cst.Call) -> tuple[list[cst.CSTNode], list[cst.CSTNode]] | None:
    """(code guarded by an availability check, nodes whose string literals explain it), or None when the check
    guards no region (it is stored, returned or passed on)."""
    code: list[cst.CSTNode] = []
    node, negated = check, False
    parent = t.parent(node)
    while isinstance(parent, cst.UnaryOperation | cst.BooleanOperation):
        if isinstance(parent, cst.UnaryOperation):
            if not isinstance(parent.operator, cst.Not):
                return None
            negated = not negated
        elif isinstance(parent.operator, cst.And) and parent.left is node and not negated:
            code.append(parent.right)
        node, parent = parent, t.parent(parent)
    if parent is not None:
        t.know_parents(parent)  # the guarded code is read before the transformer visits it
    if isinstance(parent, cst.If) and parent.test is node:
        texts: list[cst.CSTNode] = [parent.body]
        if not negated:
            return [*code, parent.body], texts
        after = [parent.orelse] if parent.orelse is not None else []
        if _exits(t, parent.body):
            after += _following(t, parent)
        return [*code, *after], texts
    if isinstance(parent, cst.Assert) and parent.test is node and not negated:
        return [*code, *_following(t, parent)], [parent.msg] if parent.msg is not None else []
    if isinstance(parent, cst.IfExp) and parent.test is node and not negated:
        return [*code, parent.body], []
    return (code, []) if code else None  # `ok = torch.cuda.is_available() and <code>`: the operands it guards


_LOW_PRECISION = m.Attribute(value=m.Name(), attr=m.Name("bfloat16") | m.Name("float16") | m.Name("half"))


def low_precision_choice(t: PortBase, check: cst.BaseExpression) -> str | None:
    """The reduced-precision dtype (`torch.bfloat16`, `torch.float16`) that the code guarded by a CUDA check
    kept as CUDA names, or None: on a GPU the original computes in it, on TPU the port takes the other path."""
    region = _region(t, check)
    for root in region[0] if region is not None else ():
        for a in m.findall(root, _LOW_PRECISION):
            q = t.qname(a)
            if q in ("torch.bfloat16", "torch.float16", "torch.half"):
                return q
    return None


def _exits(t: PortBase, body: cst.BaseSuite) -> bool:
    """True when a block ends by leaving its function or loop (return, raise, continue, break, exit())."""
    stmts = body.body if isinstance(body, cst.IndentedBlock) else [body]
    last = stmts[-1] if stmts else None
    smalls = last.body if isinstance(last, cst.SimpleStatementLine | cst.SimpleStatementSuite) else []
    if not smalls:
        return False
    end = smalls[-1]
    if isinstance(end, cst.Expr) and isinstance(end.value, cst.Name) and end.value.value.startswith(MARKER):
        t.needs_whole = True  # the statement was hidden as cold: port the whole file to read it
        return False
    if isinstance(end, cst.Return | cst.Raise | cst.Continue | cst.Break):
        return True
    return isinstance(end, cst.Expr) and isinstance(end.value, cst.Call) and (
        m.matches(end.value.func, m.Name("exit") | m.Attribute(attr=m.Name("exit"))))


def _following(t: PortBase, stmt: cst.CSTNode) -> list[cst.CSTNode]:
    """The statements after the one holding `stmt` in its block."""
    line = stmt
    while line is not None and not isinstance(line, cst.BaseStatement):
        line = t.parent(line)
    block = t.parent(line) if line is not None else None
    body = block.body if isinstance(block, cst.IndentedBlock | cst.Module) else None
    if body is None:
        return []
    t.know_parents(block)
    for i, s in enumerate(body):
        if s is line:
            return list(body[i + 1:])
    return []


def _library(t: PortBase, node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.Import | cst.ImportFrom):
        from tputool.codemods.python.imports import import_names

        names = import_names(node)
    elif isinstance(node, cst.Name | cst.Attribute):
        names = [t.qname(node) or ""]
    else:
        return None
    for name in names:
        parts = name.split(".")
        for n in (2, 1):
            if ".".join(parts[:n]) in CUDA_ONLY_MODULES:
                return ".".join(parts[:n])
    return None


_LIBRARY_IMPORT = re.compile(r"^[ \t]*(?:import|from)[ \t]+(" + "|".join(
    re.escape(name) for name in sorted(CUDA_ONLY_MODULES)) + r")\b", re.MULTILINE)
_local_modules: dict[str, str | None] = {}
"""Path of a local module -> the CUDA-only library it imports (None: none), read once per path."""


def _local_module(t: PortBase, dots: int, parts: list[str], names: list[str]) -> str | None:
    """`from .triton_ops import kernel` (dots 1, parts ["triton_ops"], names ["kernel"]): the CUDA-only library
    that local module (a file beside this one, or a module of the package named) imports, as "triton (through
    .triton_ops)", else None."""
    if not t.path:
        return None
    base = os.path.dirname(os.path.abspath(t.path))
    for _ in range(dots - 1):
        base = os.path.dirname(base)
    candidates = [os.path.join(base, *parts) + ".py"] if parts else []
    candidates += [os.path.join(base, *parts, n + ".py") for n in names]
    for path in candidates:
        if path not in _local_modules:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    hit = _LIBRARY_IMPORT.search(f.read())
            except OSError:
                hit = None
            _local_modules[path] = hit.group(1) if hit else None
        if _local_modules[path]:
            return f"{_local_modules[path]} (through {'.' * dots}{'.'.join(parts) or os.path.basename(path)[:-3]})"
    return None


def _relative_import(t: PortBase, node: cst.ImportFrom) -> str | None:
    parts = (get_full_name_for_node(node.module) or "").split(".") if node.module is not None else []
    names = [] if isinstance(node.names, cst.ImportStar) else [a.name.value for a in node.names
                                                              if isinstance(a.name, cst.Name)]
    return _local_module(t, len(node.relative), parts, names)


def _local_function(t: PortBase, node: cst.Call) -> cst.FunctionDef | None:
    """The module-level function of this file that a call by bare name calls, else None."""
    if not isinstance(node.func, cst.Name):
        return None
    name = node.func.value
    for stmt in t.wrapper.module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    if not hasattr(builtins, name) and any(MARKER in line for line in t.lines) and _reaches_cuda_only(t):
        t.needs_whole = True  # perhaps defined here but hidden as cold: port the whole file to read it
    return None


_RELATIVE_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.+)([\w.]*)[ \t]+import[ \t]+\(?([\w, \t]+)", re.MULTILINE)


def _reaches_cuda_only(t: PortBase) -> bool:
    """Whether this file imports a CUDA-only library or a local module that does (read from its whole text):
    only then can a statement hidden as cold be CUDA-only code an analysis must see."""
    if _LIBRARY_IMPORT.search(t.original):
        return True
    for dots, module, names in _RELATIVE_IMPORT.findall(t.original):
        parts = module.split(".") if module else []
        if _local_module(t, len(dots), parts, [n.strip() for n in names.split(",") if n.strip().isidentifier()]):
            return True
    return False


def _cuda_only_in(t: PortBase, root: cst.CSTNode, depth: int = 1) -> str | None:
    """The first CUDA hardware query or CUDA-only library used in an original subtree (parents known), else None;
    a local module imported there counts by what it imports, and a function of this file called there (`depth`
    levels deep) by what its body uses."""
    for node in m.findall(root, m.Call() | m.Import() | m.ImportFrom() | m.Name() | m.Attribute()):
        if isinstance(node, cst.Call):
            found = cuda_query(t, node)
            if not found and depth and (fn := _local_function(t, node)) is not None:
                t.know_parents(fn)
                inner = _cuda_only_in(t, fn.body, depth - 1)
                found = f"{inner} in {fn.name.value}()" if inner else None
        elif isinstance(node, cst.Name | cst.Attribute) and t.qname(node) in CUDA_QUERIES:
            found = t.qname(node)
        elif isinstance(node, cst.ImportFrom) and node.relative:
            found = _relative_import(t, node)
        else:
            found = _library(t, node)
        if found:
            return found
    return None


def in_cuda_only_conjunction(t: PortBase, node: cst.CSTNode) -> str | None:
    """For an operand of an `and` chain that also queries CUDA hardware or library versions
    (`torch.version.cuda and torch.cuda.is_bf16_supported() and nccl.version() >= (2, 10)`), the CUDA query found
    ("torch.version.cuda"), else None: the chain is one CUDA check, kept whole (moving one operand changes nothing
    on TPU but half-moves the check)."""
    top, parent = node, t.parent(node)
    while isinstance(parent, cst.BooleanOperation) and isinstance(parent.operator, cst.And):
        top, parent = parent, t.parent(parent)
    if top is node:
        return None
    t.know_parents(top)
    return _cuda_only_in(t, top)


def guarded_cuda_only(t: PortBase, check: cst.BaseExpression) -> str | None:
    """What CUDA-only code a `torch.cuda.is_available()` call (or an `x.is_cuda` test) guards ("apex",
    "get_device_capability()"), or None when it guards none (then it is a device check and moves to tpu)."""
    region = _region(t, check)
    if region is None:
        return None
    code, texts = region
    for root in code:
        found = _cuda_only_in(t, root)
        if found:
            return found
    if any(MARKER in t.code(root) for root in code) and _reaches_cuda_only(t):
        t.needs_whole = True  # the guarded code is partly hidden as cold: port the whole file to read it
        return None
    for root in texts:
        for s in m.findall(root, m.SimpleString() | m.FormattedStringText()):
            text = literal(s) if isinstance(s, cst.SimpleString) else s.value
            hit = _LIBRARY_WORDS.search(text or "")
            if hit:
                return hit.group(1)
    return None

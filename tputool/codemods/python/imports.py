"""Findings on import statements of CUDA-only libraries (triton, bitsandbytes, flash_attn, ...)."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tputool.codemods.python.api import prefix_match
from tputool.codemods.python.context import PortBase
from tputool.codemods.python.tables import IMPORT_FINDINGS
from tputool.rules.model import Severity


def import_names(node: cst.Import | cst.ImportFrom) -> list[str]:
    """Full dotted names an import statement brings in (`from a import b` gives a and a.b)."""
    if isinstance(node, cst.Import):
        return [get_full_name_for_node(a.name) or "" for a in node.names]
    if node.relative or node.module is None:
        return []
    mod = get_full_name_for_node(node.module) or ""
    out = [mod]
    if not isinstance(node.names, cst.ImportStar):
        out += [f"{mod}.{a.name.value}" for a in node.names if isinstance(a.name, cst.Name)]
    return out


def import_findings(t: PortBase, node: cst.Import | cst.ImportFrom) -> None:
    """One finding per CUDA-only library an import statement brings in."""
    codes: dict[str, str] = {}  # code -> the first name imported for it
    for name in import_names(node):
        code = prefix_match(name, IMPORT_FINDINGS)
        if code is not None and code not in codes:
            codes[code] = name
    optional = _optional_import(t, node)
    for code, name in codes.items():
        if optional:
            t.fire(code, node, fixable=False, severity=Severity.INFO,
                   message=f"optional import of {name}: guarded by try/except ImportError, so the "
                           "fallback path runs where the library is missing; check that it is the one TPU needs")
        else:
            t.fire(code, node, fixable=False)


_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def optional_names(module: cst.Module) -> frozenset[str]:
    """Names bound by module-level imports inside `try: ... except ImportError:` (optional dependencies)."""
    names: set[str] = set()
    for stmt in module.body:
        if not isinstance(stmt, cst.Try) or not _catches_import_error(stmt):
            continue
        for line in stmt.body.body:
            if not isinstance(line, cst.SimpleStatementLine):
                continue
            for small in line.body:
                if isinstance(small, cst.Import | cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    for a in small.names:
                        bound = a.asname.name if a.asname else a.name
                        full = get_full_name_for_node(bound) or ""
                        names.add(full.split(".")[0])
    return frozenset(names)


def _catches_import_error(node: cst.Try) -> bool:
    for h in node.handlers:
        if h.type is None:
            return True
        types = [h.type] if not isinstance(h.type, cst.Tuple) else [e.value for e in h.type.elements]
        if any(get_full_name_for_node(n) in _IMPORT_ERRORS for n in types):
            return True
    return False


def _optional_import(t: PortBase, node: cst.CSTNode) -> bool:
    """True when the import sits in a `try:` body whose handlers catch ImportError (an optional dependency)."""
    child, cur = node, t.parent(node)
    while cur is not None and not isinstance(cur, cst.FunctionDef | cst.ClassDef):
        if isinstance(cur, cst.Try) and child is cur.body:
            return _catches_import_error(cur)
        child, cur = cur, t.parent(cur)
    return False

"""Findings on import statements of CUDA-only libraries (triton, bitsandbytes, flash_attn, ...)."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tputool.codemods.python.api import prefix_match
from tputool.codemods.python.context import PortBase
from tputool.codemods.python.tables import IMPORT_FINDINGS


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
    codes = []
    for name in import_names(node):
        code = prefix_match(name, IMPORT_FINDINGS)
        if code is not None and code not in codes:
            codes.append(code)
    for code in codes:
        t.fire(code, node, fixable=False)

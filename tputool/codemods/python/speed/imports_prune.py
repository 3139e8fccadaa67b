"""Remove imports that rewrites left unused, without a scope-analysis pass over the whole file.

A name counts as used while it still occurs as a word that is not an attribute (`(?<![.\\w])name\\b`) anywhere
in the new source other than its own import: a conservative textual test (a mention in a string or comment
keeps the import), far cheaper than libcst's RemoveImportsVisitor.
"""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node


def bound_name(alias: cst.ImportAlias, from_import: bool) -> str | None:
    """The name an import alias binds (`import a.b` binds a)."""
    if alias.asname is not None:
        return alias.asname.name.value if isinstance(alias.asname.name, cst.Name) else None
    full = get_full_name_for_node(alias.name) or ""
    return full if from_import else full.split(".")[0]


def prune_imports(module: cst.Module, candidates: set[str]) -> cst.Module:
    """`module` without the import aliases binding a name in `candidates` that is no longer used."""
    if not candidates:
        return module
    patterns = {n: re.compile(rf"(?<![.\w]){re.escape(n)}\b") for n in candidates}
    code = module.code
    collector = _ImportText()
    module.visit(collector)
    imports_code = "\n".join(module.code_for_node(n) for n in collector.nodes)
    unused = {n for n, rx in patterns.items() if len(rx.findall(code)) <= len(rx.findall(imports_code))}
    if not unused:
        return module
    return module.visit(_Prune(unused))


class _ImportText(cst.CSTVisitor):
    """Every import statement of the module (its text is not a use of the names it binds)."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[cst.CSTNode] = []

    def visit_Import(self, node: cst.Import) -> bool:
        self.nodes.append(node)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        self.nodes.append(node)
        return False

    def visit_Expr(self, node: cst.Expr) -> bool:
        return False

    def visit_Call(self, node: cst.Call) -> bool:
        return False


class _Prune(cst.CSTTransformer):
    """Drop aliases binding unused names; drop import statements left empty."""

    def __init__(self, unused: set[str]) -> None:
        super().__init__()
        self.unused = unused

    def _keep(self, names, from_import: bool):
        kept = [a for a in names if bound_name(a, from_import) not in self.unused]
        if kept and len(kept) != len(names):
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return kept

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import):
        kept = self._keep(updated_node.names, False)
        return updated_node.with_changes(names=kept) if kept else cst.RemovalSentinel.REMOVE

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom):
        if isinstance(updated_node.names, cst.ImportStar):
            return updated_node
        kept = self._keep(updated_node.names, True)
        if not kept:
            return cst.RemovalSentinel.REMOVE
        if len(kept) == 1 and updated_node.lpar is not None:
            return updated_node.with_changes(names=kept, lpar=None, rpar=None)
        return updated_node.with_changes(names=kept)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        return cst.RemovalSentinel.REMOVE if not updated_node.body else updated_node

    def leave_IndentedBlock(self, original_node, updated_node):
        if updated_node.body:
            return updated_node
        return updated_node.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()])])

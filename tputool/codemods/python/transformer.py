"""The one libcst transformer: it visits each node kind once and dispatches to the per-rule handlers."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import QualifiedNameProvider

from tputool.codemods.python import api
from tputool.codemods.python.context import PortBase
from tputool.codemods.python.imports import import_findings
from tputool.codemods.python.registry import hooks, port_rules
from tputool.codemods.python.speed.scopes import WindowQualifiedNameProvider

# The rules' handlers by node kind, in order, from the catalogue entries (tputool/rules/port.py).
_HOOKS = hooks(port_rules())
# Call handlers run in this order on every call (each may return a new node for the next); the first reports
# statement- and with-owned calls used elsewhere (the STATEMENT_CALLS / WITH_UNWRAP machinery).
CALL_HANDLERS = (api.owned_elsewhere, *_HOOKS.pop("Call", ()))


class _Rules(PortBase):
    """Rewrites CUDA-specific code for TPU and records findings (see tputool/rules/port.py).

    Never instantiated itself: libcst caches metadata dependencies per class and a subclass would inherit
    its parent's cache, so the two concrete transformers below are siblings.
    """

    def visit_Import(self, node: cst.Import) -> bool:
        import_findings(self, node)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        import_findings(self, node)
        return False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        q = self.call_qname(original_node)
        node: cst.BaseExpression = updated_node
        for handler in CALL_HANDLERS:
            if not isinstance(node, cst.Call):
                break
            node = handler(self, original_node, node, q)
        return node

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine):
        body = api.statements(self, original_node.body, updated_node.body)
        if body is None:
            return updated_node
        if not body:
            placeholder = updated_node.with_changes(body=[cst.Pass()])
            self.removed_lines[id(placeholder)] = placeholder  # kept alive so its id is never reused
            return placeholder
        return updated_node.with_changes(body=body)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite,
                                   updated_node: cst.SimpleStatementSuite) -> cst.SimpleStatementSuite:
        body = api.statements(self, original_node.body, updated_node.body)
        if body is None:
            return updated_node
        return updated_node.with_changes(body=body or [cst.Pass()])

    def _drop_removed(self, body):
        """The statements without removed-line placeholders, or None when there are none.

        The comment lines above a removed statement move to the next statement when it follows directly (they
        may describe it too); where a blank line or the block's end follows, they were about the removed
        statement and go with it, as does its own trailing comment.
        """
        if not any(id(s) in self.removed_lines for s in body):
            return None
        out, carry = [], []
        for s in body:
            if id(s) in self.removed_lines:
                carry += list(s.leading_lines)
                continue
            if carry:
                lead = list(s.leading_lines)
                if not (lead[:1] and lead[0].comment is None):  # follows directly: keep what was above
                    s = s.with_changes(leading_lines=[*carry, *lead])
                carry = []
            out.append(s)
        return out

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
                            ) -> cst.IndentedBlock:
        body = self._drop_removed(updated_node.body)
        if body is None and updated_node.body:
            return updated_node
        return updated_node.with_changes(body=body or [cst.SimpleStatementLine(body=[cst.Pass()])])

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._drop_removed(updated_node.body)
        self.removed_top = body is not None  # where the comments above a removed statement go depends on the next
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_With(self, original_node: cst.With, updated_node: cst.With):
        return api.with_unwrap(self, original_node, updated_node)


def _leave(kind: type[cst.CSTNode], handlers: tuple) -> Callable:
    """A leave_<kind> method running `handlers` in turn while the node keeps its kind (one: the handler itself)."""
    if len(handlers) == 1:
        return handlers[0]

    def leave(self, original_node, updated_node):
        node = updated_node
        for handler in handlers:
            if not isinstance(node, kind):
                break
            node = handler(self, original_node, node)
        return node

    leave.__name__ = f"leave_{kind.__name__}"
    return leave


def _leave_reference(handlers: tuple) -> Callable:
    """leave_Attribute/leave_Name: the handlers until one changes the node, else the reference machinery (REFS)."""
    if not handlers:
        return api.reference

    def leave(self, original_node, updated_node):
        for handler in handlers:
            new = handler(self, original_node, updated_node)
            if new is not updated_node:
                return new
        return api.reference(self, original_node, updated_node)

    return leave


for _kind in ("Attribute", "Name"):
    setattr(_Rules, f"leave_{_kind}", _leave_reference(_HOOKS.pop(_kind, ())))
for _kind, _handlers in _HOOKS.items():
    if f"leave_{_kind}" in vars(_Rules) or f"visit_{_kind}" in vars(_Rules):
        raise ValueError(f"port handlers of {_kind} nodes: the transformer's own machinery handles that kind")
    setattr(_Rules, f"leave_{_kind}", _leave(getattr(cst, _kind), _handlers))


class PortTransformer(_Rules):
    """The rules, resolving names from the file's import index (no scope analysis needed)."""

    METADATA_DEPENDENCIES = ()


class ScopedPortTransformer(_Rules):
    """The same rules, resolving names with libcst scope analysis (files where imports are shadowed)."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)


class WindowScopedPortTransformer(_Rules):
    """ScopedPortTransformer for a window of a large file: its scope analysis also holds the rest of the file's
    module-level bindings (speed/scopes.py)."""

    METADATA_DEPENDENCIES = (WindowQualifiedNameProvider,)
    QUALIFIED_NAMES = WindowQualifiedNameProvider

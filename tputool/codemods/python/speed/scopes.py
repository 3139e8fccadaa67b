"""libcst scope analysis of one window of a large file, as if it were done on the whole file.

A file whose import index is inexact (names.py: a torch name rebound, a star import) needs libcst's scope
analysis. A name inside a function or class resolves within its module-level statement, so within its window;
a name that resolves at module level sees every module-level binding of the file (from any window, and from
`global` statements in functions), and an access at module level sees only those made before it. So each
window's global scope is given the file's other module-level bindings: `global_bindings()` reads them from each
window once, and `WindowQualifiedNameProvider` adds the ones of earlier windows before the window is analysed
and those of later windows after it (before libcst links accesses to assignments), as if they stood there.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import BatchableMetadataProvider, MetadataWrapper, ScopeProvider
from libcst.metadata.base_provider import LazyValue
from libcst.metadata.scope_provider import Assignment, GlobalScope, ImportAssignment, ScopeVisitor

# The index given to bindings from later windows: after any access in the window (earlier ones get -1).
_LATER = 1 << 62


@dataclass(frozen=True, slots=True)
class Binding:
    """One module-level binding of a name: `stmt` is the import statement's code (None for other bindings), `alias`
    the position of the import's alias that binds it. (Slotted: a big file holds one per module-level name.)"""

    name: str
    stmt: str | None
    alias: int


def global_bindings(module: cst.Module) -> list[Binding]:
    """The bindings libcst's scope analysis records in the global scope of `module` (one window), in no order."""
    scope = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)[module]
    assert isinstance(scope, GlobalScope)
    out = []
    for a in scope.assignments:
        if isinstance(a, ImportAssignment):
            names = a.node.names
            pos = next(k for k, alias in enumerate(names)
                       if (alias.asname.name if alias.asname is not None else alias.name) is a.as_name)
            out.append(Binding(a.name, module.code_for_node(a.node), pos))
        elif isinstance(a, Assignment):
            out.append(Binding(a.name, None, 0))
    return out


# (bindings of earlier windows, bindings of later windows) for the window being analysed
_OUTSIDE: contextvars.ContextVar[tuple[list[Binding], list[Binding]]] = contextvars.ContextVar("outside")


@contextlib.contextmanager
def outside(earlier: list[Binding], later: list[Binding]) -> Iterator[None]:
    """Analyse the windows resolved inside this block with these bindings of the rest of the file."""
    token = _OUTSIDE.set((earlier, later))
    try:
        yield
    finally:
        _OUTSIDE.reset(token)


def _inject(scope: GlobalScope, bindings: list[Binding], index: int) -> None:
    parsed: dict[str, cst.Import | cst.ImportFrom] = {}
    for b in bindings:
        if b.stmt is None:
            scope._assignments[b.name].add(Assignment(b.name, scope, cst.Name(b.name.split(".")[0]), index))
            continue
        node = parsed.get(b.stmt)
        if node is None:
            line = cst.parse_statement(b.stmt)
            assert isinstance(line, cst.SimpleStatementLine)
            node = parsed[b.stmt] = line.body[0]  # type: ignore[assignment]
        alias = node.names[b.alias]  # type: ignore[index]
        as_name = alias.asname.name if alias.asname is not None else alias.name
        scope._assignments[b.name].add(ImportAssignment(b.name, scope, node, index, as_name))


class WindowScopeProvider(ScopeProvider):
    """ScopeProvider for a window: the global scope also holds the bindings given by `outside()`."""

    def visit_Module(self, node: cst.Module) -> bool | None:
        earlier, later = _OUTSIDE.get()
        visitor = ScopeVisitor(self)
        assert isinstance(visitor.scope, GlobalScope)
        _inject(visitor.scope, earlier, -1)
        node.visit(visitor)
        _inject(visitor.scope, later, _LATER)
        visitor.infer_accesses()
        return None


class WindowQualifiedNameProvider(BatchableMetadataProvider):
    """QualifiedNameProvider over WindowScopeProvider's scopes."""

    METADATA_DEPENDENCIES = (WindowScopeProvider,)

    def visit_Module(self, node: cst.Module) -> bool | None:
        node.visit(_QualifiedNames(self))
        return None


class _QualifiedNames(cst.CSTVisitor):
    """libcst's QualifiedNameVisitor, reading WindowScopeProvider."""

    def __init__(self, provider: WindowQualifiedNameProvider) -> None:
        self.provider = provider

    def on_visit(self, node: cst.CSTNode) -> bool:
        scope = self.provider.get_metadata(WindowScopeProvider, node, None)
        if scope:
            self.provider.set_metadata(node, LazyValue(lambda: scope.get_qualified_names_for(node)))
        else:
            self.provider.set_metadata(node, set())
        return True


__all__ = ["Binding", "WindowQualifiedNameProvider", "global_bindings", "outside"]

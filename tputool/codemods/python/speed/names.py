"""Fast qualified-name resolution from a file's imports, with a flag for when it is not enough.

libcst's QualifiedNameProvider runs full scope analysis (most of the cost of porting a file). When no
imported name is also bound some other way in the file (and no star import hides what a name means), a name's
qualified name is simply its root's import target plus the rest of the dotted path, so the rewriter resolves
names from this index; otherwise port_python falls back to QualifiedNameProvider for that file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class ImportIndex:
    """Bound name -> qualified target of every import in a file; `exact` when that is unambiguous."""

    targets: dict[str, str]
    exact: bool


def build_index(source: str, relevant: frozenset[str] = frozenset(), tree: ast.Module | None = None) -> ImportIndex:
    """Index the imports of `source` (valid Python); `exact` is False when scope analysis is needed.

    Only names whose import target's top-level package is in `relevant` (empty: every package) can make
    the index inexact: shadowing `np` does not matter to rules that only look at torch names. `tree` is
    `ast.parse(source)` when the caller has it already.
    """
    if tree is None:
        tree = parse_ast(source)
        if tree is None:  # libcst accepted it (e.g. a newer grammar): be exact the slow way
            return ImportIndex({}, exact=False)
    builder = IndexBuilder()
    builder.add(tree)
    return builder.index(relevant)


class IndexBuilder:
    """build_index() over a file given in pieces (the ast of each window of a large file, in order)."""

    def __init__(self) -> None:
        self.targets: dict[str, str] = {}
        self.bound: set[str] = set()
        self.conflicts: dict[str, set[str]] = {}  # name -> its meanings, for a name imported with two or more
        self.star_modules: list[str] = []

    def add(self, tree: ast.AST) -> None:
        """Take in the imports and bindings of one piece."""
        targets, bound, conflicts = self.targets, self.bound, self.conflicts
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        _bind(targets, conflicts, a.asname, a.name)
                    else:
                        root = a.name.split(".")[0]
                        _bind(targets, conflicts, root, root)
            elif isinstance(node, ast.ImportFrom):
                if node.level or node.module is None:
                    for a in node.names:
                        bound.add(a.asname or a.name)  # relative import: a local module, not a library
                    continue
                for a in node.names:
                    if a.name == "*":
                        self.star_modules.append(node.module)
                        continue
                    _bind(targets, conflicts, a.asname or a.name, f"{node.module}.{a.name}")
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                bound.add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
            elif isinstance(node, ast.Global | ast.Nonlocal):
                bound.update(node.names)
            elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
                bound.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                bound.add(node.rest)

    def index(self, relevant: frozenset[str] = frozenset()) -> ImportIndex:
        """The index of everything added (see build_index)."""
        targets, bound = self.targets, self.bound
        exact = not any(_matters(m, relevant) for m in self.star_modules)
        if "torch" in bound or any(_matters(targets[n], relevant) for n in bound & targets.keys()):
            exact = False
        # which of two imports of a name wins depends on where a use is: exact only if no meaning is relevant
        clash = any(_matters(t, relevant) for meanings in self.conflicts.values() for t in meanings)
        return ImportIndex(targets, exact and not clash)


def parse_ast(source: str) -> ast.Module | None:
    """`ast.parse(source)`, or None when CPython's parser refuses it."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _matters(target: str, relevant: frozenset[str]) -> bool:
    return not relevant or target.split(".")[0] in relevant


def _bind(targets: dict[str, str], conflicts: dict[str, set[str]], name: str, target: str) -> None:
    """Record an import binding (the first one wins); a name imported with two meanings goes to `conflicts`."""
    old = targets.setdefault(name, target)
    if old != target:
        conflicts.setdefault(name, {old}).add(target)


def resolve(index: ImportIndex, dotted: str) -> str | None:
    """The qualified name of a dotted name under an exact index (None when its root is not imported)."""
    root, _, rest = dotted.partition(".")
    target = index.targets.get(root)
    if target is None:
        return dotted if root == "torch" else None  # `torch` used without an import (snippets)
    return f"{target}.{rest}" if rest else target


Bindings = dict[str, tuple[str, "str | None", "str | None"]]
ImportEntry = tuple[str, "str | None", "str | None"]
"""One imported name: (module, obj, asname); obj is None for `import module [as asname]`."""


def import_bindings(entries: Iterable[ImportEntry]) -> tuple[str | None, Bindings]:
    """The name bound to the torch module (if any) and the removable import bindings, from module-level imports.

    bindings maps a bound name to (module, obj, asname); a rewrite of a name listed here makes its import a
    candidate for imports_prune.prune_imports. `import torch` itself is never listed. Relative and star
    imports are left out by the callers.
    """
    torch_alias: str | None = None
    bindings: Bindings = {}
    for module, obj, asname in entries:
        if obj is not None:
            bindings[asname or obj] = (module, obj, asname)
        elif module == "torch" or (module.startswith("torch.") and asname is None):
            if asname is None or module == "torch":
                torch_alias = torch_alias or (asname or "torch")
        elif asname:
            bindings[asname] = (module, None, asname)
        elif "." not in module:
            bindings[module] = (module, None, None)
    return torch_alias, bindings


def top_imports(tree: ast.Module, lines: list[str]) -> tuple[str | None, Bindings]:
    """import_bindings() of the imports at module level and in the indented bodies of module-level if/try
    blocks (and their except handlers), read from the ast. `lines` are the source lines (to tell an
    indented body from a one-line `if x: import y`)."""
    return import_bindings(entry for level in import_levels(tree, lines) for entry in level)


def import_levels(tree: ast.Module, lines: list[str]) -> list[list[ImportEntry]]:
    """The import entries top_imports() reads, by nesting level (module level first; then the bodies of
    module-level if/try blocks, ...), each level in file order. For a file given in windows, joining each
    level over the windows, in order, gives the whole file's levels."""
    levels: list[list[ImportEntry]] = []
    stmts: list[ast.stmt] = list(tree.body)
    while stmts:
        entries: list[ImportEntry] = []
        nested: list[ast.stmt] = []
        for stmt in stmts:
            if isinstance(stmt, ast.Import):
                entries += [(a.name, None, a.asname) for a in stmt.names]
            elif isinstance(stmt, ast.ImportFrom):
                if stmt.level or stmt.module is None or any(a.name == "*" for a in stmt.names):
                    continue
                entries += [(stmt.module, a.name, a.asname) for a in stmt.names]
            elif isinstance(stmt, ast.If | ast.Try):
                for body in (stmt.body, *(h.body for h in getattr(stmt, "handlers", ()))):
                    if _indented(body[0], lines):
                        nested.extend(body)
        levels.append(entries)
        stmts = nested
    return levels


def _indented(stmt: ast.stmt, lines: list[str]) -> bool:
    """True when a block's first statement starts its own line (an indented body, not `if x: y`)."""
    first = stmt.lineno
    decos = getattr(stmt, "decorator_list", None)
    if decos:
        first = min(first, *(d.lineno for d in decos))
        text = lines[first - 1]
        return text.lstrip(" \t\f")[:1] == "@"
    text = lines[first - 1]
    return not text[:stmt.col_offset].strip(" \t\f")

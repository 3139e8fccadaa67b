"""The machinery every Python rule handler shares: names, positions, suppressions, findings, imports."""

from __future__ import annotations

import re

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, QualifiedNameSource

from tputool.codemods.python.speed.cold import MARKER as COLD_MARKER
from tputool.codemods.python.speed.names import ImportIndex, import_bindings, resolve
from tputool.codemods.python.speed.positions import start_positions
from tputool.codemods.python.tables import FOREIGN_MODULES
from tputool.rules.model import Finding, FixSafety, Settings, Severity, is_suppressed, suppressed_codes
from tputool.rules.port import RULES

_EMPTY = cst.Module(body=[])
_ATTRIBUTE_HANDLER = re.compile(r"^(visit|leave)_[A-Z][A-Za-z]*_\w+$")


# The `extra` dicts of port findings, one per distinct value: a big generated file has ~17 findings per kB, and a
# dict each cost ~1 MB per MB of source. Findings share them, so a finding's `extra` is never written into: whoever
# adds to it replaces it (`f.extra = {**f.extra, ...}`). Bounded: cleared when it holds EXTRAS_MAX of them.
_EXTRAS: dict[tuple[str, bool, str | None], dict[str, str]] = {}
EXTRAS_MAX = 4096


def shared_extra(rule: str, safe_here: bool, note: str | None) -> dict[str, str]:
    """The `extra` of a port finding of rule `rule` (its name): shared by every finding with the same values."""
    key = (rule, safe_here, note or None)
    extra = _EXTRAS.get(key)
    if extra is None:
        if len(_EXTRAS) >= EXTRAS_MAX:
            _EXTRAS.clear()
        extra = {"rule": rule}
        if safe_here:
            extra["fix"] = "safe here"  # the handler proved this place safe (see fire's `safe`)
        if note:
            extra["note"] = note
        _EXTRAS[key] = extra
    return extra

class PortBase(cst.CSTTransformer):
    """Base transformer: handlers call `fire()` to report (and learn whether to rewrite) and build nodes."""

    QUALIFIED_NAMES: type = QualifiedNameProvider  # the scope analysis `qname` reads where the index is inexact

    def __init__(self, context: CodemodContext, source: str, path: str, settings: Settings,
                 wrapper: MetadataWrapper, index: ImportIndex,
                 imports: tuple[str | None, dict[str, tuple[str, str | None, str | None]]] | None = None) -> None:
        super().__init__()
        self.context = context
        self.wrapper = wrapper
        self.index = index
        self._positions: dict[cst.CSTNode, tuple[int, int]] | None = None  # computed on the first finding
        self._has_suppressions = "tputool" in source
        self.path = path
        self.settings = settings
        self.lines = source.splitlines()
        self.findings: list[Finding] = []
        self._decided: dict[tuple[str, int, int], bool] = {}
        self.torch_alias, self.bindings = imports if imports is not None else _scan_imports(wrapper.module)
        self.need_torch_import = False
        self.prune: set[str] = set()  # bound names whose import may have become unused
        self._parents: dict[cst.CSTNode, cst.CSTNode] = {}  # original node -> original parent
        self._stack: list[cst.CSTNode] = []
        self.removed_lines: dict[int, cst.CSTNode] = {}  # placeholder lines standing for removed statements
        self._device_names: frozenset[str] | None = None
        self._text: str | None = None
        self._optional: frozenset[str] | None = None
        self.reported_once: set[str] = set()  # codes reported once per file (TPU603)
        self.needs_whole = False  # an analysis met a statement hidden as cold: port the whole file instead
        self.removed_top = False  # a module-level statement was removed (a window then needs its neighbours)
        self.held: set[cst.CSTNode] = set()  # original nodes kept as CUDA code: nothing inside is rewritten
        self.original = source  # the whole file's text (`source` may hide cold statements; port_python sets it)

    # ---- names and positions ----
    def qname(self, node: cst.CSTNode) -> str | None:
        """The fully qualified name an original pure dotted name (`a.b.c`) refers to through an import."""
        if not isinstance(node, cst.Name | cst.Attribute) or not _is_dotted(node):
            return None
        full = get_full_name_for_node(node)
        if full is None:
            return None
        if self.index.exact:
            return resolve(self.index, full)
        try:
            names = self.get_metadata(self.QUALIFIED_NAMES, node, set())
        except KeyError:
            names = set()
        for q in sorted(names, key=lambda q: q.name):
            if q.source is QualifiedNameSource.IMPORT:
                return q.name
        if full.split(".")[0] == "torch" and not names:
            return full  # `torch` used without an import (snippets): still resolve
        return None

    @property
    def mentions_tpu(self) -> bool:
        """True when the file already names the tpu device (a ported file, or one written for both)."""
        return self._text_has(("'tpu'", '"tpu"', "torch.tpu", "'tpu:", '"tpu:'))

    @property
    def uses_accelerator(self) -> bool:
        """False for a CPU-only file: it names no accelerator and no device at all."""
        return self._text_has(("cuda", "tpu", "device", "xla", "mps", "DataParallel"))

    def _text_has(self, words: tuple[str, ...]) -> bool:
        text = self._text
        if text is None:
            text = self._text = "\n".join(self.lines)
        return any(w in text for w in words)

    def optional_import(self, node: cst.CSTNode) -> bool:
        """True when an original dotted reference starts at a name bound by an optional (try/except ImportError)
        module-level import: the code using it runs only where that library is installed."""
        root = node
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name):
            return False
        names = self._optional
        if names is None:
            from tputool.codemods.python.imports import optional_names

            names = self._optional = optional_names(self.wrapper.module)
        return root.value in names

    def device_names(self) -> frozenset[str]:
        """Names this module assigns from a device value (see device_flow), computed once per file."""
        names = self._device_names
        if names is None:
            from tputool.codemods.python.device_flow import assigned_device_names

            names = self._device_names = assigned_device_names(self.wrapper.module)
        return names

    def foreign(self, node: cst.CSTNode) -> bool:
        """True when an original receiver is a non-torch GPU/array module (numba.cuda, cupy, ...)."""
        if not isinstance(node, cst.Name | cst.Attribute):
            return False
        q = self.qname(node)
        return q is not None and q.split(".")[0] in FOREIGN_MODULES

    def call_qname(self, call: cst.Call) -> str | None:
        """The qualified name of an original call's callee."""
        return self.qname(call.func)

    @staticmethod
    def at(orig: cst.Call, upd: cst.Call, i: int) -> cst.CSTNode:
        """The original argument matching updated argument i (by keyword, else position), or the call."""
        a = upd.args[i]
        if a.keyword is not None:
            for o in orig.args:
                if o.keyword is not None and o.keyword.value == a.keyword.value:
                    return o
            return orig
        if len(orig.args) == len(upd.args) and orig.args[i].keyword is None:
            return orig.args[i]
        return orig

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # on_visit_attribute/on_leave_attribute below skip libcst's per-field lookups: no such handlers.
        bad = [n for n in dir(cls) if _ATTRIBUTE_HANDLER.match(n) and _handler(cls, n) is not None]
        if bad:
            raise TypeError(f"{cls.__name__}: attribute handlers are not dispatched: {bad}")
        cls._dispatch = {}

    def _handlers(self, kind: type) -> tuple:
        """The (visit_X, leave_X) functions of this class for node type X (None where absent), cached."""
        name = kind.__name__
        found = (_handler(type(self), f"visit_{name}"), _handler(type(self), f"leave_{name}"))
        self._dispatch[kind] = found
        return found

    def on_visit(self, node: cst.CSTNode) -> bool:
        # Same as CSTTransformer.on_visit, with the handler lookup cached per node type.
        if self._stack:
            self._parents[node] = self._stack[-1]
        self._stack.append(node)
        visit = (self._dispatch.get(type(node)) or self._handlers(type(node)))[0]
        return visit is None or visit(self, node) is not False

    def on_leave(self, original_node, updated_node):
        self._stack.pop()
        leave = (self._dispatch.get(type(original_node)) or self._handlers(type(original_node)))[1]
        return updated_node if leave is None else leave(self, original_node, updated_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The parent of an original node (None at the module); known for every node visited so far."""
        return self._parents.get(node)

    def know_parents(self, root: cst.CSTNode) -> None:
        """Record the parents inside an original subtree not visited yet (analyses reading ahead of the visit)."""
        stack = [root]
        while stack:
            node = stack.pop()
            for child in node.children:
                self._parents.setdefault(child, node)
                stack.append(child)

    def pos(self, node: cst.CSTNode) -> tuple[int, int]:
        """1-based (line, column) of an original node."""
        if self._positions is None:
            self._positions = start_positions(self.wrapper.module)
        p = self._positions.get(node)
        return (p[0], p[1] + 1) if p is not None else (1, 1)

    def statement_line(self, node: cst.CSTNode) -> int:
        """First line of the statement that holds an original node."""
        cur: cst.CSTNode | None = node
        while cur is not None and not isinstance(cur, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            cur = self.parent(cur)
        return self.pos(cur)[0] if cur is not None else self.pos(node)[0]

    # ---- findings ----
    def fire(self, code: str, node: cst.CSTNode, *, fixable: bool = True, message: str | None = None,
             note: str | None = None, safe: bool | None = None, severity: Severity | None = None) -> bool:
        """Report rule `code` at an original node; True when its rewrite should be applied.

        Nothing is reported (and False returned) when the rule is not selected or the line suppresses it.
        `fixable=False` reports a finding whose rewrite does not apply at this place. `safe` overrides the
        rule's fix safety at this place (True: the handler proved the rewrite keeps the meaning here);
        `severity` lowers the rule's severity where the context makes the finding matter less.
        """
        rule = RULES[code]
        if not self.settings.enabled(code) or (self.held and self.inside_held(node)):
            return False
        line, col = self.pos(node)
        key = (code, line, col)
        if key in self._decided:
            return self._decided[key]
        for ln in {line, self.statement_line(node)} if self._has_suppressions else ():
            text = self.lines[ln - 1] if 0 < ln <= len(self.lines) else ""
            if is_suppressed(code, suppressed_codes(text)):
                self._decided[key] = False
                return False
        has_fix = fixable and rule.fix is not FixSafety.NONE
        is_safe = rule.fix is FixSafety.SAFE if safe is None else safe
        apply = has_fix and (is_safe or self.settings.unsafe_fixes)
        extra = shared_extra(rule.name, bool(safe and rule.fix is FixSafety.UNSAFE and has_fix), note)
        self.findings.append(Finding(path=self.path, line=line, col=col, code=code,
                                     message=message or rule.message, severity=severity or rule.severity,
                                     fixed=apply, fixable=has_fix, extra=extra))
        self._decided[key] = apply
        return apply

    def whole_code(self, node: cst.CSTNode) -> str:
        """Source text of an original node; where it holds statements hidden as cold, the file is ported again
        whole (`needs_whole`), so an analysis reading the text decides on all of it."""
        text = self.code(node)
        if COLD_MARKER in text:
            self.needs_whole = True
        return text

    def hold(self, node: cst.CSTNode) -> None:
        """Keep an original node as CUDA code: no rule reports or rewrites anything inside it afterwards."""
        self.held.add(node)

    def inside_held(self, node: cst.CSTNode) -> bool:
        """True when an original node lies inside (or is) a node kept by `hold`."""
        cur: cst.CSTNode | None = node
        while cur is not None:
            if cur in self.held:
                return True
            cur = self.parent(cur)
        return False

    # ---- building nodes ----
    def torch(self, dotted: str = "") -> str:
        """Source text for `torch.<dotted>` using the file's torch alias (adds `import torch` if missing)."""
        if self.torch_alias is None:
            self.need_torch_import = True
            alias = "torch"
        else:
            alias = self.torch_alias
        return f"{alias}.{dotted}" if dotted else alias

    def expr(self, text: str) -> cst.BaseExpression:
        """Parse an expression built from text."""
        return cst.parse_expression(text)

    @staticmethod
    def code(node: cst.CSTNode) -> str:
        """Source text of a node."""
        return _EMPTY.code_for_node(node)

    def replaced(self, original: cst.CSTNode) -> None:
        """Note that a dotted reference was rewritten, so the import it came through may become unused."""
        root = original
        while isinstance(root, cst.Attribute):
            root = root.value
        if isinstance(root, cst.Call):
            return self.replaced(root.func)
        if isinstance(root, cst.Name) and root.value in self.bindings:
            self.prune.add(root.value)

    def finish(self) -> None:
        """Schedule the `import torch` that rewrites need."""
        if self.need_torch_import:
            AddImportsVisitor.add_needed_import(self.context, "torch")


def keyword_args(args: list[cst.Arg]):
    """Yield (index, arg, keyword name) for each keyword argument of a call's argument list."""
    for i, a in enumerate(args):
        if a.keyword is not None:
            yield i, a, a.keyword.value


def _handler(cls: type, name: str):
    """The function `cls.<name>`, or None when absent or one of libcst's no-op stubs."""
    fn = getattr(cls, name, None)
    return None if fn is None or getattr(fn, "_is_no_op", False) else fn


def _is_dotted(node: cst.BaseExpression) -> bool:
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _scan_imports(module: cst.Module) -> tuple[str | None, dict[str, tuple[str, str | None, str | None]]]:
    """names.import_bindings() of the module-level imports, read from the libcst tree (used where CPython's
    ast could not parse the file; elsewhere port_python passes names.top_imports())."""
    return import_bindings(_cst_imports(module))


def _cst_imports(module: cst.Module):
    for node in _top_imports(module):
        if isinstance(node, cst.Import):
            for a in node.names:
                asname = a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else None
                yield get_full_name_for_node(a.name) or "", None, asname
        elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
            if node.relative or node.module is None:
                continue
            mod = get_full_name_for_node(node.module) or ""
            for a in node.names:
                if isinstance(a.name, cst.Name):
                    asname = a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else None
                    yield mod, a.name.value, asname


def _top_imports(module: cst.Module):
    """Import statements at module level and inside module-level if/try blocks."""
    stack: list[cst.CSTNode] = list(module.body)
    while stack:
        stmt = stack.pop(0)
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import | cst.ImportFrom):
                    yield small
        elif isinstance(stmt, cst.If | cst.Try):
            body = stmt.body
            if isinstance(body, cst.IndentedBlock):
                stack.extend(body.body)
            handlers = getattr(stmt, "handlers", ())
            for h in handlers:
                if isinstance(h.body, cst.IndentedBlock):
                    stack.extend(h.body.body)

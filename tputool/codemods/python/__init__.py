"""The Python rewriter of `tputool port`: `port_python(source, path, settings)` and its pre-filter bytes."""

from __future__ import annotations

import ast
import re

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper

from tputool.codemods.python.registry import port_rules, triggers
from tputool.codemods.python.speed.cold_triggers import mask_triggers
from tputool.codemods.python.speed.imports_prune import prune_imports
from tputool.codemods.python.tables import RELEVANT_ROOTS
from tputool.rules.model import Finding, Settings

# At least one of these byte strings appears in any file where a Python rule can fire; the engine skips
# files holding none of them (tests/codemods/test_rules_fixtures.py checks every fixture input has one).
# They are the catalogue rules' triggers (tputool/rules/port.py), derived in registry.py.
_TRIGGERS = triggers(port_rules())
PYTHON_TRIGGERS: tuple[bytes, ...] = _TRIGGERS.prefilter()


def port_python(source: str, path: str, settings: Settings) -> tuple[str, list[Finding]]:
    """Rewrite one Python file for TPU; returns (new source, findings sorted by position).

    The source comes back identical when nothing changes. Raises libcst.ParserSyntaxError on input
    libcst cannot parse; never raises on valid Python. Statements no rule can touch are hidden from
    libcst (see cold.py); the result is the same as porting the whole file, which is the fallback.
    """
    from tputool.codemods.python.speed.cold import MARKER, mask
    from tputool.codemods.python.speed.names import build_index, parse_ast, top_imports

    if is_torchscript_code(source):
        return source, []
    if len(source) > WINDOW_CHARS and MARKER not in source:
        done = _port_windows(source, path, settings)
        if done is not None:
            return done
    tree = parse_ast(source)
    index = build_index(source, RELEVANT_ROOTS, tree)
    masked = imports = None
    if tree is not None and index.exact:
        masked = mask(source, tree, _MASK_TRIGGERS, _trigger_names(index.targets))
        if masked is not None:
            imports = top_imports(tree, masked.lines)
    del tree  # the ast is not needed any more: libcst's tree is what peaks (memory per MB of source)
    if masked is not None:
        try:
            done = _port(masked.text, path, settings, index, imports, whole=False, original=source)
        except cst.ParserSyntaxError:
            done = None
        if done is not None:
            new_text, findings = done
            for f in findings:  # (the transformer's own findings: renumbered in place, not copied)
                f.line = masked.line(f.line)
            if new_text is masked.text:
                return source, findings
            restored = masked.unmask(new_text)
            if restored is not None:
                return restored, findings
    done = _port(source, path, settings, index, None, whole=True)
    assert done is not None
    return done


# The code TorchScript serializes into a model archive (code/__torch__/*.py): classes with `__parameters__` lists
# and `__torch__.` type annotations.
_TORCHSCRIPT_CODE = re.compile(r"^\s+__parameters__ = \[.*?:\s*__torch__\.", re.M | re.S)


def is_torchscript_code(source: str) -> bool:
    """True for the code of a serialized TorchScript model (devices there were baked in when it was traced or
    scripted: not a program to port; re-export the model from the ported source instead)."""
    return "__torch__." in source and "__parameters__" in source and _TORCHSCRIPT_CODE.search(source) is not None


# Files longer than this are rewritten a window of module-level statements at a time (each window about
# WINDOW_SIZE long, everything outside it hidden like a cold statement): libcst's tree of a window, not of the
# whole file, is what peaks in memory (about 0.5 GB per MB of window). Where a window's rewrite needs more of the
# file, the file is ported whole. Smaller windows hold less (8 kB: ~4 MB of tree, 16 kB ~8) and change neither
# the output nor (measured) the time; a file under WINDOW_CHARS is ported whole, which parses it once, not twice.
WINDOW_CHARS = 128_000
WINDOW_SIZE = 8_000


def _port_windows(source: str, path: str, settings: Settings) -> tuple[str, list[Finding]] | None:
    """Port `source` one window of module-level statements at a time (speed/windows.py), never holding a tree
    of the whole file; None when it cannot be (then the caller ports the whole file)."""
    from tputool.codemods.python.speed import windows as win
    from tputool.codemods.python.speed.cold import Hider, SourceLines
    from tputool.codemods.python.speed.names import IndexBuilder, import_bindings, import_levels

    units = win.module_units(source)
    if not units:
        return None
    lines = SourceLines(source)
    ranges = win.windows(units, lines.starts, WINDOW_SIZE)
    if len(ranges) < 2:
        return None

    def window_ast(first: int, last: int):  # line numbers as in the file
        try:
            tree = ast.parse(lines.join(first - 1, last))
        except (SyntaxError, ValueError):
            return None
        return ast.increment_lineno(tree, first - 1)

    builder, levels = IndexBuilder(), []
    for first, last, _ in ranges:
        tree = window_ast(first, last)
        if tree is None:
            return None
        builder.add(tree)
        levels.append(import_levels(tree, lines))
    del tree
    index = builder.index(RELEVANT_ROOTS)  # inexact: names resolve by scope analysis, per window (speed/scopes.py)
    depth = max(map(len, levels))
    imports = import_bindings(e for d in range(depth) for lv in levels if d < len(lv) for e in lv[d])
    del levels
    hider = Hider(source, _MASK_TRIGGERS, _trigger_names(index.targets), lines)

    plans = []  # what each window hides: the rest of the file and, under an exact index, its cold code
    for k, (first, last, _) in enumerate(ranges):
        hidden = []
        if k:
            hidden.append((units[0][0], first - 1))
        if k + 1 < len(ranges):
            hidden.append((units[ranges[k + 1][2]][0], units[-1][1]))
        if index.exact:
            tree = window_ast(first, last)
            if tree is None:
                return None
            plans.append(hider.plan(tree.body, hidden))
            del tree
        else:  # hiding a cold statement would change what a name means in scope analysis: only other windows
            plans.append(hider.plan([], hidden))

    def masked(k: int):  # window k's masked text, made from its plan when it is read
        return hider.build(plans[k])

    # the lines between a window's last one and the first statement of the next show in both (the next one's)
    shown = [units[ranges[k + 1][2]][0] - last - 1 if k + 1 < len(ranges) else None
             for k, (_, last, _) in enumerate(ranges)]
    spans = [(first, last) for first, last, _ in ranges]
    return _port_masks(source, spans, shown, masked, path, settings, index, imports)


def _port_masks(source: str, spans: list[tuple[int, int]], shown: list[int | None], masked, path: str,
                settings: Settings, index, imports) -> tuple[str, list[Finding]] | None:
    """Port each window's masked text and join the results. `spans`: each window's (first, last) line; `shown`: the
    count of lines after the window shown before the marker hiding the rest of the file (None for the last window);
    `masked(k)`: window k's cold.Masked, made when it is read (twice: all windows' masked texts at once would
    cost as much as the file's text again)."""
    from tputool.codemods.python.speed.cold import join
    from tputool.codemods.python.speed.windows import Collector, gather

    try:
        facts = gather(source, (masked(k).text for k in range(len(spans))), index)
    except cst.ParserSyntaxError:
        return None
    pieces: list[str] = []
    findings: list[Finding] = []
    collector = Collector()
    for k, (first, last) in enumerate(spans):
        window = masked(k)
        own = join(window.lines, first - 1, last)
        try:
            done = _port(window.text, path, settings, index, imports, whole=False, facts=facts, window=k)
        except cst.ParserSyntaxError:
            return None
        collector.parsed(len(own))
        if done is None:
            return None
        new_text, found = done
        for f in found:
            n = window.line(f.line)
            if not first <= n <= last:
                return None
            f.line = n  # (in place: a copy of each would cost as much again while the windows are ported)
            findings.append(f)
        if new_text is window.text:
            pieces.append(own)
            continue
        restored = window.unmask_window(new_text, before=k > 0, after=shown[k])
        if restored is None:
            return None
        pieces.append(restored)
    del facts, window
    collector.flush()  # the last windows' trees, before the caller goes on (a diff of the whole file)
    findings.sort(key=lambda f: (f.line, f.col, f.code))
    new_source = "".join(pieces)
    del pieces
    return (source if new_source == source else new_source), findings


_ALL_TRIGGERS = tuple(t.decode() for t in PYTHON_TRIGGERS)
_MASK_TRIGGERS = mask_triggers(_TRIGGERS)


def _trigger_names(targets: dict[str, str]) -> list[str]:
    """Names bound by an import whose target holds a trigger (`from torch.cuda import amp`: amp)."""
    return [name for name, target in targets.items() if any(t in target for t in _ALL_TRIGGERS)]


def _port(source: str, path: str, settings: Settings, index, imports, whole: bool, facts=None, window: int = 0,
          original: str | None = None) -> tuple[str, list[Finding]] | None:
    """Run the rules over `source`; None when a part of the file was hidden and a rewrite needs it all.

    (Adding `import torch` and pruning imports left unused look at the whole module.) `imports` is
    names.top_imports() of the whole file, or None to read them from `source`.
    """
    from tputool.codemods.python.speed.scopes import outside
    from tputool.codemods.python.transformer import (
        PortTransformer,
        ScopedPortTransformer,
        WindowScopedPortTransformer,
    )

    module = cst.parse_module(source)
    context = CodemodContext(filename=path)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scoped_window = facts is not None and not index.exact
    cls = PortTransformer if index.exact else WindowScopedPortTransformer if scoped_window else ScopedPortTransformer
    transformer = cls(context, source, path, settings, wrapper, index, imports)
    transformer.original = original if original is not None else source
    if facts is not None:  # window `window` of a large file: the file-level facts come from all of it (windows.py)
        facts.apply(transformer)
    if scoped_window:
        with outside(*facts.outside(window, source)):
            new_module = wrapper.visit(transformer)
    else:
        new_module = wrapper.visit(transformer)
    transformer.finish()
    if not whole and (transformer.needs_whole or (facts is not None and transformer.removed_top)):
        return None
    findings = sorted(transformer.findings, key=lambda f: (f.line, f.col, f.code))
    if not any(f.fixed for f in findings):
        return source, findings
    needs_imports = bool(context.scratch.get(AddImportsVisitor.CONTEXT_KEY))
    if not whole and (needs_imports or transformer.prune):
        return None
    if needs_imports:
        new_module = AddImportsVisitor(context).transform_module(new_module)
    new_module = prune_imports(new_module, transformer.prune)
    return new_module.code, findings


__all__ = ["PYTHON_TRIGGERS", "port_python"]

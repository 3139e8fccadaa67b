"""Porting a large file a window at a time, never holding a tree of the whole file.

`module_units()` finds the file's module-level statements by tokenizing it (no tree), `windows()` groups them
into windows of about a given size. Each window is parsed on its own (ast, then libcst) with everything
outside it hidden like a cold statement (cold.py), so memory follows the window, not the file.

A few rules decide on facts of the whole file: its text (does it name the tpu device, an accelerator, float32
buffers), its optional imports, whether it sets a CUDA default tensor type, the names it assigns from a device
value, and the codes already reported once. When port_python rewrites a large file a window at a time (see
__init__.py), `gather()` reads these facts from every window first and `FileFacts.apply()` gives them to each
window's transformer, so a window decides as the whole file would.
"""

from __future__ import annotations

import gc
import re
import tokenize
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper
from libcst.metadata.base_provider import LazyValue

from tputool.codemods.python.speed.names import ImportIndex
from tputool.codemods.python.speed.scopes import (
    Binding,
    WindowQualifiedNameProvider,
    global_bindings,
    outside,
)

# A module-level line starting with one of these continues the statement before it.
_CLAUSES = frozenset({"else", "elif", "except", "finally"})
_WORD = re.compile(r"\w+")
_SKIP = frozenset({tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE,
                   tokenize.ENDMARKER})


def module_units(source: str) -> list[tuple[int, int]] | None:
    """1-based (first, last) lines of each module-level statement (a decorated definition from its first
    decorator, a compound statement with its else/except/finally clauses, `a = 1; b = 2` as one), found by
    tokenizing; None when the tokenizer refuses the text."""
    units: list[tuple[int, int]] = []
    first = last = 0
    depth = 0
    at_start = True
    decorated = False
    try:
        for tok in tokenize.generate_tokens(_readline(source)):
            kind = tok.type
            if kind == tokenize.INDENT:
                depth += 1
            elif kind == tokenize.DEDENT:
                depth -= 1
            elif kind == tokenize.NEWLINE:
                at_start = True
            if kind in _SKIP:
                continue
            if at_start and depth == 0:
                starts_unit = not decorated and not (kind == tokenize.NAME and tok.string in _CLAUSES)
                if starts_unit:
                    if first:
                        units.append((first, last))
                    first = tok.start[0]
                decorated = kind == tokenize.OP and tok.string == "@"
            at_start = False
            last = tok.end[0]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    if first:
        units.append((first, last))
    return units


def _readline(source: str):
    """io.StringIO(source).readline without the copy: a StringIO holds 4 bytes per character of its text."""
    at, end = 0, len(source)

    def readline() -> str:
        nonlocal at
        if at >= end:
            return ""
        stop = source.find("\n", at)
        stop = end if stop < 0 else stop + 1
        line = source[at:stop]
        at = stop
        return line

    return readline

def windows(units: list[tuple[int, int]], starts: array, budget: int) -> list[tuple[int, int, int]]:
    """Consecutive 1-based line ranges (first, last) covering the file (`starts`: each line's offset, and the
    length at the end), each ending where a module-level statement ends and holding about `budget`
    characters (more where one statement is larger); with each, the index of its first unit."""
    out: list[tuple[int, int, int]] = []
    first, unit0 = 1, 0
    for k, (_, last) in enumerate(units):
        if starts[last] - starts[first - 1] >= budget:
            out.append((first, last, unit0))
            first, unit0 = last + 1, k + 1
    n_lines = len(starts) - 1
    if unit0 < len(units):
        out.append((first, n_lines, unit0))
    elif out:
        out[-1] = (out[-1][0], n_lines, out[-1][2])
    return out


@dataclass
class FileFacts:
    """The file-level facts a transformer would otherwise compute from its own (partial) module."""

    text: str  # the file's source: what the transformers' substring tests (PortBase._text_has) read
    float32_buffers: bool
    optional: frozenset[str]
    sets_cuda_default: bool
    device_names: frozenset[str]
    reported_once: set[str] = field(default_factory=set)  # shared by the windows, in file order
    # where names need scope analysis (an inexact index): the file's module-level bindings (scopes.py) by the
    # name's first part, each distinct binding once, with the first and last window that makes it
    bindings: dict[str, dict[Binding, tuple[int, int]]] | None = None

    def outside(self, k: int, text: str) -> tuple[list[Binding], list[Binding]]:
        """The module-level bindings of the windows before window `k` and of those after it, of the names that
        window `k` (`text`) holds (no other name is looked up there), each distinct binding once a side.

        A name's qualified names are the union of its bindings' (libcst's scope analysis), and an access at module
        level sees the earlier side only: equal bindings on one side give what one of them gives. (A file that
        imports the same module 2,000 times gave each window 2,000 equal bindings to link every access to.)"""
        assert self.bindings is not None
        earlier: list[Binding] = []
        later: list[Binding] = []
        for word in set(_WORD.findall(text)) & self.bindings.keys():
            for b, (first, last) in self.bindings[word].items():
                if first < k:
                    earlier.append(b)
                if last > k:
                    later.append(b)
        return earlier, later

    def apply(self, t) -> None:
        """Give these facts to a window's transformer (a PortBase)."""
        t._text = self.text
        t._float32_buffers = self.float32_buffers
        t._optional = self.optional
        t._sets_cuda_default = self.sets_cuda_default
        t._device_names = self.device_names
        t.reported_once = self.reported_once


# Line breaks str.splitlines() knows besides "\n" (a transformer's `_text` joins its lines with "\n").
_OTHER_BREAKS = re.compile("[\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def float32_buffers(source: str) -> bool:
    """api.stores_float32_buffers of the file's lines joined by "\n", as a transformer of the whole file reads it
    (the same as of the source itself, unless the source breaks lines otherwise: its regex's `.` crosses those).
    Any other test of a word (no line break in it) finds it in the source itself as in those joined lines."""
    from tputool.codemods.python.api import stores_float32_buffers

    return stores_float32_buffers("\n".join(source.splitlines()) if _OTHER_BREAKS.search(source) else source)


class _Names:
    """Name resolution as a transformer does it: through the file's import index (an exact one), or through the
    scope analysis of one window (`qnames`: WindowQualifiedNameProvider's values)."""

    QUALIFIED_NAMES = WindowQualifiedNameProvider

    def __init__(self, index: ImportIndex, qnames=None) -> None:
        self.index = index
        self.qnames = qnames

    def get_metadata(self, key, node, default):
        """The window's qualified names of `node` (PortBase.qname's call)."""
        value = self.qnames.get(node, default)
        return value() if isinstance(value, LazyValue) else value

    def qname(self, node: cst.CSTNode) -> str | None:
        from tputool.codemods.python.context import PortBase

        return PortBase.qname(self, node)  # type: ignore[arg-type]


# Parsed windows' libcst trees hold reference cycles: a full collection frees them before the next window grows
# the heap. It traverses every object the process holds (seconds in a large one), so it runs once per this many
# characters parsed (about once per full window), not once per tiny one.
COLLECT_CHARS = 64_000


class Collector:
    """Runs a full garbage collection once per COLLECT_CHARS characters of windows parsed."""

    def __init__(self) -> None:
        self.chars = 0

    def parsed(self, chars: int) -> None:
        """Count `chars` characters parsed; collect when they add up to COLLECT_CHARS."""
        self.chars += chars
        if self.chars >= COLLECT_CHARS:
            self.flush()

    def flush(self) -> None:
        """Collect now, if anything was parsed since the last collection."""
        if self.chars:
            gc.collect()
            self.chars = 0


def gather(source: str, window_texts: Iterable[str], index: ImportIndex) -> FileFacts:
    """The facts of the file `source`, read from the masked text of each of its windows (parsed one at a time).

    Under an inexact index, also each window's module-level bindings; whether the file sets a CUDA default tensor
    type is then decided once they are all known (a second parse of the windows that name it)."""
    from tputool.codemods.python.api import sets_cuda_default
    from tputool.codemods.python.device_flow import device_assigns, names_from_assigns
    from tputool.codemods.python.imports import optional_names

    names = _Names(index)
    optional: set[str] = set()
    sets_default = False
    assigns: list = []
    bindings: dict[str, dict[Binding, tuple[int, int]]] = {}
    n = 0  # windows read
    naming: list[tuple[int, str]] = []  # windows naming set_default_tensor_type, under an inexact index
    collector = Collector()
    for window in window_texts:
        module = cst.parse_module(window)
        optional |= optional_names(module)
        if index.exact:  # (the call's name is spelled out in the text wherever it is found: a cheap test first)
            sets_default = sets_default or ("set_default_tensor_type" in window and sets_cuda_default(names, module))
        else:
            for b in global_bindings(module):
                spans = bindings.setdefault(b.name.split(".", 1)[0], {})
                span = spans.get(b)
                spans[b] = (n, n) if span is None else (span[0], n)
            if "set_default_tensor_type" in window:
                naming.append((n, window))
        n += 1
        assigns += device_assigns(module)
        del module
        collector.parsed(len(window))
    facts = FileFacts(source, float32_buffers(source), frozenset(optional), sets_default,
                      names_from_assigns(assigns), bindings=None if index.exact else bindings)
    for k, window in naming:
        if facts.sets_cuda_default:
            break
        module = cst.parse_module(window)
        with outside(*facts.outside(k, window)):
            qnames = MetadataWrapper(module, unsafe_skip_copy=True).resolve(WindowQualifiedNameProvider)
        facts.sets_cuda_default = sets_cuda_default(_Names(index, qnames), module)
        del module, qnames
    return facts

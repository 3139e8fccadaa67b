"""Hide the statements no rule can touch, so the rewriter parses and visits only the rest of a file.

A rule can only fire where one of its trigger strings occurs (see cold_triggers.py; a name imported from a
target holding a trigger counts as one), and every trigger is a single-line string. So a statement none of
whose lines holds a trigger is "cold": `mask()` replaces each run of cold sibling statements (at any depth)
by a one-line marker at the same indentation. The rewriter runs on that masked text; `Masked.line()` maps
its line numbers back, and `Masked.unmask()` puts the cold statements back into its output, or returns
None when the output does not hold every marker exactly as written (the caller then ports the whole file).
"""

from __future__ import annotations

import ast
import bisect
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from tputool.codemods.python.speed.cold_triggers import MaskTriggers

MARKER = "__portcold"
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n|$)")
_DIGIT = re.compile(r"[0-9]")
_BODIES = ("body", "orelse", "finalbody")


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split only where Python's tokenizer ends a line (\\r\\n, \\r, \\n)."""
    lines = _LINE.findall(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


class SourceLines:
    """split_lines(text) as slices of the text, made when read: a big file's lines held as strings cost about three
    times its text (49 bytes a string, 8 a list entry), these 8 bytes a line (`starts`: each line's offset)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = array("q", [0])
        for m in _LINE.finditer(text):
            if m.end() > m.start():
                self.starts.append(m.end())

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, k: int | slice) -> str | list[str]:
        """Line `k` (0-based), or a list of the lines of slice `k`."""
        if isinstance(k, slice):
            return [self.text[self.starts[i]:self.starts[i + 1]] for i in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        return self.text[self.starts[k]:self.starts[k + 1]]

    def join(self, start: int, stop: int) -> str:
        """"".join(self[start:stop]), as one slice of the text."""
        stop = min(stop, len(self))
        return self.text[self.starts[start]:self.starts[stop]] if start < stop else ""


Lines = list[str] | SourceLines


def join(lines: Lines, start: int, stop: int) -> str:
    """"".join(lines[start:stop]) (0-based, stop exclusive), for a list or a SourceLines."""
    return lines.join(start, stop) if isinstance(lines, SourceLines) else "".join(lines[start:stop])


@dataclass
class Masked:
    """A file with its cold statements hidden: `text` for the rewriter, what is needed to restore them."""

    text: str
    lines: Lines  # the original lines
    spans: dict[str, tuple[str, int, int]]  # marker name -> (marker line, first line index, line count)
    marker_rows: list[int]  # 1-based line of each marker in `text`, ascending
    shifts: list[int]  # lines hidden by the markers up to and including each one

    def line(self, masked_line: int) -> int:
        """The original line number of a line of `text` (a marker maps to its first hidden line)."""
        k = bisect.bisect_left(self.marker_rows, masked_line)
        return masked_line + (self.shifts[k - 1] if k else 0)

    def unmask(self, new_text: str) -> str | None:
        """`new_text` (the rewriter's output for `text`) with the cold statements put back, or None."""
        return self._restore(split_lines(new_text), len(self.spans), ())

    def unmask_window(self, new_text: str, before: bool, after: int | None) -> str | None:
        """unmask() of the rewriter's output for one window of a file, giving only the window's text. `before`: the
        first marker hides the file before the window; it and the lines before it must come back unchanged.
        `after` (None: nothing): the last marker hides the file after the window, shown after this many lines of
        the next window; those lines and the rest must come back unchanged. None where they do not, or where a
        cold statement cannot go back."""
        new, old = split_lines(new_text), split_lines(self.text)
        head = self.marker_rows[0] if before else 0  # lines up to the marker of the file before the window
        tail = len(old) - self.marker_rows[-1] + 1 + after if after is not None else 0
        if len(new) < head + tail or new[:head] != old[:head] or new[len(new) - tail:] != old[len(old) - tail:]:
            return None
        names = sorted(self.spans, key=lambda name: self.spans[name][1])
        ends = names[:before] + (names[-1:] if after is not None else [])
        return self._restore(new[head:len(new) - tail], len(self.spans) - len(ends), ends)

    def _restore(self, lines: list[str], expected: int, absent: Iterable[str]) -> str | None:
        """`lines` with each marker replaced by the lines it hides; None unless `expected` markers are met, each
        as written, and none of `absent`."""
        out: list[str] = []
        seen = 0
        absent = set(absent)
        for line in lines:
            name = line.strip() if MARKER in line else None
            span = self.spans.get(name) if name is not None else None
            if span is None:
                out.append(line)
                continue
            marker, first, count = span
            if line != marker or name in absent:  # a rewrite moved it (e.g. unwrapped a `with`): cannot go back
                return None
            out.append(join(self.lines, first, first + count))
            seen += 1
        return "".join(out) if seen == expected else None


def line_starts(lines: Lines) -> array:
    """Offset of each line's first character, plus the text's length at the end (an array of 8-byte ints)."""
    if isinstance(lines, SourceLines):
        return lines.starts
    starts = array("q", [0])
    at = 0
    for ln in lines:
        at += len(ln)
        starts.append(at)
    return starts


def hot_lines(source: str, starts: array, substrings: Iterable[str], words: Iterable[str]) -> bytearray:
    """1 for each (0-based) line (beginning at `starts`) holding one of `substrings`, or a whole word of `words`."""
    hot = bytearray(len(starts))
    for t in substrings:
        at = source.find(t)
        while at >= 0:
            row = bisect.bisect_right(starts, at) - 1
            hot[row] = 1
            at = source.find(t, starts[row + 1]) if row + 1 < len(starts) else -1
    words = sorted(set(words))
    if words:
        rx = re.compile(r"\b(?:" + "|".join(map(re.escape, words)) + r")\b")
        for m in rx.finditer(source):
            hot[bisect.bisect_right(starts, m.start()) - 1] = 1
    return hot


def mask(source: str, tree: ast.Module, triggers: MaskTriggers, names: Iterable[str] = ()) -> Masked | None:
    """`source` (parsed as `tree`) with its cold statements replaced by markers; None when none is cold.

    `names`: names bound in this file to an import target that holds a trigger (they count as words).
    """
    if MARKER in source:
        return None
    return Hider(source, triggers, names).mask(tree.body)


class Hider:
    """What is hot in one file, found once; `mask()` hides the cold statements of a statement list (the file's,
    or one window's when a large file is rewritten a window at a time) and any line spans it is given."""

    def __init__(self, source: str, triggers: MaskTriggers, names: Iterable[str] = (), lines: Lines | None = None
                 ) -> None:
        self.lines = split_lines(source) if lines is None else lines  # (`lines`: the caller's lines of source)
        self.starts = line_starts(self.lines)
        self.hot = hot_lines(source, self.starts, triggers.substrings, (*triggers.words, *names))
        self.dim = hot_lines(source, self.starts, (), triggers.digit_words) if triggers.digit_words else None

    def mask(self, body: list[ast.stmt], hidden: Iterable[tuple[int, int]] = ()) -> Masked | None:
        """The file with the cold statements of `body` and the 1-based line spans `hidden` (first, last) replaced
        by markers; None when nothing is hidden."""
        return self.build(self.plan(body, hidden))

    def plan(self, body: list[ast.stmt], hidden: Iterable[tuple[int, int]] = ()) -> list[tuple[int, int]]:
        """What mask() hides: (first line index, line count) of each span (a few numbers, where the masked text
        costs as much as the text it shows)."""
        plan = _Planner(self.lines, self.hot, self.dim)
        plan.block(body)
        plan.spans += [(first - 1, last - first + 1) for first, last in hidden]
        return plan.spans

    def build(self, plan: list[tuple[int, int]]) -> Masked | None:
        """The file with the spans of `plan` (Hider.plan) replaced by markers; None when the plan is empty."""
        if not plan:
            return None
        lines = self.lines
        out: list[str] = []
        spans: dict[str, tuple[str, int, int]] = {}
        rows: list[int] = []
        shifts: list[int] = []
        pos = 0
        for n, (first, count) in enumerate(sorted(plan)):
            out.append(join(lines, pos, first))
            line = lines[first]
            body_text = line.rstrip("\r\n")
            indent = body_text[:len(body_text) - len(body_text.lstrip(" \t\f"))]
            last = lines[first + count - 1]
            name = f"{MARKER}{n}__"
            marker = indent + name + (last[len(last.rstrip("\r\n")):] or "\n")
            out.append(marker)
            before = shifts[-1] if shifts else 0
            rows.append(first - before + 1)  # (the lines before it, less those the markers before it hide)
            shifts.append(before + count - 1)
            spans[name] = (marker, first, count)
            pos = first + count
        out.append(join(lines, pos, len(lines)))
        return Masked("".join(out), lines, spans, rows, shifts)


def _units(body: list[ast.stmt]):
    """The statements of a list grouped by shared lines (`a = 1; b = 2` is one unit)."""
    i = 0
    while i < len(body):
        j = i + 1
        while j < len(body) and _first_line(body[j]) <= body[j - 1].end_lineno:
            j += 1
        yield body[i:j]
        i = j


def _first_line(stmt: ast.stmt) -> int:
    decos = getattr(stmt, "decorator_list", None)
    return min([stmt.lineno, *(d.lineno for d in decos)]) if decos else stmt.lineno


class _Planner:
    """Chooses the line spans to hide: runs of cold sibling statements that each start their own line."""

    def __init__(self, lines: Lines, hot: bytearray, dim: bytearray | None) -> None:
        self.lines, self.hot, self.dim = lines, hot, dim
        self.spans: list[tuple[int, int]] = []  # (first line index, line count), ascending

    def is_hot(self, first: int, last: int) -> bool:
        """Whether 1-based lines first..last hold a trigger (a digit word counts only next to a digit)."""
        if any(self.hot[first - 1:last]):
            return True
        if self.dim is None or not any(self.dim[first - 1:last]):
            return False
        return any(_DIGIT.search(ln) for ln in self.lines[first - 1:last])

    def starts_line(self, stmt: ast.stmt) -> bool:
        """True when the statement's first line begins (after indentation) with the statement itself."""
        first = _first_line(stmt)
        text = self.lines[first - 1]
        lead = len(text) - len(text.lstrip(" \t\f"))
        if first != stmt.lineno:
            return text[lead:lead + 1] == "@"
        return lead == stmt.col_offset and text[:lead].isascii()

    def block(self, body: list[ast.stmt]) -> None:
        """Plan one statement list: statements sharing a line (`a = 1; b = 2`) go together."""
        run: tuple[int, int] | None = None  # the open span of cold siblings (1-based first, last line)
        for unit in _units(body):
            first, last = _first_line(unit[0]), unit[-1].end_lineno
            if not self.is_hot(first, last) and self.starts_line(unit[0]):
                run = (run[0], last) if run is not None else (first, last)
            else:
                self._close(run)
                run = None
                if self.is_hot(first, last):
                    for stmt in unit:
                        self.children(stmt)
        self._close(run)

    def _close(self, run: tuple[int, int] | None) -> None:
        if run is not None:
            self.spans.append((run[0] - 1, run[1] - run[0] + 1))

    def children(self, stmt: ast.stmt) -> None:
        """Plan the statement lists inside a hot compound statement (an `elif` is walked, never hidden)."""
        for field in _BODIES:
            block = getattr(stmt, field, None)
            if not block or not isinstance(block, list):
                continue
            if field == "orelse" and isinstance(stmt, ast.If) and len(block) == 1 and isinstance(block[0], ast.If):
                inner = block[0]
                text = self.lines[inner.lineno - 1]
                if text[inner.col_offset:inner.col_offset + 4] == "elif" or not text.lstrip().startswith("if"):
                    self.children(inner)
                    continue
            self.block(block)
        for handler in getattr(stmt, "handlers", ()):
            self.block(handler.body)
        for case in getattr(stmt, "cases", ()):
            self.block(case.body)

"""Unified diffs whose cost grows about linearly with the file (difflib alone is quadratic on big files).

difflib.SequenceMatcher splits the files at the longest common block and recurses; when the changes are
spread evenly through a big file (a generated module with a `.cuda()` every few lines) each split is
lopsided and the work grows with the square of the line count (500 KB: 14 s of 23). Here the lines that
occur exactly once in each file, in an order both files share (patience diff's anchors: a longest
increasing subsequence, O(n log n)), cut the files into small gaps first, and only the gaps go through
difflib. The hunks are printed in the usual `--- a/` `+++ b/` `@@` format.

Memory follows the output, not a multiple of the files: each distinct line is one string wherever it occurs in
either file, the matching blocks are kept in arrays, the opcodes and hunks are made one at a
time (difflib's `get_opcodes()` and `get_grouped_opcodes()` build lists of tuples as long as the file), and the
text is joined once from the lines themselves (diff_pieces).
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator
from difflib import SequenceMatcher
from itertools import chain

# The lines of a text are split this many characters (then to the end of a line) at a time.
_SPLIT_BLOCK = 1 << 16

Opcode = tuple[int, int, int, int, int]


def split_lines(text: str) -> Iterator[str]:
    """The lines of `text.splitlines(keepends=True)`, one at a time (never a list of every line)."""
    start, n = 0, len(text)
    while start < n:
        end = text.find("\n", start + _SPLIT_BLOCK)  # every line break ends at a "\n" or is not one
        end = n if end < 0 else end + 1
        yield from text[start:end].splitlines(keepends=True)
        start = end


def _read(old: str, new: str) -> tuple[list[str], list[str], dict[str, str], set[str]]:
    """The lines of `old` and of `new`, each distinct line one string shared by every place it occurs in either
    file (a big generated file repeats most of its lines, a port changes few); also the old file's lines (each
    line -> itself) and those of them that occur more than once there."""
    in_a: dict[str, str] = {}
    repeated: set[str] = set()
    a: list[str] = []
    for line in split_lines(old):
        c = in_a.get(line)
        if c is None:
            in_a[line] = c = line
        else:
            repeated.add(c)
        a.append(c)
    only_b: dict[str, str] = {}
    b: list[str] = []
    for line in split_lines(new):
        c = in_a.get(line)
        b.append(c if c is not None else only_b.setdefault(line, line))
    return a, b, in_a, repeated


def _anchors(a: list[str], b: list[str], in_a: dict[str, str], repeated: set[str]) -> tuple[array, array]:
    """(i, j) pairs of lines unique in both files, forming the longest chain increasing in both i and j (as the
    array of its i and the array of its j: a big file's pairs as tuples would cost more than its lines).
    `in_a`, `repeated`: the lines of `a`, those of them that occur more than once (_read)."""
    in_b: dict[str, int] = {}  # the lines of b unique in a -> their index in b; -1 where more than once in b
    for j, line in enumerate(b):
        if line in in_a and line not in repeated:
            in_b[line] = -1 if line in in_b else j
    pi, pj = array("q"), array("q")
    for i, line in enumerate(a):
        j = in_b.get(line, -1)
        if j >= 0:
            pi.append(i)
            pj.append(j)
    del in_b
    tails = array("q")  # tails[k]: j of the smallest tail of an increasing chain of length k + 1
    tail_at = array("q")  # index in the pairs of that tail
    back = array("q", bytes(8 * len(pj)))
    for n, j in enumerate(pj):
        k = bisect.bisect_left(tails, j)
        back[n] = tail_at[k - 1] if k else -1
        if k == len(tails):
            tails.append(j)
            tail_at.append(n)
        else:
            tails[k], tail_at[k] = j, n
    chain = array("q")
    n = tail_at[-1] if tail_at else -1
    while n >= 0:
        chain.append(n)
        n = back[n]
    chain.reverse()
    return array("q", (pi[n] for n in chain)), array("q", (pj[n] for n in chain))


def _blocks(a: list[str], b: list[str], in_a: dict[str, str], repeated: set[str]) -> tuple[array, array, array]:
    """The matching blocks of `a` and `b` as three arrays (i, j, size), without difflib's final sentinel
    (`in_a`, `repeated`: as _anchors takes them)."""
    bi, bj, bn = array("q"), array("q"), array("q")

    def add(i: int, j: int, n: int) -> None:
        if bn and bi[-1] + bn[-1] == i and bj[-1] + bn[-1] == j:
            bn[-1] += n
        elif n:
            bi.append(i)
            bj.append(j)
            bn.append(n)

    i0 = j0 = 0
    ci, cj = _anchors(a, b, in_a, repeated)
    ci.append(len(a))
    cj.append(len(b))
    for i, j in zip(ci, cj, strict=True):
        if i > i0 and j > j0:
            for mi, mj, n in SequenceMatcher(None, a[i0:i], b[j0:j], autojunk=False).get_matching_blocks():
                add(i0 + mi, j0 + mj, n)
        if i < len(a):
            add(i, j, 1)
        i0, j0 = i + 1, j + 1
    return bi, bj, bn


# The opcodes' tags (difflib's strings) as numbers.
EQUAL, REPLACE, DELETE, INSERT = range(4)


def _opcodes(bi: array, bj: array, bn: array, len_a: int, len_b: int) -> Iterator[Opcode]:
    """difflib's get_opcodes() of these matching blocks, one at a time (the tag as a number)."""
    i = j = 0
    for ai, bj_, size in zip(chain(bi, (len_a,)), chain(bj, (len_b,)), chain(bn, (0,)), strict=True):
        if i < ai and j < bj_:
            yield REPLACE, i, ai, j, bj_
        elif i < ai:
            yield DELETE, i, ai, j, bj_
        elif j < bj_:
            yield INSERT, i, ai, j, bj_
        i, j = ai + size, bj_ + size
        if size:
            yield EQUAL, ai, i, bj_, j


def _hunks(codes: Iterator[Opcode], n: int) -> Iterator[array]:
    """difflib's get_grouped_opcodes(n) of these opcodes, taken one at a time: hunks with up to `n` lines of
    context, the file's first and last unchanged runs cut to `n` lines. Each hunk is an array of its opcodes'
    five numbers one after another (a big file changed every few lines is one hunk: tuples would cost 4x)."""
    nn = n + n
    group = array("q")
    first = True
    code = next(codes, None)
    if code is None:
        code = (EQUAL, 0, 1, 0, 1)
    while code is not None:
        tag, i1, i2, j1, j2 = code
        code = next(codes, None)
        if tag == EQUAL:
            if first:
                i1, j1 = max(i1, i2 - n), max(j1, j2 - n)
            if code is None:
                i2, j2 = min(i2, i1 + n), min(j2, j1 + n)
            elif i2 - i1 > nn:
                group.extend((tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)))
                yield group
                group = array("q")
                i1, j1 = max(i1, i2 - n), max(j1, j2 - n)
        first = False
        group.extend((tag, i1, i2, j1, j2))
    if group and not (len(group) == 5 and group[0] == EQUAL):
        yield group


def _range(start: int, stop: int) -> str:
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


def unified_diff(old: str, new: str, display: str, context: int = 3) -> str:
    """A git-style unified diff (a/ and b/ prefixes); marks a missing final newline like diff(1)."""
    a, b, in_a, repeated = _read(old, new)
    bi, bj, bn = _blocks(a, b, in_a, repeated)
    del in_a, repeated
    return "".join(diff_pieces(a, b, _hunks(_opcodes(bi, bj, bn, len(a), len(b)), context), display))


# A line without a final newline is followed by this (as diff(1) marks it).
NO_NEWLINE = "\n\\ No newline at end of file\n"


def diff_pieces(a: list[str], b: list[str], hunks: Iterator[array], display: str) -> list[str]:
    """The diff's text as a list of pieces to join: the lines of `a` and `b` themselves (never a new string per
    line: joined once, the list costs 8 bytes a piece, about a third of a diff's text, where a copy of each line,
    or blocks of them, would cost the text again), each after its one-character prefix, and the headers."""
    name = display.lstrip("/")
    out: list[str] = []
    for group in hunks:
        if not out:
            out.append(f"--- a/{name}\n+++ b/{name}\n")
        out.append(f"@@ -{_range(group[1], group[-3])} +{_range(group[3], group[-1])} @@\n")
        for k in range(0, len(group), 5):
            tag, i1, i2, j1, j2 = group[k:k + 5]
            if tag == EQUAL:
                _add(out, " ", a, i1, i2)
                continue
            _add(out, "-", a, i1, i2)
            _add(out, "+", b, j1, j2)
    return out


def _add(out: list[str], prefix: str, lines: list[str], start: int, stop: int) -> None:
    """lines[start:stop] each after `prefix`, a missing final newline marked as diff(1) does."""
    for k in range(start, stop):
        line = lines[k]
        out.append(prefix)
        out.append(line)
        if not line.endswith("\n"):
            out.append(NO_NEWLINE)

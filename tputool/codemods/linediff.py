"""Unified diffs whose cost grows about linearly with the file (difflib alone is quadratic on big files).

difflib.SequenceMatcher splits the files at the longest common block and recurses; when the changes are
spread evenly through a big file (a generated module with a `.cuda()` every few lines) each split is
lopsided and the work grows with the square of the line count (500 KB: 14 s of 23). Here the lines that
occur exactly once in each file, in an order both files share (patience diff's anchors: a longest
increasing subsequence, O(n log n)), cut the files into small gaps first, and only the gaps go through
difflib. The hunks are printed in the usual `--- a/` `+++ b/` `@@` format.
"""

from __future__ import annotations

import bisect
from array import array
from difflib import Match, SequenceMatcher


def _anchors(a: list[str], b: list[str]) -> tuple[array, array]:
    """(i, j) pairs of lines unique in both files, forming the longest chain increasing in both i and j (as the
    array of its i and the array of its j: a big file's pairs as tuples would cost more than its lines)."""
    in_a: dict[str, int] = {}  # line -> its index in a; -1 where it occurs more than once
    for i, line in enumerate(a):
        in_a[line] = -1 if line in in_a else i
    in_b: dict[str, int] = {}  # the same in b, for the lines unique in a
    for j, line in enumerate(b):
        if in_a.get(line, -1) >= 0:
            in_b[line] = -1 if line in in_b else j
    del in_a
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


def matching_blocks(a: list[str], b: list[str]) -> list[Match]:
    """difflib-style matching blocks of `a` and `b` (ending with the (len a, len b, 0) sentinel)."""
    blocks: list[list[int]] = []

    def add(i: int, j: int, n: int) -> None:
        if blocks and blocks[-1][0] + blocks[-1][2] == i and blocks[-1][1] + blocks[-1][2] == j:
            blocks[-1][2] += n
        elif n:
            blocks.append([i, j, n])

    i0 = j0 = 0
    ci, cj = _anchors(a, b)
    ci.append(len(a))
    cj.append(len(b))
    for i, j in zip(ci, cj, strict=True):
        if i > i0 and j > j0:
            for bi, bj, n in SequenceMatcher(None, a[i0:i], b[j0:j], autojunk=False).get_matching_blocks():
                add(i0 + bi, j0 + bj, n)
        if i < len(a):
            add(i, j, 1)
        i0, j0 = i + 1, j + 1
    return [Match(*blk) for blk in blocks] + [Match(len(a), len(b), 0)]


def _range(start: int, stop: int) -> str:
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


def unified_diff(old: str, new: str, display: str, context: int = 3) -> str:
    """A git-style unified diff (a/ and b/ prefixes); marks a missing final newline like diff(1)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    sm = SequenceMatcher(None, (), ())
    sm.a, sm.b = a, b
    sm.matching_blocks, sm.opcodes = matching_blocks(a, b), None
    name = display.lstrip("/")
    chunks: list[str] = []  # a string per run of lines (a list of every line of a big diff costs 3x the diff)
    for group in sm.get_grouped_opcodes(context):
        if not chunks:
            chunks += [f"--- a/{name}\n", f"+++ b/{name}\n"]
        first, last = group[0], group[-1]
        chunks.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                chunks.append(_lines(" ", a, i1, i2))
                continue
            chunks.append(_lines("-", a, i1, i2))
            chunks.append(_lines("+", b, j1, j2))
    return "".join(chunks)


def _lines(prefix: str, lines: list[str], start: int, stop: int) -> str:
    """lines[start:stop] each after `prefix`, a missing final newline marked as diff(1) does."""
    return "".join(prefix + line if line.endswith("\n") else prefix + line + "\n\\ No newline at end of file\n"
                   for line in lines[start:stop])
